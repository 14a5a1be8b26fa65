//! Whether a task's script can run without a shell, as `make` decides for a recipe line: a
//! single line of plain words — letters, digits and `_ - . / , : = + @ %`, separated by
//! blanks — whose first word is neither a variable assignment nor a word the shell itself
//! gives a meaning to (a keyword or a builtin). Such a line means the same to `bash -c`
//! as to `execvp` of its words, and `bash -c` would only have `exec`ed it anyway; the
//! shell's start-up (the largest cost of a trivial task after the process itself) is
//! saved. Anything else — quotes, `$`, globs, redirections, `;`, `&&`, pipes, comments,
//! `~`, several lines, non-ASCII text — goes through `bash -c` unchanged.

/// Words `bash` runs itself, or runs differently from the program of the same name: a
/// line that starts with one goes through the shell. (`true` and `false` alone are the
/// same either way and run directly.)
const SHELL_WORDS: &[&str] = &[
    // keywords
    "!",
    "case",
    "coproc",
    "do",
    "done",
    "elif",
    "else",
    "esac",
    "fi",
    "for",
    "function",
    "if",
    "in",
    "select",
    "then",
    "time",
    "until",
    "while",
    "{",
    "}",
    "[[",
    "]]",
    // builtins
    ".",
    ":",
    "[",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "cd",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "declare",
    "dirs",
    "disown",
    "echo",
    "enable",
    "eval",
    "exec",
    "exit",
    "export",
    "fc",
    "fg",
    "getopts",
    "hash",
    "help",
    "history",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "printf",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "test",
    "times",
    "trap",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "wait",
];

/// The words to `exec` for `script` when it needs no shell; `None` when it goes through
/// `bash -c`.
pub(crate) fn direct_words(script: &str) -> Option<Vec<String>> {
    // A YAML block scalar ends with a newline; blanks around the line mean nothing.
    let line = script.trim_matches([' ', '\t', '\n']);
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./,:=+@% \t".contains(c);
    if line.is_empty() || !line.chars().all(plain) {
        return None;
    }
    let words: Vec<String> = line
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect();
    let first = words.first()?.as_str();
    let alone = words.len() == 1;
    if first.contains('=') || first.starts_with('%') {
        return None;
    }
    if SHELL_WORDS.contains(&first) || (matches!(first, "true" | "false") && !alone) {
        return None;
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_commands_run_directly_and_everything_else_through_bash() {
        for (script, direct) in [
            ("true", Some(vec!["true"])),
            ("true\n", Some(vec!["true"])),
            (
                "  python3 train.py --lr=0.1 --out=runs/a,b\n",
                Some(vec!["python3", "train.py", "--lr=0.1", "--out=runs/a,b"]),
            ),
            ("/usr/bin/env", Some(vec!["/usr/bin/env"])),
            ("sleep\t30", Some(vec!["sleep", "30"])),
            (
                "torchrun --nproc-per-node=8 user@host:x +y",
                Some(vec!["torchrun", "--nproc-per-node=8", "user@host:x", "+y"]),
            ),
            // expansions, quoting, operators, redirections, globs, comments
            ("echo $HOME", None),
            ("python train.py \"a b\"", None),
            ("python train.py 'a'", None),
            ("a && b", None),
            ("a; b", None),
            ("a | b", None),
            ("a > out", None),
            ("ls *.py", None),
            ("ls file?", None),
            ("ls [ab]", None),
            ("cat ~/x", None),
            ("run # comment", None),
            ("python a\\ b", None),
            ("echo {a,b}", None),
            ("a &", None),
            ("(a)", None),
            ("`a`", None),
            // more than one line, or none
            ("python a.py\npython b.py", None),
            ("", None),
            ("\n", None),
            // assignments and words of the shell
            ("A=1 python x.py", None),
            ("cd sub", None),
            ("exit 3", None),
            ("echo hi", None),
            ("export A", None),
            ("source env.sh", None),
            (". env.sh", None),
            ("exec python", None),
            ("time python", None),
            ("kill 1", None),
            ("pwd", None),
            ("true --help", None),
            ("%1", None),
            ("pythön", None),
            ("a\r", None),
        ] {
            let expected =
                direct.map(|words| words.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(direct_words(script), expected, "{script:?}");
        }
    }
}
