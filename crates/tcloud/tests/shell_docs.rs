//! `tcloud completion` and `tcloud man` as a user's shell and man reader take them: the
//! bash script is sourced in a real `bash`, its completion function driven the way bash
//! drives it on <TAB>; every generated man page goes through a real `man -l` with
//! warnings on. Outside CI a missing `bash`/`man` says SKIPPED loudly; in CI (`CI=true`,
//! where scripts/test.sh installs man-db) it fails.

use std::path::Path;
use std::process::{Command, Output};

fn tcloud(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tcloud"))
        .args(args)
        .env(
            "TACC_HOME",
            std::env::temp_dir().join("tcloud-shell-docs-unused"),
        )
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `program` runs here; in CI its absence fails the test.
fn have(program: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: `{program}` is missing in CI (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED {test}: `{program}` is not installed here");
    }
    found
}

/// What the completion function of the sourced script offers for the words typed so far
/// (the last one being completed), one candidate a line.
fn bash_completions(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        r#"set -u
source '{script}'
spec=$(complete -p tcloud) || exit 3
fn=${{spec##*-F }}; fn=${{fn%% *}}
COMP_WORDS=({words})
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
prev=""; [ "$COMP_CWORD" -gt 0 ] && prev=${{COMP_WORDS[COMP_CWORD-1]}}
"$fn" tcloud "${{COMP_WORDS[COMP_CWORD]}}" "$prev"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        script = script.display(),
        words = quoted.join(" ")
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .unwrap();
    assert!(out.status.success(), "bash failed: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_commands_subcommands_and_options_from_the_grammar() {
    if !have(
        "bash",
        "bash_completes_commands_subcommands_and_options_from_the_grammar",
    ) {
        return;
    }
    let out = tcloud(&["completion", "bash"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("tcloud.bash");
    std::fs::write(&script, &out.stdout).unwrap();

    assert_eq!(bash_completions(&script, &["tcloud", "sub"]), ["submit"]);
    assert_eq!(
        bash_completions(&script, &["tcloud", "admin", "us"]),
        ["user"]
    );
    assert_eq!(
        bash_completions(&script, &["tcloud", "submit", "--fo"]),
        ["--follow"]
    );
    let shells = bash_completions(&script, &["tcloud", "completion", ""]);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.iter().any(|s| s == shell), "{shells:?}");
    }
}

#[test]
fn zsh_and_fish_scripts_name_every_command() {
    for (shell, marker) in [("zsh", "#compdef tcloud"), ("fish", "complete -c tcloud")] {
        let out = tcloud(&["completion", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for command in ["submit", "logs", "completion", "man"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
        // Where the shell is installed, the script must at least parse.
        let parses = Command::new(shell)
            .args(["-n", "-c", &script])
            .output()
            .map(|o| o.status.success());
        if let Ok(parses) = parses {
            assert!(parses, "{shell} cannot parse its completion script");
        }
    }
    let out = tcloud(&["completion", "powershell"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is invalid input"
    );
}

#[test]
fn every_man_page_renders_without_warnings() {
    if !have("man", "every_man_page_renders_without_warnings") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = tcloud(&["man", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for expected in [
        "tcloud.1",
        "tcloud-submit.1",
        "tcloud-admin-user-add.1",
        "tcloud-man.1",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(text(&out.stdout).contains(&format!("wrote {} man pages", names.len())));
    for name in &names {
        let rendered = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(pages.join(name))
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .unwrap();
        assert!(
            rendered.status.success(),
            "{name}: {}",
            text(&rendered.stderr)
        );
        assert!(
            rendered.stderr.is_empty(),
            "{name} renders with warnings: {}",
            text(&rendered.stderr)
        );
        let page = text(&rendered.stdout);
        assert!(
            page.contains("NAME") && page.contains("SYNOPSIS"),
            "{name}: {page}"
        );
    }
    let submit = Command::new("man")
        .args(["-l"])
        .arg(pages.join("tcloud-submit.1"))
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    let page = text(&submit.stdout);
    assert!(
        page.contains("tcloud-submit") && page.contains("--follow") && page.contains("Examples"),
        "{page}"
    );
}
