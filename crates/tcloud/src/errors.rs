//! Exit codes and the rendering of errors on stderr.
//!
//! Commands return `anyhow::Error`; `main` turns it into one message and an exit code here.
//! A [`CliError`] carries its own code; a `tacc_client::ClientError` anywhere in the chain
//! decides the code by its kind; anything else is a plain failure (1).
//!
//! A 401 from the server becomes exit 6 with what to do (`tcloud login`, or `tcloud up` for
//! the local cluster), a 403 exit 7 (`not allowed: …`). What the advice says depends on
//! where the token came from, which the command records with [`set_auth_context`].

use std::fmt;
use std::sync::OnceLock;

use tacc_client::ClientError;
use tacc_schema::SchemaError;

pub const OK: u8 = 0;
/// Any failure not listed below.
pub const FAILURE: u8 = 1;
/// Invalid input: a bad task file, bad arguments (clap uses 2 as well).
pub const INVALID: u8 = 2;
/// The server could not be reached.
pub const UNREACHABLE: u8 = 3;
/// Something named does not exist (an unknown task id).
pub const NOT_FOUND: u8 = 4;
/// The task ran but did not succeed (`submit -f`, `logs -f`).
pub const TASK_FAILED: u8 = 5;
/// The server wants a valid token (HTTP 401): not logged in, or the token expired or
/// was revoked.
pub const UNAUTHENTICATED: u8 = 6;
/// The server knows who you are, and this is not yours to do (HTTP 403).
pub const FORBIDDEN: u8 = 7;
/// The server failed, not the request: its disk is full, its database unavailable, an
/// internal error (HTTP 5xx). Retrying later may succeed.
pub const SERVER_FAULT: u8 = 8;
/// `tcloud down` stopped nothing: the local cluster has tasks queued or running (stop it
/// with `--drain` or `--force`).
pub const CLUSTER_BUSY: u8 = 9;

/// Where the token of a request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The `TACC_TOKEN` environment variable.
    Env,
    /// The named profile of the configuration file.
    Profile(String),
    /// No token was sent.
    None,
}

/// What the advice for a refused token needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthContext {
    pub url: String,
    /// The profile the URL belongs to, if any.
    pub profile: Option<String>,
    pub source: TokenSource,
}

static AUTH_CONTEXT: OnceLock<AuthContext> = OnceLock::new();

/// Records where this process's requests go and with which token (the first call wins).
pub fn set_auth_context(context: AuthContext) {
    let _ = AUTH_CONTEXT.set(context);
}

/// The advice for a 401, given where the token came from.
pub fn unauthenticated_message(context: Option<&AuthContext>, server_said: &str) -> String {
    let Some(context) = context else {
        return format!(
            "error: the server wants a valid token ({server_said}). Log in with `tcloud login`, or run `tcloud up` for the local cluster."
        );
    };
    let url = &context.url;
    let is_local = context.profile.as_deref() == Some(crate::config::DEFAULT_PROFILE);
    let profile_flag = match &context.profile {
        Some(name) if name != crate::config::DEFAULT_PROFILE => format!(" --profile {name}"),
        _ => String::new(),
    };
    let login = if is_local {
        "run `tcloud up` (it logs you in to the local cluster), or `tcloud login` with a token you were given".to_string()
    } else {
        format!(
            "log in with `tcloud login{profile_flag}` and the token your administrator gave you"
        )
    };
    match &context.source {
        TokenSource::Env => format!(
            "error: {url} refused the token in {} ({server_said}); set a valid one, or unset it to use the profile's",
            crate::config::TOKEN_ENV
        ),
        TokenSource::Profile(name) => format!(
            "error: {url} refused the token of profile `{name}` ({server_said}): it may have expired or been revoked; {login}"
        ),
        TokenSource::None => format!("error: not logged in to {url}; {login}"),
    }
}

/// An error that knows its exit code. An empty message prints nothing (the command has
/// already said what happened).
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
    /// Print `message` as is, without the `error: ` prefix (rendered diagnostics).
    pub raw: bool,
}

impl CliError {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
            raw: false,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        CliError::new(INVALID, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        CliError::new(NOT_FOUND, message)
    }
    /// Exit with `code` and print nothing more.
    pub fn silent(code: u8) -> Self {
        CliError::new(code, "")
    }
    /// A task file error: its diagnostic already reads like a compiler error.
    pub fn schema(error: &SchemaError) -> Self {
        CliError {
            code: INVALID,
            message: error.to_string(),
            raw: true,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// The one-line text for an unreachable server.
pub fn unreachable_message(url: &str, reason: &str) -> String {
    format!(
        "error: cannot reach the TACC server at {url} ({reason}). Start a local cluster with `tcloud up`, or pick another with `tcloud config use NAME`."
    )
}

/// The exit code for an API error code sent by the server.
pub fn code_for_api(code: &str) -> u8 {
    match code {
        "unauthorized" | "unauthenticated" => UNAUTHENTICATED,
        "forbidden" => FORBIDDEN,
        "not_found" => NOT_FOUND,
        "invalid_task" | "unsupported" | "bad_request" => INVALID,
        "storage_full" | "unavailable" | "internal" => SERVER_FAULT,
        _ => FAILURE,
    }
}

/// What `main` prints (None: nothing) and the exit code it exits with. The text is safe
/// for a terminal: server messages may quote what other users wrote.
pub fn render(error: &anyhow::Error) -> (Option<String>, u8) {
    let (text, code) = render_with(error, AUTH_CONTEXT.get());
    (text.map(|t| crate::sanitize::text(&t).into_owned()), code)
}

/// [`render`] with an explicit [`AuthContext`] (the one recorded, in `main`).
pub fn render_with(error: &anyhow::Error, auth: Option<&AuthContext>) -> (Option<String>, u8) {
    for cause in error.chain() {
        if let Some(cli) = cause.downcast_ref::<CliError>() {
            let text = if cli.message.is_empty() {
                None
            } else if cli.raw {
                Some(cli.message.clone())
            } else {
                Some(format!("error: {}", cli.message))
            };
            return (text, cli.code);
        }
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            return match client {
                ClientError::Unreachable { url, reason, .. } => {
                    (Some(unreachable_message(url, reason)), UNREACHABLE)
                }
                ClientError::Api {
                    status: 401,
                    message,
                    ..
                } => (
                    Some(unauthenticated_message(auth, message)),
                    UNAUTHENTICATED,
                ),
                // The server's message is a whole sentence that already names its kind
                // (`not allowed: …`, as ServerError says it to every client): it is shown
                // once, as it came, never behind a second copy of the same words.
                ClientError::Api { status: 403, .. } => {
                    (Some(format!("error: {error:#}")), FORBIDDEN)
                }
                ClientError::Api { code, .. } => {
                    (Some(format!("error: {error:#}")), code_for_api(code))
                }
                ClientError::TimedOut { .. } => (Some(format!("error: {client}")), UNREACHABLE),
                ClientError::Protocol { .. } => (Some(format!("error: {error:#}")), FAILURE),
                ClientError::Tls { .. } => (Some(format!("error: {client}")), UNREACHABLE),
            };
        }
        if let Some(schema) = cause.downcast_ref::<SchemaError>() {
            return (Some(schema.to_string()), INVALID);
        }
        let broken_pipe = cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe);
        if broken_pipe {
            // `tcloud ps | head`: the reader went away; that is not our failure.
            return (None, OK);
        }
    }
    (Some(format!("error: {error:#}")), FAILURE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn unreachable_is_one_line_exit_3_even_under_context() {
        let err: anyhow::Error = ClientError::Unreachable {
            url: "http://127.0.0.1:8383".into(),
            reason: "connection refused or host unreachable".into(),
            refused: true,
        }
        .into();
        let err = err.context("listing tasks");
        let (text, code) = render(&err);
        let text = text.unwrap();
        assert_eq!(code, UNREACHABLE);
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with(
            "error: cannot reach the TACC server at http://127.0.0.1:8383 (connection refused or host unreachable). Start a local cluster with `tcloud up`"
        ));
        assert!(!text.contains("Caused by"));
    }

    #[test]
    fn no_answer_in_time_is_one_line_exit_3_naming_the_server() {
        let err: anyhow::Error = ClientError::TimedOut {
            url: "https://tacc.example:8383".into(),
            secs: 10,
            connecting: false,
        }
        .into();
        let (text, code) = render(&err.context("submitting"));
        let text = text.unwrap();
        assert_eq!(code, UNREACHABLE);
        assert_eq!(text.lines().count(), 1);
        assert!(
            text.starts_with(
                "error: no answer from https://tacc.example:8383 within 10 s; is taccd running"
            ),
            "{text}"
        );
    }

    #[test]
    fn server_faults_exit_8_never_invalid_input() {
        for (status, code) in [
            (507, "storage_full"),
            (503, "unavailable"),
            (500, "internal"),
        ] {
            let err: anyhow::Error = ClientError::Api {
                status,
                code: code.into(),
                message: "the server is out of disk space".into(),
            }
            .into();
            assert_eq!(render(&err).1, SERVER_FAULT, "{code}");
        }
    }

    #[test]
    fn api_errors_map_by_code() {
        let api = |code: &str| -> anyhow::Error {
            ClientError::Api {
                status: 404,
                code: code.into(),
                message: "task 9 does not exist".into(),
            }
            .into()
        };
        assert_eq!(
            render(&api("not_found")),
            (Some("error: task 9 does not exist".into()), NOT_FOUND)
        );
        assert_eq!(render(&api("invalid_task")).1, INVALID);
        assert_eq!(render(&api("unsupported")).1, INVALID);
        assert_eq!(render(&api("conflict")).1, FAILURE);
    }

    #[test]
    fn cli_errors_keep_their_code_and_silent_prints_nothing() {
        assert_eq!(
            render(&CliError::silent(TASK_FAILED).into()),
            (None, TASK_FAILED)
        );
        let err = anyhow::Error::from(CliError::invalid("bad")).context("while checking");
        assert_eq!(render(&err), (Some("error: bad".into()), INVALID));
        let plain: anyhow::Result<()> =
            Err(anyhow::anyhow!("disk full")).context("writing out.bin");
        assert_eq!(
            render(&plain.unwrap_err()),
            (Some("error: writing out.bin: disk full".into()), FAILURE)
        );
        let pipe = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(render(&pipe), (None, OK));
    }

    fn api(status: u16, code: &str, message: &str) -> anyhow::Error {
        ClientError::Api {
            status,
            code: code.into(),
            message: message.into(),
        }
        .into()
    }

    #[test]
    fn a_refused_token_says_how_to_log_in_and_exits_6() {
        let err = api(401, "unauthorized", "token expired").context("listing tasks");
        let local = AuthContext {
            url: "http://127.0.0.1:8383".into(),
            profile: Some("local".into()),
            source: TokenSource::None,
        };
        let (text, code) = render_with(&err, Some(&local));
        let text = text.unwrap();
        assert_eq!(code, UNAUTHENTICATED);
        assert!(
            text.contains("not logged in to http://127.0.0.1:8383"),
            "{text}"
        );
        assert!(
            text.contains("tcloud up") && text.contains("tcloud login"),
            "{text}"
        );

        let lab = AuthContext {
            url: "https://lab".into(),
            profile: Some("lab".into()),
            source: TokenSource::Profile("lab".into()),
        };
        let text = render_with(&err, Some(&lab)).0.unwrap();
        assert!(
            text.contains("refused the token of profile `lab` (token expired)")
                && text.contains("tcloud login --profile lab")
                && !text.contains("tcloud up"),
            "{text}"
        );
        let env = AuthContext {
            source: TokenSource::Env,
            ..lab
        };
        let text = render_with(&err, Some(&env)).0.unwrap();
        assert!(text.contains("TACC_TOKEN"), "{text}");
        let text = render_with(&err, None).0.unwrap();
        assert!(text.contains("tcloud login"), "{text}");
    }

    #[test]
    fn forbidden_is_not_allowed_and_exits_7() {
        let err = api(403, "forbidden", "not allowed: admin only");
        assert_eq!(
            render_with(&err, None),
            (Some("error: not allowed: admin only".into()), FORBIDDEN)
        );
        assert_eq!(code_for_api("forbidden"), FORBIDDEN);
    }

    #[test]
    fn server_messages_are_made_safe_for_the_terminal() {
        let err = api(404, "not_found", "task \x1b]0;owned\x07 does not exist");
        let (text, code) = render(&err);
        assert_eq!(code, NOT_FOUND);
        assert_eq!(text.unwrap(), "error: task ^[]0;owned^G does not exist");
    }
}
