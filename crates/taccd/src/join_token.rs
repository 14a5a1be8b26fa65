//! Where an agent's join token comes from: a file (`--token-file PATH`), standard input
//! (`--token-file -`) or the environment (`TACC_JOIN_TOKEN`) — never the command line,
//! which every process on the machine reads (`ps -eo args`, `/proc/PID/cmdline`), tasks
//! included. A process's environment is readable only by its own user and root, and tasks
//! run as other users with an environment of their own.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The environment variable an agent reads its join token from.
pub const JOIN_TOKEN_ENV: &str = "TACC_JOIN_TOKEN";
/// The name earlier versions read; still read, after [`JOIN_TOKEN_ENV`].
pub const OLD_JOIN_TOKEN_ENV: &str = "TACC_AGENT_TOKEN";
/// The longest join token read (they are ~50 bytes): a wrong file is not read whole.
const MAX_TOKEN_BYTES: u64 = 4096;

/// How to pass a join token, for every message that needs to say so.
pub const HOW_TO_PASS: &str = "pass it with `--token-file FILE` (a file only you can read), \
    `--token-file -` (on standard input) or the TACC_JOIN_TOKEN environment variable";

/// The refusal of `--token VALUE`: a token there is readable by every process on the host.
pub fn refuse_on_command_line() -> anyhow::Error {
    anyhow::anyhow!(
        "--token is refused: a join token on the command line can be read by every process \
         on this machine (`ps -eo args`), tasks included, and enrols a node that receives \
         users' tasks and secrets. Make a new token (`taccd admin agent-token`; this one may \
         have leaked) and {HOW_TO_PASS}"
    )
}

/// The join token from `--token-file` (a path, or `-` for standard input), else from the
/// environment; `None` when none is given.
pub fn read(token_file: Option<&Path>) -> Result<Option<String>> {
    let (text, origin) = match token_file {
        Some(path) if path == Path::new("-") => {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_TOKEN_BYTES)
                .read_to_string(&mut text)
                .context("cannot read the join token from standard input (--token-file -)")?;
            (text, "standard input".to_string())
        }
        Some(path) => (read_file(path)?, path.display().to_string()),
        None => match [JOIN_TOKEN_ENV, OLD_JOIN_TOKEN_ENV]
            .iter()
            .find_map(|name| std::env::var(name).ok().map(|v| (v, name.to_string())))
        {
            Some(found) => found,
            None => return Ok(None),
        },
    };
    let token = text.trim();
    if token.is_empty() {
        bail!("the join token from {origin} is empty: {HOW_TO_PASS}");
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!(
            "{origin} holds more than one join token (or other text): it must hold the token \
             `taccd admin agent-token` printed, alone"
        );
    }
    Ok(Some(token.to_string()))
}

fn read_file(path: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read the join token file {}", path.display()))?;
    let mode = file.metadata().map(|m| m.mode()).unwrap_or(0);
    if mode & 0o044 != 0 {
        tracing::warn!(
            "the join token file {} is readable by other users (mode {:o}): make it 0600",
            path.display(),
            mode & 0o777
        );
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_BYTES)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the join token file {}", path.display()))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_trimmed_and_an_empty_or_odd_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("join.token");
        std::fs::write(&path, "tacc_abc\n").unwrap();
        assert_eq!(read(Some(&path)).unwrap().as_deref(), Some("tacc_abc"));
        std::fs::write(&path, "\n").unwrap();
        let empty = read(Some(&path)).unwrap_err().to_string();
        assert!(
            empty.contains("is empty") && empty.contains("--token-file"),
            "{empty}"
        );
        std::fs::write(&path, "tacc_a tacc_b").unwrap();
        assert!(read(Some(&path)).is_err());
        let missing = read(Some(&dir.path().join("none"))).unwrap_err();
        assert!(format!("{missing:#}").contains("cannot read the join token file"));
    }

    #[test]
    fn the_refusal_of_the_command_line_says_how_to_pass_it() {
        let text = refuse_on_command_line().to_string();
        assert!(
            text.contains("--token-file") && text.contains("TACC_JOIN_TOKEN"),
            "{text}"
        );
    }
}
