//! Entering a running execution (`tcloud exec`, `tcloud shell`): a new process that runs
//! as the execution's identity, in its cgroup (its limits apply, and it dies with it), in
//! its mount namespace (the same private /tmp and /dev/shm), in its working directory and
//! with its environment (secrets included: only the task's owner may open a session).
//!
//! The process is built like the execution itself (see `process.rs`): a tiny `sh` that
//! waits on its stdin until the agent has moved it into the cgroup, then `nsenter` into
//! the execution's mount namespace, `setsid --ctty` for a terminal, `setpriv` to the
//! task's uid and `env --chdir` into its directory — every one of them an `exec`, so
//! nothing forks and nothing of the user's runs before the identity switch. Loader and
//! shell variables the task chose travel renamed through those root steps and are put
//! back by the task's own shell (`held_env`), so a user's `LD_PRELOAD` never reaches a
//! root process here either.
//!
//! A container task is entered through its engine instead ([`Via::Container`]): `docker
//! exec` into its container, as the task's uid and in its working directory — the
//! container's own environment, cgroup and mounts are the task's already. A Slurm task
//! through Slurm ([`Via::Slurm`]): `srun --overlap --jobid J` on the rank's node, a step
//! inside the job's allocation (its limits apply), with the rank's environment.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::cgroups::Cgroup;
use crate::{ExecError, RunAs};

/// Waits for `go` on stdin (sent once the pid is in the cgroup), then runs the rest with
/// stdin left as it is: the session's pipe.
const ENTER_JOIN_SCRIPT: &str = r#"IFS= read -r go && [ "$go" = go ] && exec "$@"; exit 125"#;
/// The same for a terminal: `go` comes on a pipe of its own (said through the terminal,
/// it would be echoed to the user), then stdin becomes the terminal stdout already is.
const ENTER_JOIN_SCRIPT_TTY: &str =
    r#"IFS= read -r go && [ "$go" = go ] && exec "$@" <&1; exit 125"#;
const NSENTER: &str = "/usr/bin/nsenter";
const SETSID: &str = "/usr/bin/setsid";
const SETPRIV: &str = "/usr/bin/setpriv";
const ENV: &str = "/usr/bin/env";
const BASH: &str = "/bin/bash";

/// What a session needs to know of a running execution to enter it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The execution's main process (held as the agent's unreaped child while it runs,
    /// so its pid cannot be reused meanwhile).
    pub pid: u32,
    pub cgroup: Option<Arc<dyn Cgroup>>,
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
    pub run_as: Option<RunAs>,
    /// The execution has a mount namespace of its own (private /tmp and /dev/shm).
    pub private_mounts: bool,
    /// How the execution is reached.
    pub via: Via,
}

/// How an execution is entered.
#[derive(Debug, Clone, Default)]
pub enum Via {
    /// A process tree on this host: joined as described above.
    #[default]
    Host,
    /// A Docker container: `docker exec` through the engine at `socket` (a path).
    Container { socket: String, container: String },
    /// A rank of a Slurm job: a step on `node` (a Slurm node name) of the job, whose id
    /// is known once the whole gang was submitted.
    Slurm {
        job: Arc<std::sync::OnceLock<u64>>,
        node: String,
    },
}

impl Via {
    fn is_host(&self) -> bool {
        matches!(self, Via::Host)
    }
}

/// The Slurm command that starts a step inside a running job.
const SRUN: &str = "srun";

/// The Docker CLI that `docker exec` runs (the engine is reached at the agent's socket).
const DOCKER: &str = "docker";
/// A shell inside an image: bash where the image has it, else POSIX sh.
const IMAGE_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi";

/// A pseudo-terminal whose controller the agent keeps.
#[derive(Debug)]
pub struct Pty {
    /// The controlling side: what the session reads and writes.
    pub controller: File,
    /// The terminal the command gets as stdin, stdout and stderr.
    terminal: OwnedFd,
}

impl Pty {
    /// A new pseudo-terminal of `rows` × `cols`.
    pub fn open(rows: u16, cols: u16) -> std::io::Result<Pty> {
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        let controller = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        grantpt(&controller)?;
        unlockpt(&controller)?;
        let name = ptsname(&controller, Vec::new())?;
        let terminal: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags_noctty()
            .open(Path::new(&*name.to_string_lossy()))?
            .into();
        let pty = Pty {
            controller: File::from(controller),
            terminal,
        };
        pty.resize(rows, cols)?;
        Ok(pty)
    }

    /// Tell the terminal (and so the command, by `SIGWINCH`) its new size.
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        resize(&self.controller, rows, cols)
    }

    /// The controlling side alone, once the command holds the terminal: when the
    /// command's last process ends, reading it fails (`EIO`) instead of waiting forever.
    pub fn into_controller(self) -> File {
        self.controller
    }
}

/// Tell the terminal whose controlling side is `controller` (and so the command on it, by
/// `SIGWINCH`) its new size.
pub fn resize(controller: &File, rows: u16, cols: u16) -> std::io::Result<()> {
    {
        rustix::termios::tcsetwinsize(
            controller,
            rustix::termios::Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )?;
        Ok(())
    }
}

trait NoCtty {
    fn custom_flags_noctty(&mut self) -> &mut Self;
}

impl NoCtty for std::fs::OpenOptions {
    fn custom_flags_noctty(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
    }
}

/// A process started inside an execution.
#[derive(Debug)]
pub struct Entered {
    pub child: Child,
    /// Its process group (it leads one), for ending it with everything it started.
    pub group: u32,
}

impl Entry {
    /// Whether the first steps of an entered process run as root.
    fn starts_as_root(&self) -> bool {
        self.cgroup.is_some() || self.private_mounts || self.run_as.is_some()
    }

    /// `docker exec` into the container: as the task's identity (the container's user
    /// when the agent gave none), in its working directory, with the container's
    /// environment (the task's); on a terminal (`-t`, the CLI on ours) or on pipes.
    fn container_argv(
        &self,
        socket: &str,
        container: &str,
        command: &[String],
        tty: bool,
    ) -> Vec<String> {
        let mut argv: Vec<String> = Vec::new();
        if tty {
            argv.extend([SETSID, "--ctty", "--"].map(String::from));
        }
        argv.extend([
            DOCKER.to_string(),
            "--host".to_string(),
            format!("unix://{socket}"),
            "exec".to_string(),
            "--interactive".to_string(),
        ]);
        if tty {
            argv.push("--tty".to_string());
        }
        if let Some(run_as) = self.run_as {
            argv.push(format!("--user={}:{}", run_as.uid, run_as.gid));
        }
        argv.push(format!("--workdir={}", self.workdir.display()));
        argv.push(container.to_string());
        if command.is_empty() {
            argv.extend(["/bin/sh", "-c", IMAGE_SHELL].map(String::from));
        } else {
            argv.extend(command.iter().cloned());
        }
        argv
    }

    /// `srun --overlap` into job `job` on `node`: one task, in the working directory,
    /// with a terminal of Slurm's (`--pty`, srun on ours) or on pipes.
    fn slurm_argv(&self, job: u64, node: &str, command: &[String], tty: bool) -> Vec<String> {
        let mut argv: Vec<String> = Vec::new();
        if tty {
            argv.extend([SETSID, "--ctty", "--"].map(String::from));
        }
        argv.extend([
            SRUN.to_string(),
            "--overlap".to_string(),
            format!("--jobid={job}"),
            format!("--nodelist={node}"),
            "--nodes=1".to_string(),
            "--ntasks=1".to_string(),
            "--quiet".to_string(),
            format!("--chdir={}", self.workdir.display()),
        ]);
        if tty {
            argv.push("--pty".to_string());
        }
        if command.is_empty() {
            argv.extend(["/bin/sh", "-c", IMAGE_SHELL].map(String::from));
        } else {
            argv.extend(command.iter().cloned());
        }
        argv
    }

    /// The argv up to and including the task's shell, which then runs `command` (or an
    /// interactive shell when `command` is empty).
    fn argv(
        &self,
        command: &[String],
        tty: bool,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), ExecError> {
        if let Via::Slurm { job, node } = &self.via {
            let Some(job) = job.get() else {
                return Err(ExecError::Slurm(
                    "the attempt's Slurm job is not submitted yet (its gang is still \
                     gathering): try again once it runs"
                        .into(),
                ));
            };
            // The step gets srun's environment: the rank's (kept off the command line,
            // which every user of the node can read), and what srun needs of the agent's.
            let mut env = self.env.clone();
            for key in ["SLURM_CONF"] {
                if let Ok(value) = std::env::var(key) {
                    env.insert(key.to_string(), value);
                }
            }
            if tty && !env.contains_key("TERM") {
                env.insert("TERM".into(), "xterm-256color".into());
            }
            return Ok((self.slurm_argv(*job, node, command, tty), env));
        }
        Ok(self.host_or_container_argv(command, tty))
    }

    fn host_or_container_argv(
        &self,
        command: &[String],
        tty: bool,
    ) -> (Vec<String>, BTreeMap<String, String>) {
        if let Via::Container { socket, container } = &self.via {
            // Only the CLI's own needs, from the agent (the command gets the container's
            // environment, the task's).
            let mut env: BTreeMap<String, String> = ["PATH", "HOME"]
                .into_iter()
                .filter_map(|key| Some((key.to_string(), std::env::var(key).ok()?)))
                .collect();
            if tty {
                env.insert("TERM".into(), "xterm-256color".into());
            }
            return (self.container_argv(socket, container, command, tty), env);
        }
        let mut argv: Vec<String> = Vec::new();
        if self.cgroup.is_some() {
            let script = if tty {
                ENTER_JOIN_SCRIPT_TTY
            } else {
                ENTER_JOIN_SCRIPT
            };
            argv.extend(["/bin/sh", "-c", script, "tacc-enter"].map(String::from));
        }
        if self.private_mounts {
            argv.extend([
                NSENTER.to_string(),
                format!("--target={}", self.pid),
                "--mount".to_string(),
                "--".to_string(),
            ]);
        }
        if tty {
            argv.extend([SETSID, "--ctty", "--"].map(String::from));
        }
        if let Some(run_as) = self.run_as {
            argv.extend([
                SETPRIV.to_string(),
                format!("--reuid={}", run_as.uid),
                format!("--regid={}", run_as.gid),
                "--clear-groups".to_string(),
                "--".to_string(),
                ENV.to_string(),
                format!("--chdir={}", self.workdir.display()),
                "--".to_string(),
            ]);
        }
        let mut env = self.env.clone();
        if tty && !env.contains_key("TERM") {
            env.insert("TERM".into(), "xterm-256color".into());
        }
        let (env, restore) = match crate::held_env::hold_back(&env) {
            (held, true) if self.starts_as_root() => (held, crate::held_env::RESTORE),
            _ => (env, ""),
        };
        let run = if command.is_empty() {
            format!("{restore}exec {BASH} -i")
        } else {
            format!("{restore}exec \"$@\"")
        };
        argv.extend([
            BASH.to_string(),
            "-c".to_string(),
            run,
            "tacc-exec".to_string(),
        ]);
        argv.extend(command.iter().cloned());
        (argv, env)
    }

    /// Start `command` inside the execution: with pipes (stdin, stdout and stderr of the
    /// returned child), or on `pty`'s terminal.
    pub async fn spawn(&self, command: &[String], pty: Option<&Pty>) -> Result<Entered, ExecError> {
        let (mut argv, env) = self.argv(command, pty.is_some())?;
        // Found on the agent's PATH: the command line's own PATH is the task's.
        for program in argv.iter_mut().filter(|p| *p == DOCKER || *p == SRUN) {
            if let Some(found) = on_agent_path(program) {
                *program = found.display().to_string();
            }
        }
        let spawn_error = |source| ExecError::Spawn {
            program: argv[0].clone(),
            workdir: self.workdir.display().to_string(),
            source,
        };
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&env)
            .current_dir(if self.run_as.is_some() || !self.via.is_host() {
                Path::new("/")
            } else {
                self.workdir.as_path()
            })
            .kill_on_drop(true);
        match pty {
            Some(pty) => {
                // Not a group leader, so `setsid` makes it one without forking.
                let io = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
                let stdin = if self.cgroup.is_some() {
                    Stdio::piped()
                } else {
                    io(&pty.terminal).map_err(spawn_error)?
                };
                cmd.stdin(stdin)
                    .stdout(io(&pty.terminal).map_err(spawn_error)?)
                    .stderr(io(&pty.terminal).map_err(spawn_error)?);
            }
            None => {
                cmd.stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0);
            }
        }
        let mut child = cmd.spawn().map_err(spawn_error)?;
        let pid = child.id().unwrap_or(0);
        if let Some(cgroup) = &self.cgroup {
            // Refused once the execution has ended (its cgroup may serve another by now).
            if let Err(e) = cgroup.join(pid) {
                let _ = child.kill().await;
                return Err(e);
            }
            let stdin = child.stdin.as_mut().expect("piped above");
            if let Err(e) = stdin.write_all(b"go\n").await {
                let _ = child.kill().await;
                return Err(spawn_error(e));
            }
            // A terminal's join reads nothing more from its pipe.
            if pty.is_some() {
                drop(child.stdin.take());
            }
        }
        Ok(Entered { child, group: pid })
    }
}

/// Where `program` is on the agent's own PATH.
fn on_agent_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(root: bool) -> Entry {
        let mut env = BTreeMap::new();
        env.insert("LD_PRELOAD".to_string(), "/home/u/evil.so".to_string());
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        Entry {
            pid: 42,
            cgroup: None,
            workdir: PathBuf::from("/work/t1"),
            env,
            run_as: root.then_some(RunAs {
                uid: 1000,
                gid: 1000,
            }),
            private_mounts: root,
            via: Via::Host,
        }
    }

    #[test]
    fn a_container_is_entered_through_docker_exec_as_the_task_in_its_directory() {
        let mut entry = entry(true);
        entry.cgroup = None;
        entry.private_mounts = false;
        entry.via = Via::Container {
            socket: "/run/docker.sock".into(),
            container: "c0ffee".into(),
        };
        let (argv, env) = entry.argv(&["id".into(), "-u".into()], false).unwrap();
        assert_eq!(
            argv,
            [
                "docker",
                "--host",
                "unix:///run/docker.sock",
                "exec",
                "--interactive",
                "--user=1000:1000",
                "--workdir=/work/t1",
                "c0ffee",
                "id",
                "-u"
            ]
        );
        // No secret travels on the CLI's command line or in its environment: the
        // container has the task's environment already.
        assert!(!env.contains_key("LD_PRELOAD"), "{env:?}");
        let (argv, env) = entry.argv(&[], true).unwrap();
        assert_eq!(&argv[..3], ["/usr/bin/setsid", "--ctty", "--"]);
        assert!(argv.contains(&"--tty".to_string()), "{argv:?}");
        assert_eq!(argv.last().map(String::as_str), Some(IMAGE_SHELL));
        assert_eq!(env["TERM"], "xterm-256color");
    }

    #[test]
    fn a_root_entry_holds_the_loader_variables_back_until_the_task_shell() {
        let (argv, env) = entry(true).argv(&["id".into(), "-u".into()], true).unwrap();
        assert_eq!(
            &argv[..4],
            ["/usr/bin/nsenter", "--target=42", "--mount", "--"]
        );
        assert!(argv.contains(&"--reuid=1000".to_string()));
        assert!(argv.contains(&"--ctty".to_string()));
        assert!(!env.contains_key("LD_PRELOAD"), "{env:?}");
        assert_eq!(env["TACC_HELD_BACK_LD_PRELOAD"], "/home/u/evil.so");
        assert_eq!(env["TERM"], "xterm-256color");
        let script = &argv[argv.len() - 4];
        assert!(script.starts_with(crate::held_env::RESTORE), "{script}");
        assert_eq!(&argv[argv.len() - 2..], ["id", "-u"]);
    }

    #[test]
    fn an_unprivileged_entry_passes_the_environment_as_it_is() {
        let (argv, env) = entry(false).argv(&[], false).unwrap();
        assert_eq!(argv[0], "/bin/bash");
        assert_eq!(env["LD_PRELOAD"], "/home/u/evil.so");
        assert_eq!(argv[2], "exec /bin/bash -i");
    }

    #[tokio::test]
    async fn a_command_runs_in_the_working_directory_with_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let mut entry = entry(false);
        entry.workdir = dir.path().to_path_buf();
        entry.env.remove("LD_PRELOAD");
        entry.env.insert("GREETING".into(), "hello".into());
        let command = ["sh", "-c", "echo $GREETING; pwd; exit 4"].map(String::from);
        let entered = entry.spawn(&command, None).await.unwrap();
        let output = entered.child.wait_with_output().await.unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            text,
            format!("hello\n{}\n", dir.path().canonicalize().unwrap().display())
        );
        assert_eq!(output.status.code(), Some(4));
    }

    #[test]
    fn a_slurm_rank_is_entered_by_a_step_of_its_job_once_the_job_is_known() {
        let job = Arc::new(std::sync::OnceLock::new());
        let mut entry = entry(false);
        entry.run_as = None;
        entry.env.insert("API_KEY".into(), "s3cret".into());
        entry.via = Via::Slurm {
            job: job.clone(),
            node: "tacc-n2".into(),
        };
        let refused = entry.argv(&["hostname".into()], false).unwrap_err();
        assert!(
            refused.to_string().contains("not submitted yet"),
            "{refused}"
        );
        job.set(41).unwrap();
        let (argv, env) = entry.argv(&["hostname".into()], false).unwrap();
        assert_eq!(
            argv,
            [
                "srun",
                "--overlap",
                "--jobid=41",
                "--nodelist=tacc-n2",
                "--nodes=1",
                "--ntasks=1",
                "--quiet",
                "--chdir=/work/t1",
                "hostname"
            ]
        );
        // The rank's variables reach the step through srun's environment, not argv.
        assert_eq!(env["API_KEY"], "s3cret");
        assert!(!argv.iter().any(|a| a.contains("s3cret")));
        let (argv, _) = entry.argv(&[], true).unwrap();
        assert!(argv.contains(&"--pty".to_string()), "{argv:?}");
    }
}
