//! Variables of a task's environment that must not reach the steps a root agent runs
//! before the identity switch.
//!
//! On a root agent an execution starts as root: the cgroup join (`/bin/sh`), the private
//! /tmp helper (`taccd`) and `setpriv` run as root, and only then does the task's shell
//! run as the task's uid. The environment is set once, at the first `exec`, and every step
//! inherits it. A task's `environment.vars` are the user's to choose, and the dynamic
//! loader honours `LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`, `GLIBC_TUNABLES`, … in any
//! program not started set-id — so `LD_PRELOAD: ~/evil.so` would run the user's code as
//! root in those steps. The shell reads `BASH_ENV`, `SHELLOPTS` and `PS4` the same way when
//! `/bin/sh` is bash.
//!
//! So those variables travel renamed (`TACC_HELD_BACK_LD_PRELOAD`), which no loader or
//! shell reads, and the task's shell — already running as the task's uid — puts them back
//! under their own names before the first line of the task's script ([`RESTORE`]). The
//! task sees exactly the environment it asked for; nothing it chose reaches a root process.
//! Values never go on a command line (they may be secrets).

use std::collections::BTreeMap;

/// What a held-back variable is renamed to: this prefix and its own name.
pub(crate) const PREFIX: &str = tacc_launch::HELD_PREFIX;

/// Prefixes of variables read by glibc's loader and allocator (its list of variables
/// unsafe for set-id programs, `unsecvars.h`, and the families around it).
const HELD_PREFIXES: &[&str] = &["LD_", "MALLOC_", "GLIBC_"];

/// Single variables read by glibc in every program (`unsecvars.h`: character sets,
/// locales, resolver, time zones, temporary files) or by a shell started as `/bin/sh`.
const HELD_NAMES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZ",
    "TZDIR",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
];

/// Bash, run as the task's uid, puts the held-back variables back under their names and
/// forgets the renamed ones. One line with no newline, so the task's script keeps its line
/// numbers in bash's error messages.
pub(crate) const RESTORE: &str = "for __tacc_held in ${!TACC_HELD_BACK_@}; do \
     export -- \"${__tacc_held#TACC_HELD_BACK_}=${!__tacc_held}\"; unset -v \"$__tacc_held\"; \
     done; unset -v __tacc_held; ";

/// Whether `name` must not reach a process run as root.
pub(crate) fn is_held(name: &str) -> bool {
    HELD_NAMES.contains(&name) || HELD_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The environment to start an execution with when its first steps run as root, and
/// whether any variable was held back (then the task's script must begin with
/// [`RESTORE`]).
pub(crate) fn hold_back(env: &BTreeMap<String, String>) -> (BTreeMap<String, String>, bool) {
    let mut held = false;
    let out = env
        .iter()
        .map(|(name, value)| {
            if is_held(name) {
                held = true;
                (format!("{PREFIX}{name}"), value.clone())
            } else {
                (name.clone(), value.clone())
            }
        })
        .collect();
    (out, held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn loader_and_shell_variables_are_held_back_and_others_pass() {
        for (name, held) in [
            ("LD_PRELOAD", true),
            ("LD_LIBRARY_PATH", true),
            ("LD_AUDIT", true),
            ("GLIBC_TUNABLES", true),
            ("MALLOC_CHECK_", true),
            ("GCONV_PATH", true),
            ("BASH_ENV", true),
            ("SHELLOPTS", true),
            ("PS4", true),
            ("TMPDIR", true),
            ("PATH", false),
            ("HOME", false),
            ("OMP_NUM_THREADS", false),
            ("CUDA_VISIBLE_DEVICES", false),
            ("OLD_PRELOAD", false),
        ] {
            assert_eq!(is_held(name), held, "{name}");
        }
        let env: BTreeMap<String, String> = [("LD_PRELOAD", "/x.so"), ("A", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (out, held) = hold_back(&env);
        assert!(held);
        assert_eq!(
            out.get("TACC_HELD_BACK_LD_PRELOAD").map(String::as_str),
            Some("/x.so")
        );
        assert!(!out.contains_key("LD_PRELOAD"));
        assert_eq!(out.get("A").map(String::as_str), Some("1"));
        let (same, held) = hold_back(&out.into_iter().filter(|(k, _)| k == "A").collect());
        assert!(!held);
        assert_eq!(same.len(), 1);
    }

    /// The real bash restores every held variable, values with spaces, quotes, `$`,
    /// newlines and `=` intact, forgets the renamed ones, and keeps the script's line
    /// numbers.
    #[test]
    fn bash_restores_held_variables_exactly_and_keeps_line_numbers() {
        let tricky = "a b 'c' \"d\" $HOME `x` =e\nf";
        let script = format!(
            "{RESTORE}printf '%s|' \"$LD_TACC_TEST\" \"$TZ\"; env | grep -c '^TACC_HELD_BACK_' || true\n\
             echo \"line $LINENO\""
        );
        let output = Command::new("/bin/bash")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .env("TACC_HELD_BACK_LD_TACC_TEST", tricky)
            .env("TACC_HELD_BACK_TZ", "UTC")
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(stdout, format!("{tricky}|UTC|0\nline 2\n"));
    }
}
