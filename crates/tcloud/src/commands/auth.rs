//! `tcloud login`, `tcloud whoami` and `tcloud logout`: the API token of a profile.

use std::io::{IsTerminal, Read};

use anyhow::{Context, Result};
use serde_json::json;
use tacc_client::ClientError;

use super::{Ctx, client_for, profile_for_url};
use crate::config::{self, Config, TOKEN_ENV};
use crate::errors::{CliError, INVALID, UNAUTHENTICATED, UNREACHABLE, unreachable_message};
use crate::format::{out, out_json};
use crate::sanitize;

/// More than any token or secret; stdin beyond this is refused, not buffered.
pub const MAX_STDIN: u64 = 1 << 20;

/// Reads what was piped to stdin, at most [`MAX_STDIN`] bytes.
pub fn read_stdin_bytes(what: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_STDIN + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read the {what} from stdin"))?;
    if bytes.len() as u64 > MAX_STDIN {
        return Err(CliError::invalid(format!(
            "the {what} on stdin is larger than {} bytes",
            MAX_STDIN
        ))
        .into());
    }
    Ok(bytes)
}

/// Asks on the terminal without echo when stdin is one (and `from_stdin` was not given),
/// else reads stdin.
pub async fn read_hidden_or_stdin(prompt: String, from_stdin: bool, what: &str) -> Result<Vec<u8>> {
    let what = what.to_string();
    tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
        if !from_stdin && std::io::stdin().is_terminal() {
            let text = rpassword::prompt_password(prompt)
                .with_context(|| format!("cannot read the {what} from the terminal"))?;
            return Ok(text.into_bytes());
        }
        read_stdin_bytes(&what)
    })
    .await
    .context("the stdin reader failed")?
}

/// A token as given: trimmed, one word of printable ASCII (it becomes an HTTP header).
pub fn parse_token(input: &[u8]) -> Result<String, CliError> {
    let text = std::str::from_utf8(input)
        .map_err(|_| CliError::invalid("the token is not text; a token looks like `tacc_…`"))?
        .trim();
    if text.is_empty() {
        return Err(CliError::invalid(
            "no token given: paste it at the prompt, or pipe it with `--token-stdin`",
        ));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CliError::invalid(
            "a token is one word of printable characters (it looks like `tacc_…`); check what was pasted",
        ));
    }
    Ok(text.to_string())
}

/// Which profile `login`/`logout` act on, and its URL.
fn login_target(config: &Config, ctx: &Ctx, profile: Option<String>) -> Result<(String, String)> {
    match (profile, &ctx.server) {
        (Some(name), Some(url)) => Ok((name, url.clone())),
        (Some(name), None) => {
            let url = match config.file.clusters.get(&name) {
                Some(cluster) => cluster.url.clone(),
                None if name == config::DEFAULT_PROFILE => config::default_url(),
                None => {
                    return Err(CliError::invalid(format!(
                        "there is no profile `{name}` in {}; add it with `tcloud config add {name} URL`, or give its URL with `tcloud --server URL login --profile {name}`",
                        config.path.display()
                    ))
                    .into());
                }
            };
            Ok((name, url))
        }
        (None, Some(url)) => match profile_for_url(config, url) {
            Some((name, _)) => Ok((name, url.clone())),
            None => Err(CliError::invalid(format!(
                "no profile points at {url}; name one to create with `--profile NAME`"
            ))
            .into()),
        },
        (None, None) => {
            let cluster = config.current()?;
            Ok((config.current_name().to_string(), cluster.url))
        }
    }
}

/// `tcloud login [--token-stdin] [--profile NAME]`.
pub async fn login(ctx: &Ctx, token_stdin: bool, profile: Option<String>) -> Result<()> {
    let mut config = Config::load()?;
    let (name, url) = login_target(&config, ctx, profile)?;
    let input =
        read_hidden_or_stdin(format!("API token for {url}: "), token_stdin, "token").await?;
    let token = parse_token(&input)?;

    let fingerprint = config
        .file
        .clusters
        .get(&name)
        .and_then(|c| c.fingerprint.clone());
    let client = super::pinned_client(&url, fingerprint.as_deref())?;
    let me = match client.with_token(token.clone()).whoami().await {
        Ok(me) => me,
        Err(ClientError::Api {
            status: 401,
            message,
            ..
        }) => {
            return Err(CliError::new(
                UNAUTHENTICATED,
                format!(
                    "{url} refused this token ({message}): it is unknown, expired or revoked; nothing was stored"
                ),
            )
            .into());
        }
        Err(ClientError::Api { status: 404, .. }) => {
            return Err(CliError::new(
                INVALID,
                format!(
                    "the server at {url} has no `/v1/whoami`: it predates API tokens (upgrade taccd); nothing was stored"
                ),
            )
            .into());
        }
        Err(ClientError::Unreachable { url, reason, .. }) => {
            return Err(CliError {
                code: UNREACHABLE,
                message: format!(
                    "{} The token could not be checked; nothing was stored.",
                    unreachable_message(&url, &reason)
                ),
                raw: true,
            }
            .into());
        }
        Err(e) => {
            return Err(
                anyhow::Error::from(e).context("cannot check the token; nothing was stored")
            );
        }
    };

    let known_url = config.file.clusters.get(&name).map(|c| c.url.clone());
    if known_url.as_deref().map(|u| u.trim_end_matches('/')) != Some(url.trim_end_matches('/')) {
        config.set_cluster(&name, &url)?;
    }
    config.set_token(&name, &url, &token)?;
    out(format!(
        "Logged in to {url} as {} ({})",
        sanitize::field(&me.name),
        me.role
    ))?;
    eprintln!(
        "  the token is stored in profile `{name}` of {} (mode 0600)",
        config.path.display()
    );
    if config.current_name() != name {
        eprintln!(
            "note: the current cluster is `{}`; switch with `tcloud config use {name}`",
            config.current_name()
        );
    }
    if config::env_token().is_some() {
        eprintln!(
            "note: {TOKEN_ENV} is set and overrides the stored token; unset it to use this one"
        );
    }
    Ok(())
}

/// `tcloud whoami [--json]`.
pub async fn whoami(ctx: &Ctx, as_json: bool) -> Result<()> {
    let target = ctx.target()?;
    let me = client_for(&target)?.whoami().await?;
    if as_json {
        return out_json(&json!({
            "name": me.name,
            "group": me.group,
            "role": me.role,
            "server": target.url,
            "profile": target.profile,
        }));
    }
    let group = me
        .group
        .as_deref()
        .map(|g| format!(", group {}", sanitize::field(g)))
        .unwrap_or_default();
    out(format!(
        "{} ({}{group}) on {}",
        sanitize::field(&me.name),
        me.role,
        target.url
    ))?;
    Ok(())
}

/// `tcloud logout [--profile NAME]`.
pub fn logout(ctx: &Ctx, profile: Option<String>) -> Result<()> {
    let mut config = Config::load()?;
    let (name, url) = login_target(&config, ctx, profile)?;
    if config.remove_token(&name)? {
        out(format!(
            "Logged out of `{name}` ({url}): removed its token from {}",
            config.path.display()
        ))?;
        eprintln!(
            "  the token itself stays valid until it expires or an administrator revokes it (`tcloud admin token revoke ID`)"
        );
    } else {
        out(format!("profile `{name}` ({url}) has no stored token"))?;
    }
    if config::env_token().is_some() {
        eprintln!("note: {TOKEN_ENV} is set: commands still send that token");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_must_be_one_printable_word() {
        assert_eq!(parse_token(b"  tacc_abc-_DEF\n").unwrap(), "tacc_abc-_DEF");
        assert_eq!(parse_token(b"\n").unwrap_err().code, INVALID);
        assert!(parse_token(b"tacc_a b").is_err());
        assert!(parse_token(b"tacc_a\r\nX-Evil: 1").is_err());
        assert!(parse_token(b"tacc_\xff").is_err());
        assert!(parse_token("tacc_é".as_bytes()).is_err());
    }
}
