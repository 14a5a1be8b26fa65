//! `tcloud secret set|ls|rm`: the caller's own secrets. A value is read from stdin (or typed
//! without echo), never taken as an argument where `ps` and shell history would keep it,
//! and never printed: the server does not send values back.

use anyhow::Result;

use super::Ctx;
use super::auth::read_hidden_or_stdin;
use crate::errors::CliError;
use crate::format::{ago, now, out, out_json, print_table, table};
use crate::sanitize;

/// Names a task can list in `environment.secrets`: a secret reaches the task as the
/// environment variable of that name, so upper-case letters, digits and `_`, not starting
/// with a digit, at most 128 characters (the server checks the same, and refuses names the
/// platform sets itself, such as `TACC_…`). Checked here too so that a name is never a
/// malformed URL path.
pub fn check_name(name: &str) -> Result<(), CliError> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 128;
    if ok {
        Ok(())
    } else {
        Err(CliError::invalid(format!(
            "`{}` is not a valid secret name: it becomes an environment variable, so use upper-case letters, digits and `_`, not starting with a digit (e.g. WANDB_API_KEY)",
            sanitize::field(name)
        )))
    }
}

/// The value as given: one trailing newline (`\n` or `\r\n`, as `echo` adds) removed;
/// empty is refused.
pub fn value_from_input(mut value: Vec<u8>, name: &str) -> Result<Vec<u8>, CliError> {
    if value.last() == Some(&b'\n') {
        value.pop();
        if value.last() == Some(&b'\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        return Err(CliError::invalid(format!(
            "the value of secret {name} is empty; pipe it on stdin, e.g. `printf %s \"$VALUE\" | tcloud secret set {name}`"
        )));
    }
    Ok(value)
}

pub async fn set(ctx: &Ctx, name: &str) -> Result<()> {
    check_name(name)?;
    let client = ctx.client()?;
    let input = read_hidden_or_stdin(
        format!("Value of secret {name} (not shown): "),
        false,
        "secret value",
    )
    .await?;
    let value = value_from_input(input, name)?;
    let size = value.len();
    client.put_secret(name, value).await?;
    out(format!("Stored secret {name} ({size} bytes)"))?;
    eprintln!(
        "  a task gets it as ${name} with `environment: {{secrets: [{name}]}}` in its task file"
    );
    Ok(())
}

pub async fn ls(ctx: &Ctx, as_json: bool) -> Result<()> {
    let secrets = ctx.client()?.list_secrets().await?;
    if as_json {
        return out_json(&secrets);
    }
    if secrets.is_empty() {
        out("no secrets; store one with `tcloud secret set NAME` (the value is read from stdin)")?;
        return Ok(());
    }
    let now = now();
    let mut t = table(["NAME", "UPDATED"]);
    for secret in &secrets {
        t.add_row([sanitize::field(&secret.name), ago(secret.updated_at, now)]);
    }
    print_table(&t)?;
    Ok(())
}

pub async fn rm(ctx: &Ctx, name: &str) -> Result<()> {
    check_name(name)?;
    ctx.client()?.delete_secret(name).await?;
    out(format!("Removed secret {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["HF_TOKEN", "WANDB_API_KEY", "_X", "X1"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "hf_token",
            "A/B",
            "../X",
            "1X",
            "A-B",
            "A B",
            "A?B",
            &"X".repeat(129),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_trailing_newline_is_stripped_and_empty_is_refused() {
        assert_eq!(value_from_input(b"abc\n".to_vec(), "X").unwrap(), b"abc");
        assert_eq!(value_from_input(b"abc\r\n".to_vec(), "X").unwrap(), b"abc");
        assert_eq!(
            value_from_input(b"abc\n\n".to_vec(), "X").unwrap(),
            b"abc\n"
        );
        assert_eq!(value_from_input(b" abc ".to_vec(), "X").unwrap(), b" abc ");
        assert!(value_from_input(b"\n".to_vec(), "X").is_err());
        assert!(value_from_input(Vec::new(), "X").is_err());
    }
}
