//! `tcloud completion bash|zsh|fish` and `tcloud man DIR`: the shell completion scripts
//! and the man pages, both generated from the one clap grammar in [`crate::cli`], so they
//! can never list a command or option `tcloud` does not take.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, CompletionShell};
use crate::format::out;

/// The completion script of `shell` on stdout.
pub fn completion(shell: CompletionShell) -> Result<()> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    match shell {
        CompletionShell::Bash => clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut command,
            "tcloud",
            &mut script,
        ),
        CompletionShell::Zsh => clap_complete::generate(
            clap_complete::Shell::Zsh,
            &mut command,
            "tcloud",
            &mut script,
        ),
        CompletionShell::Fish => clap_complete::generate(
            clap_complete::Shell::Fish,
            &mut command,
            "tcloud",
            &mut script,
        ),
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(())
}

/// One page per command at every depth into `dir`: `tcloud.1`, `tcloud-submit.1`,
/// `tcloud-admin-user-add.1`, …; prints what it wrote.
pub fn man(dir: &Path) -> Result<()> {
    let written = write_man_pages(dir)?;
    out(format!(
        "wrote {} man pages to {} (read one with `man -l {}`)",
        written.len(),
        dir.display(),
        dir.join("tcloud-submit.1").display()
    ))?;
    Ok(())
}

/// The pages' files, in the order written.
pub fn write_man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the directory {}", dir.display()))?;
    // Built, every subcommand has its full name (`tcloud-admin-user-add`, the page's file
    // and title) and its usage line (`tcloud admin user add`); `help` gets no page.
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write_pages(command, dir, &mut written)?;
    Ok(written)
}

fn write_pages(command: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    // Every page names the program and version it documents (a subcommand has none of
    // its own, and clap_mangen would show its bare name there).
    let page = clap_mangen::Man::new(command.clone())
        .source(format!("tcloud {}", env!("CARGO_PKG_VERSION")))
        .manual("TACC Manual");
    let path = page
        .generate_to(dir)
        .with_context(|| format!("cannot write {}", dir.join(page.get_filename()).display()))?;
    written.push(path);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_a_page_named_after_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_man_pages(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "tcloud.1",
            "tcloud-submit.1",
            "tcloud-admin-user-add.1",
            "tcloud-completion.1",
            "tcloud-man.1",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        let submit = std::fs::read_to_string(dir.path().join("tcloud-submit.1")).unwrap();
        assert!(
            submit.contains(".TH tcloud-submit 1") && submit.contains("tcloud 0."),
            "{submit}"
        );
        assert!(submit.contains("\\-\\-follow"), "{submit}");
    }
}
