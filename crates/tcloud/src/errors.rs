//! Exit codes and the rendering of errors on stderr.
//!
//! Commands return `anyhow::Error`; `main` turns it into one message and an exit code here.
//! A [`CliError`] carries its own code; a `tacc_client::ClientError` anywhere in the chain
//! decides the code by its kind; anything else is a plain failure (1).

use std::fmt;

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
        "not_found" => NOT_FOUND,
        "invalid_task" | "unsupported" | "bad_request" => INVALID,
        _ => FAILURE,
    }
}

/// What `main` prints (None: nothing) and the exit code it exits with.
pub fn render(error: &anyhow::Error) -> (Option<String>, u8) {
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
                ClientError::Unreachable { url, reason } => {
                    (Some(unreachable_message(url, reason)), UNREACHABLE)
                }
                ClientError::Api { code, .. } => {
                    (Some(format!("error: {error:#}")), code_for_api(code))
                }
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
}
