//! The launcher: the one program an execution of a root agent starts as (`tacc-launch`,
//! installed beside `taccd`; `taccd launch` is the same code). Layer 4 (execution), below
//! `tacc-exec`, which builds its command line ([`Steps::args`]) and starts it. It must
//! depend on nothing of TACC and nothing but `nix` and the standard library: it is small
//! and quick to start — every execution pays its start — and it builds for a static
//! target (`x86_64-unknown-linux-musl`: no dynamic loader, no glibc start-up, which on a
//! virtual machine spends most of a small program's start in `cpuid`; see
//! `scripts/static-launcher.sh`).
//!
//! It readies the process for the task, then becomes the task (`exec`, same pid, so the process group
//! and the cgroup carry over) — one short-lived program per execution instead of a chain
//! of five (`sh` for the cgroup join, the private /tmp helper, `setpriv`, `env --chdir`,
//! then `bash`). In order, and before anything of the task runs:
//!
//! 1. the cgroup join: it blocks reading its stdin until the agent, having written the
//!    launcher's pid into the cgroup's `cgroup.procs` file(s), writes `go`; anything else
//!    (the agent failed or died) and it exits 125 without running the task;
//! 2. a private `/tmp` and `/dev/shm` in a mount namespace of its own ([`TmpDirs`], see
//!    `private_tmp.rs`), as root;
//! 3. the identity switch: supplementary groups dropped, then gid, then uid;
//! 4. the working directory, entered as that identity (so a directory it may not enter
//!    fails the launch: exit 125);
//! 5. the task's environment: the variables held back from the root steps (`held_env`:
//!    `LD_PRELOAD`, `GLIBC_TUNABLES`, …) put back under their own names — so the first
//!    loader that reads them is the task's own, already as the task's uid;
//! 6. `exec` of the task's command (the run line itself where it is a plain command, see
//!    `run_line.rs`, else `bash -c`), stdin from `/dev/null`; a bare name is looked up in
//!    the task's `PATH` with `access` first (one `execve`, not one per directory).
//!
//! The agent starts this crate's binary, `tacc-launch`, where it is installed beside
//! `taccd`, else `taccd` itself as `taccd launch …` (the same code); it starts it by
//! `posix_spawn` (an absolute program, no `pre_exec`), so the agent never forks itself and
//! no code of the agent runs between `fork` and `exec` (the workspace has no `unsafe`).
//! Failures before the task runs exit 125 with the reason on stderr (the task's log); a
//! command that is not found exits 127 and one that cannot be executed 126, as bash has it.

mod private_tmp;

/// The Unix identity an execution runs as: the process runtime switches to it in the
/// child before `exec` (supplementary groups dropped, then gid, then uid); a container
/// gets it as `--user uid:gid`. Never root: the agent refuses uid or gid 0 before it
/// builds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// What a variable held back from the root-run steps is renamed with (`tacc_exec`'s
/// `held_env`); the launcher gives it its own name back once it has switched identity.
pub const HELD_PREFIX: &str = "TACC_HELD_BACK_";

pub use private_tmp::namespace as private_tmp_namespace;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;

/// The launcher's subcommand (hidden in `taccd`).
pub const LAUNCH_SUBCOMMAND: &str = "launch";

/// Exit status of a launch that failed before the task ran (as `env` and the join script).
pub const LAUNCH_FAILED: i32 = 125;

/// The directories an execution sees as `/tmp` and `/dev/shm` (see `tacc_exec::PrivateTmp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpDirs {
    pub tmp: PathBuf,
    pub shm: PathBuf,
    /// A directory under `/tmp` still reached at its own path.
    pub keep: Option<PathBuf>,
}

/// What the launcher does before it becomes the task: its command line, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// Wait for `go` on stdin (the agent moves the pid into the cgroup first).
    pub join: bool,
    pub private_tmp: Option<TmpDirs>,
    pub run_as: Option<RunAs>,
    pub workdir: PathBuf,
    /// The task's program and its arguments.
    pub command: Vec<OsString>,
    /// `command` is the task's run line itself, not a shell: `PWD` and `SHLVL` are
    /// exported as the shell would have.
    pub direct: bool,
}

impl Steps {
    /// The launcher's arguments after [`LAUNCH_SUBCOMMAND`]:
    /// `[--join] [--tmp T --shm S [--keep K]] [--uid U --gid G] --chdir DIR -- PROGRAM ARGS…`.
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: &OsStr| {
            args.push(name.into());
            args.push(value.to_owned());
        };
        if let Some(dirs) = &self.private_tmp {
            flag("--tmp", dirs.tmp.as_os_str());
            flag("--shm", dirs.shm.as_os_str());
            if let Some(keep) = &dirs.keep {
                flag("--keep", keep.as_os_str());
            }
        }
        if let Some(who) = self.run_as {
            flag("--uid", OsStr::new(&who.uid.to_string()));
            flag("--gid", OsStr::new(&who.gid.to_string()));
        }
        flag("--chdir", self.workdir.as_os_str());
        if self.direct {
            args.insert(0, "--direct".into());
        }
        if self.join {
            args.insert(0, "--join".into());
        }
        args.push("--".into());
        args.extend(self.command.iter().cloned());
        args
    }

    /// The steps from the launcher's arguments (those [`Steps::args`] makes).
    pub fn parse(args: &[OsString]) -> Result<Steps, String> {
        let mut join = false;
        let mut direct = false;
        let (mut tmp, mut shm, mut keep) = (None, None, None);
        let (mut uid, mut gid) = (None, None);
        let mut workdir = None;
        let mut rest = args.iter();
        let command = loop {
            let Some(arg) = rest.next() else {
                return Err("no `--` before the task's command".into());
            };
            let mut value = |name: &str| {
                rest.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            let number = |name: &str, value: OsString| {
                value
                    .to_str()
                    .and_then(|v| v.parse::<u32>().ok())
                    .ok_or_else(|| format!("{name} takes a number, not {value:?}"))
            };
            match arg.as_bytes() {
                b"--join" => join = true,
                b"--direct" => direct = true,
                b"--tmp" => tmp = Some(PathBuf::from(value("--tmp")?)),
                b"--shm" => shm = Some(PathBuf::from(value("--shm")?)),
                b"--keep" => keep = Some(PathBuf::from(value("--keep")?)),
                b"--uid" => uid = Some(number("--uid", value("--uid")?)?),
                b"--gid" => gid = Some(number("--gid", value("--gid")?)?),
                b"--chdir" => workdir = Some(PathBuf::from(value("--chdir")?)),
                b"--" => break rest.cloned().collect::<Vec<_>>(),
                other => {
                    return Err(format!(
                        "unknown argument {:?}",
                        String::from_utf8_lossy(other)
                    ));
                }
            }
        };
        let private_tmp = match (tmp, shm) {
            (Some(tmp), Some(shm)) => Some(TmpDirs { tmp, shm, keep }),
            (None, None) if keep.is_none() => None,
            _ => return Err("--tmp and --shm go together (and --keep only with them)".into()),
        };
        let run_as = match (uid, gid) {
            (Some(uid), Some(gid)) => Some(RunAs { uid, gid }),
            (None, None) => None,
            _ => return Err("--uid and --gid go together".into()),
        };
        if command.is_empty() {
            return Err("no command after `--`".into());
        }
        Ok(Steps {
            join,
            private_tmp,
            run_as,
            workdir: workdir.ok_or("--chdir is required")?,
            command,
            direct,
        })
    }
}

/// Whether this process was started as the launcher (`PROGRAM launch …`).
pub fn requested() -> bool {
    std::env::args_os().nth(1).as_deref() == Some(OsStr::new(LAUNCH_SUBCOMMAND))
}

/// The launcher's `main`: parse, ready the process, become the task. Returns never: on a
/// failure it says why on stderr (the task's log) and exits with [`LAUNCH_FAILED`] (or
/// 127 / 126 for a command that is not found / cannot be executed).
pub fn main() -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    let (code, message) = match Steps::parse(&args) {
        Ok(steps) => launch(&steps),
        Err(error) => (LAUNCH_FAILED, format!("launcher: {error}")),
    };
    eprintln!("tacc: {message}");
    std::process::exit(code);
}

/// The steps, then `exec`; returns only on failure: the exit status and why.
fn launch(steps: &Steps) -> (i32, String) {
    if steps.join {
        if let Err(why) = wait_for_go() {
            return (LAUNCH_FAILED, why);
        }
    }
    if let Some(dirs) = &steps.private_tmp {
        if let Err(error) = private_tmp::namespace(&dirs.tmp, &dirs.shm, dirs.keep.as_deref()) {
            return (
                LAUNCH_FAILED,
                format!("cannot give the task a private /tmp and /dev/shm: {error}"),
            );
        }
    }
    if let Some(who) = steps.run_as {
        if let Err(error) = switch_identity(who) {
            return (
                LAUNCH_FAILED,
                format!("cannot switch to uid {} gid {}: {error}", who.uid, who.gid),
            );
        }
    }
    if let Err(error) = std::env::set_current_dir(&steps.workdir) {
        let who = steps
            .run_as
            .map(|w| format!(" as uid {}", w.uid))
            .unwrap_or_default();
        return (
            LAUNCH_FAILED,
            format!("cannot enter {}{who}: {error}", steps.workdir.display()),
        );
    }
    let env = task_env(
        std::env::vars_os(),
        steps.direct.then_some(steps.workdir.as_path()),
    );
    let mut command = steps.command.clone();
    if steps.direct {
        if let Some(script) = shebang_less_script(&command[0], env.get(OsStr::new("PATH"))) {
            // What bash does with an executable text file without `#!`: run it as a bash
            // script (the kernel refuses it, and `execvp` would hand it to `/bin/sh`).
            command.splice(0..1, [OsString::from(BASH), script.into_os_string()]);
        }
    }
    let (program, args) = command
        .split_first()
        .expect("parse refuses an empty command");
    let exec = |path: &OsStr| {
        std::process::Command::new(path)
            .arg0(program)
            .args(args)
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .exec()
    };
    // Found in PATH by a look (`access`) at each directory rather than an `execve` tried
    // in each, as `execvp` does: each failed `execve` costs the kernel the most of an exec.
    // Where the one found cannot be run, the search `execvp` makes decides.
    if let Some(found) = in_path(program, env.get(OsStr::new("PATH"))) {
        exec(found.as_os_str());
    }
    let error = exec(program);
    let name = program.to_string_lossy();
    match error.kind() {
        std::io::ErrorKind::NotFound => (127, format!("{name}: command not found")),
        _ => (126, format!("cannot run {name}: {error}")),
    }
}

/// The first file named `program` in `path`'s directories that this process may execute,
/// where `program` is a bare name (a name with a `/` is run as it is).
fn in_path(program: &OsStr, path: Option<&OsString>) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return None;
    }
    std::env::split_paths(path?)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(program)
            } else {
                dir.join(program)
            }
        })
        .find(|candidate| {
            nix::unistd::access(candidate, nix::unistd::AccessFlags::X_OK).is_ok()
                && is_executable_file(candidate)
        })
}

/// A regular file with an execute bit.
fn is_executable_file(file: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The shell a task's shebang-less script runs under, as it would under `bash -c`.
const BASH: &str = "/bin/bash";

/// Where `program` is an executable file that is neither a binary (ELF) nor a script with
/// `#!` — found as bash finds it: by its path where it has a `/`, else in `PATH`
/// ([`in_path`]) — that file.
fn shebang_less_script(program: &OsStr, path: Option<&OsString>) -> Option<PathBuf> {
    let file = if program.as_bytes().contains(&b'/') {
        PathBuf::from(program)
    } else {
        in_path(program, path)?
    };
    if !is_executable_file(&file) {
        return None;
    }
    let mut head = [0u8; 4];
    let read = std::fs::File::open(&file)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let head = &head[..read];
    (!head.starts_with(b"#!") && head != b"\x7fELF").then_some(file)
}

/// Block until the agent says `go` (the pid is in its cgroup); the pipe is read byte by
/// byte so nothing past the line is taken from it.
fn wait_for_go() -> Result<(), String> {
    let mut line = Vec::new();
    let mut stdin = std::io::stdin().lock();
    let mut byte = [0u8; 1];
    while line.len() < 8 {
        match stdin.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => line.push(byte[0]),
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("the agent did not let the task start: {e}")),
        }
    }
    if line == b"go" {
        Ok(())
    } else {
        Err(
            "the agent did not let the task start (it failed or ended before the cgroup join)"
                .into(),
        )
    }
}

/// Supplementary groups dropped, gid, then uid: after this nothing of root is left.
fn switch_identity(who: RunAs) -> nix::Result<()> {
    use nix::unistd::{Gid, Uid, setgid, setgroups, setuid};
    setgroups(&[])?;
    setgid(Gid::from_raw(who.gid))?;
    setuid(Uid::from_raw(who.uid))
}

/// The task's environment from the launcher's: held-back variables under their own names
/// again (see `held_env`); for a command run without a shell (`direct_in`: its working
/// directory), `PWD` and `SHLVL` as `bash -c` would have exported them, so it sees what it
/// would have seen under the shell.
fn task_env(
    inherited: impl Iterator<Item = (OsString, OsString)>,
    direct_in: Option<&std::path::Path>,
) -> BTreeMap<OsString, OsString> {
    let prefix = HELD_PREFIX.as_bytes();
    let mut env = BTreeMap::new();
    let mut restored = Vec::new();
    for (name, value) in inherited {
        match name.as_bytes().strip_prefix(prefix) {
            Some(own) if !own.is_empty() => {
                restored.push((OsStr::from_bytes(own).to_owned(), value))
            }
            _ => {
                env.insert(name, value);
            }
        }
    }
    env.extend(restored);
    if let Some(workdir) = direct_in {
        env.insert("PWD".into(), workdir.as_os_str().to_owned());
        let level = env
            .get(OsStr::new("SHLVL"))
            .and_then(|v| v.to_str()?.parse::<u32>().ok())
            .unwrap_or(0);
        env.insert("SHLVL".into(), (level + 1).to_string().into());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_found_in_path_without_trying_each_directory_by_exec() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (plain, tools) = (dir.path().join("plain"), dir.path().join("tools"));
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::create_dir_all(&tools).unwrap();
        // Not executable in the first directory; executable in the second.
        std::fs::write(plain.join("job"), "x").unwrap();
        std::fs::write(tools.join("job"), "x").unwrap();
        std::fs::set_permissions(tools.join("job"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let path =
            std::env::join_paths([dir.path().join("missing"), plain, tools.clone()]).unwrap();
        assert_eq!(
            in_path(OsStr::new("job"), Some(&path)),
            Some(tools.join("job"))
        );
        assert_eq!(in_path(OsStr::new("absent"), Some(&path)), None);
        assert_eq!(
            in_path(OsStr::new("./job"), Some(&path)),
            None,
            "a path is run as it is"
        );
        assert_eq!(in_path(OsStr::new("job"), None), None);
    }

    fn os(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_step_survives_its_command_line() {
        let full = Steps {
            join: true,
            private_tmp: Some(TmpDirs {
                tmp: "/scratch/a/tmp".into(),
                shm: "/scratch/a/shm".into(),
                keep: Some("/tmp/data".into()),
            }),
            run_as: Some(RunAs {
                uid: 5000,
                gid: 5001,
            }),
            workdir: "/work/dir with space".into(),
            command: os(&["/bin/bash", "-c", "echo -- hi", "label"]),
            direct: false,
        };
        assert_eq!(Steps::parse(&full.args()), Ok(full.clone()));
        let bare = Steps {
            join: false,
            private_tmp: None,
            run_as: None,
            workdir: "/w".into(),
            command: os(&["true"]),
            direct: true,
        };
        assert_eq!(
            bare.args(),
            os(&["--direct", "--chdir", "/w", "--", "true"])
        );
        assert_eq!(Steps::parse(&bare.args()), Ok(bare));
    }

    #[test]
    fn a_malformed_command_line_is_refused_with_the_reason() {
        for (args, why) in [
            (os(&["--chdir", "/w"]), "no `--`"),
            (os(&["--chdir", "/w", "--"]), "no command"),
            (os(&["--", "true"]), "--chdir is required"),
            (
                os(&["--uid", "5", "--chdir", "/w", "--", "true"]),
                "go together",
            ),
            (
                os(&["--tmp", "/t", "--chdir", "/w", "--", "true"]),
                "go together",
            ),
            (
                os(&["--uid", "x", "--gid", "1", "--chdir", "/w", "--", "true"]),
                "number",
            ),
            (
                os(&["--setuid", "0", "--chdir", "/w", "--", "true"]),
                "unknown",
            ),
        ] {
            let error = Steps::parse(&args).unwrap_err();
            assert!(error.contains(why), "{args:?}: {error}");
        }
    }

    #[test]
    fn held_variables_come_back_under_their_names_with_pwd_and_shlvl() {
        let inherited = [
            ("TACC_HELD_BACK_LD_PRELOAD", "/home/u/x.so"),
            ("TACC_HELD_BACK_TZ", "UTC"),
            ("PATH", "/usr/bin"),
            ("SHLVL", "2"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = task_env(
            inherited.clone().into_iter(),
            Some(std::path::Path::new("/w")),
        );
        let get = |k: &str| env.get(OsStr::new(k)).and_then(|v| v.to_str());
        assert_eq!(get("LD_PRELOAD"), Some("/home/u/x.so"));
        assert_eq!(get("TZ"), Some("UTC"));
        assert_eq!(get("PATH"), Some("/usr/bin"));
        assert_eq!(get("PWD"), Some("/w"));
        assert_eq!(get("SHLVL"), Some("3"));
        assert!(
            !env.keys()
                .any(|k| k.as_bytes().starts_with(b"TACC_HELD_BACK_")),
            "{env:?}"
        );
        // Under bash, bash itself exports them.
        let env = task_env(inherited.into_iter(), None);
        assert_eq!(
            env.get(OsStr::new("SHLVL")).and_then(|v| v.to_str()),
            Some("2")
        );
        assert!(!env.contains_key(OsStr::new("PWD")));
    }
}
