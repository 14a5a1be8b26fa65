//! Managed environments on a node: one build per env key, reused by every later task with
//! the same key, evicted least-recently-used beyond a size budget, never while in use.
//!
//! Layout under `DATA/envs/`: `<key>/` is a finished environment (it holds the
//! `.tacc-env-ready` marker, whose mtime is the last use, and `.tacc-env-size`), `<key>.log`
//! the log of its last build (0600: it is the user's output), `.build-<key>/env` a build
//! in progress (renamed into place only when complete, so a crash never leaves a
//! half-built environment that looks ready).
//!
//! Builds run the task's package installers, which run code from the packages: they run
//! as the task's own identity ([`StepIdentity`]), never as the agent (root), and with
//! the interpreter that identity can execute. A finished environment is then sealed
//! (owned by the agent, read-only to tasks, see [`crate::layout::seal`]). Since anything
//! running as that identity could have changed the environment while it was being
//! built, an environment is only ever shared by tasks of the same identity: the uid is
//! part of the env key whenever tasks run as other accounts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use std::os::unix::fs::OpenOptionsExt;

use tacc_compiler::{EnvPlan, InstructionEnvironment, env_key};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::identity::StepIdentity;

const READY_MARKER: &str = ".tacc-env-ready";
const SIZE_FILE: &str = ".tacc-env-size";

#[derive(Debug)]
struct CachedEnv {
    size: u64,
    last_used: SystemTime,
    in_use: usize,
}

/// The node's environments.
#[derive(Debug)]
pub(crate) struct EnvCache {
    root: PathBuf,
    /// Total size of finished environments past which unused ones are evicted.
    max_bytes: u64,
    node_name: String,
    envs: Mutex<BTreeMap<String, CachedEnv>>,
    /// One lock per key: a second task wanting a key that is being built waits for that
    /// build instead of starting its own.
    builds: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// An environment held for one attempt; while any lease on a key lives it is not evicted.
#[derive(Debug)]
pub(crate) struct EnvLease {
    cache: Arc<EnvCache>,
    pub key: String,
    /// Variables that activate it (PATH is prefixed by the caller).
    pub vars: BTreeMap<String, String>,
    pub bin_dir: PathBuf,
}

impl Drop for EnvLease {
    fn drop(&mut self) {
        let mut envs = self.cache.envs.lock().unwrap();
        if let Some(env) = envs.get_mut(&self.key) {
            env.in_use = env.in_use.saturating_sub(1);
            env.last_used = SystemTime::now();
        }
    }
}

/// The tool that builds an environment and the exact version it provides.
#[derive(Debug, Clone)]
enum Builder {
    /// A Python interpreter; `uv` is used with it when the node has `uv`.
    Python {
        interpreter: PathBuf,
        version: String,
        uv: Option<PathBuf>,
    },
    Conda {
        tool: PathBuf,
        version: String,
    },
}

impl EnvCache {
    /// Opens `root`, forgetting interrupted builds and loading finished environments.
    pub fn open(root: PathBuf, max_bytes: u64, node_name: String) -> std::io::Result<Self> {
        std::fs::create_dir_all(&root)?;
        let mut envs = BTreeMap::new();
        for entry in std::fs::read_dir(&root)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(".build-") || name.starts_with(".evict-") {
                let _ = std::fs::remove_dir_all(&path);
                continue;
            }
            let Ok(marker) = std::fs::metadata(path.join(READY_MARKER)) else {
                continue;
            };
            let size = std::fs::read_to_string(path.join(SIZE_FILE))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            envs.insert(
                name,
                CachedEnv {
                    size,
                    last_used: marker.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    in_use: 0,
                },
            );
        }
        Ok(EnvCache {
            root,
            max_bytes,
            node_name,
            envs: Mutex::new(envs),
            builds: Mutex::new(BTreeMap::new()),
        })
    }

    /// The environment `wanted` asks for, built if this node has none with its key yet.
    /// Build output goes to `log` line by line (and to `DATA/envs/<key>.log`). `Err` is a
    /// message for the user.
    pub async fn acquire(
        self: &Arc<Self>,
        wanted: &InstructionEnvironment,
        workdir: &Path,
        who: &StepIdentity,
        log: &(dyn Fn(String) + Sync),
    ) -> Result<EnvLease, String> {
        let builder = self.find_builder(&wanted.plan, who).await?;
        let requirements = match wanted.plan.requirements() {
            None => None,
            Some(file) => Some(std::fs::read(workdir.join(file)).map_err(|e| {
                format!(
                    "cannot read the requirements file `{file}` from the code snapshot: {e}; \
                     check `environment.requirements` names a file inside `code.dir`"
                )
            })?),
        };
        let (interpreter, kind) = match &builder {
            Builder::Python { version, .. } => (format!("python {version}"), "venv"),
            Builder::Conda { version, .. } => (version.clone(), "conda"),
        };
        let mut platform = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
        if let Some(run_as) = who.run_as {
            // Only this identity's tasks may use what this identity built.
            platform.push_str(&format!(" uid={}", run_as.uid));
        }
        let key = env_key(
            &wanted.spec_key,
            requirements.as_deref(),
            &interpreter,
            &platform,
        );
        let build_lock = self
            .builds
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        let _building = build_lock.lock().await;
        let dir = self.root.join(&key);
        let ready = self.envs.lock().unwrap().contains_key(&key);
        if ready {
            log(format!(
                "tacc: reusing environment {key} ({kind}, {interpreter})"
            ));
        } else {
            log(format!(
                "tacc: building environment {key} ({kind}, {interpreter}) on node {}",
                self.node_name
            ));
            let started = Instant::now();
            let size = self
                .build(&builder, &wanted.plan, &key, workdir, who, log)
                .await?;
            log(format!(
                "tacc: environment {key} ready in {:.1}s",
                started.elapsed().as_secs_f64()
            ));
            self.envs.lock().unwrap().insert(
                key.clone(),
                CachedEnv {
                    size,
                    last_used: SystemTime::now(),
                    in_use: 0,
                },
            );
        }
        {
            let mut envs = self.envs.lock().unwrap();
            if let Some(env) = envs.get_mut(&key) {
                env.in_use += 1;
                env.last_used = SystemTime::now();
            }
        }
        // The marker's mtime records the last use across agent restarts.
        if let Ok(marker) = std::fs::File::open(dir.join(READY_MARKER)) {
            let _ = marker.set_modified(SystemTime::now());
        }
        self.evict_beyond_budget();
        let var = match builder {
            Builder::Python { .. } => "VIRTUAL_ENV",
            Builder::Conda { .. } => "CONDA_PREFIX",
        };
        Ok(EnvLease {
            cache: self.clone(),
            key,
            vars: BTreeMap::from([(var.to_string(), dir.display().to_string())]),
            bin_dir: dir.join("bin"),
        })
    }

    /// The tool to build `plan` with: the first on the agent's PATH that `who` can run.
    async fn find_builder(&self, plan: &EnvPlan, who: &StepIdentity) -> Result<Builder, String> {
        match plan {
            EnvPlan::Conda { .. } => {
                for tool in ["mamba", "conda"] {
                    for path in on_path(tool) {
                        let Some(version) = capture(&path, &["--version"], who).await else {
                            continue;
                        };
                        return Ok(Builder::Conda {
                            tool: path,
                            version: version.trim().to_string(),
                        });
                    }
                }
                Err(format!(
                    "`environment.conda` needs conda or mamba, and node {} has neither on its \
                     PATH; install Miniforge on the node, or use `environment.python` with \
                     `pip` instead",
                    self.node_name
                ))
            }
            EnvPlan::Venv { python, .. } => {
                let mut candidates = Vec::new();
                if let Some(version) = python {
                    candidates.push(format!("python{version}"));
                }
                candidates.extend(["python3".to_string(), "python".to_string()]);
                let mut found = Vec::new();
                // Every match on PATH, in order: the first ones may be out of reach of
                // the task's account (say under root's home).
                for name in candidates {
                    for path in on_path(&name) {
                        let Some(version) = capture(
                            &path,
                            &["-c", "import platform; print(platform.python_version())"],
                            who,
                        )
                        .await
                        else {
                            continue;
                        };
                        let version = version.trim().to_string();
                        let fits = python
                            .as_deref()
                            .is_none_or(|v| version == v || version.starts_with(&format!("{v}.")));
                        if fits {
                            let mut uv = None;
                            for candidate in on_path("uv") {
                                if capture(&candidate, &["--version"], who).await.is_some() {
                                    uv = Some(candidate);
                                    break;
                                }
                            }
                            return Ok(Builder::Python {
                                interpreter: path,
                                version,
                                uv,
                            });
                        }
                        found.push(format!("{} is {version}", path.display()));
                    }
                }
                Err(match python {
                    Some(v) => format!(
                        "node {} has no Python {v} ({}); ask for a version the cluster's nodes \
                         have in `environment.python`, or install Python {v} there",
                        self.node_name,
                        if found.is_empty() {
                            "no Python on PATH that tasks may run".to_string()
                        } else {
                            found.join(", ")
                        }
                    ),
                    None => format!(
                        "node {} has no `python3` on its PATH that tasks may run, to build the \
                         environment with",
                        self.node_name
                    ),
                })
            }
        }
    }

    /// Builds into `.build-<key>/env` as `who`, seals it, then renames it to `<key>`.
    /// Returns its size.
    async fn build(
        &self,
        builder: &Builder,
        plan: &EnvPlan,
        key: &str,
        workdir: &Path,
        who: &StepIdentity,
        log: &(dyn Fn(String) + Sync),
    ) -> Result<u64, String> {
        let build_dir = self.root.join(format!(".build-{key}"));
        let _ = std::fs::remove_dir_all(&build_dir);
        // The builder's own directory, where only it may write.
        crate::layout::private_dir(&build_dir, who.run_as)
            .map_err(|e| format!("cannot create {}: {e}", build_dir.display()))?;
        let staging = build_dir.join("env");
        let log_path = self.root.join(format!("{key}.log"));
        let _ = std::fs::remove_file(&log_path);
        let log_file = Mutex::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&log_path)
                .ok(),
        );
        let log_both = |line: String| {
            if let Some(file) = log_file.lock().unwrap().as_mut() {
                use std::io::Write;
                let _ = writeln!(file, "{line}");
            }
            log(line);
        };
        let failed = |what: &str, why: String| {
            let _ = std::fs::remove_dir_all(&build_dir);
            format!(
                "{what} failed: {why} (the build log is in the task's log, `tcloud logs`, and on \
                 node {} at {})",
                self.node_name,
                log_path.display()
            )
        };
        let mut install: Vec<String> = plan.packages().to_vec();
        if let Some(file) = plan.requirements() {
            install.push("-r".into());
            install.push(workdir.join(file).display().to_string());
        }
        let context = BuildContext {
            workdir,
            vars: plan.build_vars(),
            who,
            log: &log_both,
        };
        let staging_text = staging.display().to_string();
        let python_in_env = staging.join("bin").join("python").display().to_string();
        match builder {
            Builder::Python {
                interpreter, uv, ..
            } => {
                let interpreter_text = interpreter.display().to_string();
                match uv {
                    Some(uv) => {
                        run_logged(
                            uv,
                            &["venv", "--python", &interpreter_text, &staging_text],
                            &context,
                        )
                        .await
                        .map_err(|e| failed("`uv venv`", e))?;
                        if !install.is_empty() {
                            let mut args = vec!["pip", "install", "--python", &python_in_env];
                            args.extend(install.iter().map(String::as_str));
                            run_logged(uv, &args, &context)
                                .await
                                .map_err(|e| failed("`uv pip install`", e))?;
                        }
                    }
                    None => {
                        run_logged(interpreter, &["-m", "venv", &staging_text], &context)
                            .await
                            .map_err(|e| failed("`python -m venv`", e))?;
                        if !install.is_empty() {
                            let mut args = vec![
                                "-m",
                                "pip",
                                "install",
                                "--disable-pip-version-check",
                                "--no-input",
                            ];
                            args.extend(install.iter().map(String::as_str));
                            run_logged(Path::new(&python_in_env), &args, &context)
                                .await
                                .map_err(|e| failed("`pip install`", e))?;
                        }
                    }
                }
            }
            Builder::Conda { tool, .. } => {
                let EnvPlan::Conda {
                    python,
                    channels,
                    dependencies,
                    ..
                } = plan
                else {
                    return Err("internal error: a conda builder for a venv plan".into());
                };
                let mut args: Vec<String> = vec![
                    "create".into(),
                    "--yes".into(),
                    "--prefix".into(),
                    staging_text.clone(),
                ];
                for channel in channels {
                    args.push("--channel".into());
                    args.push(channel.clone());
                }
                if let Some(python) = python {
                    args.push(format!("python={python}"));
                } else if !install.is_empty() {
                    args.push("python".into());
                }
                args.extend(dependencies.iter().cloned());
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                run_logged(tool, &args, &context)
                    .await
                    .map_err(|e| failed("conda create", e))?;
                if !install.is_empty() {
                    let mut args = vec!["-m", "pip", "install", "--no-input"];
                    args.extend(install.iter().map(String::as_str));
                    run_logged(Path::new(&python_in_env), &args, &context)
                        .await
                        .map_err(|e| failed("`pip install` into the conda environment", e))?;
                }
            }
        }
        // Everything the build left is the agent's now, and read-only to tasks.
        let builder_uid = who
            .run_as
            .map_or_else(|| nix::unistd::geteuid().as_raw(), |r| r.uid);
        let size = crate::layout::seal(&build_dir, builder_uid, crate::layout::SHARED)
            .map_err(|e| failed("sealing the environment", e.to_string()))?;
        if !staging.is_dir() {
            return Err(failed(
                "the build",
                format!("it left no environment at {}", staging.display()),
            ));
        }
        let written = std::fs::write(staging.join(SIZE_FILE), size.to_string())
            .and_then(|()| std::fs::write(staging.join(READY_MARKER), b""))
            .and_then(|()| std::fs::rename(&staging, self.root.join(key)));
        written.map_err(|e| failed("finishing the environment", e.to_string()))?;
        let _ = std::fs::remove_dir_all(&build_dir);
        Ok(size)
    }

    /// Removes least-recently-used environments that no attempt holds until the total
    /// size fits the budget (the ones in use may keep it above).
    fn evict_beyond_budget(&self) {
        let victims: Vec<String> = {
            let mut envs = self.envs.lock().unwrap();
            let mut total: u64 = envs.values().map(|e| e.size).sum();
            let mut idle: Vec<(SystemTime, String, u64)> = envs
                .iter()
                .filter(|(_, e)| e.in_use == 0)
                .map(|(k, e)| (e.last_used, k.clone(), e.size))
                .collect();
            idle.sort();
            let mut victims = Vec::new();
            for (_, key, size) in idle {
                if total <= self.max_bytes {
                    break;
                }
                total -= size;
                envs.remove(&key);
                victims.push(key);
            }
            victims
        };
        for key in victims {
            tracing::info!("evicting environment {key}: the environment cache is over its size");
            // Renamed first so that no later lookup can see a half-deleted environment.
            let doomed = self.root.join(format!(".evict-{key}"));
            if std::fs::rename(self.root.join(&key), &doomed).is_ok() {
                let _ = std::fs::remove_dir_all(&doomed);
            }
        }
    }

    #[cfg(test)]
    fn keys(&self) -> Vec<String> {
        self.envs.lock().unwrap().keys().cloned().collect()
    }
}

/// Every executable named `program` on the agent's PATH, in PATH order.
fn on_path(program: &str) -> Vec<PathBuf> {
    let Some(path) = std::env::var_os("PATH") else {
        return Vec::new();
    };
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .filter(|candidate| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .collect()
}

/// A program's stdout when run as `who`, `None` if it could not run or failed.
async fn capture(program: &Path, args: &[&str], who: &StepIdentity) -> Option<String> {
    let output = who
        .command(program)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .await
        .ok()?;
    if !output.status.success() {
        return None;
    }
    // Some tools (old conda) print their version on stderr.
    let text = if output.stdout.is_empty() {
        output.stderr
    } else {
        output.stdout
    };
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// Where and with what a build step runs.
struct BuildContext<'a> {
    workdir: &'a Path,
    vars: &'a BTreeMap<String, String>,
    who: &'a StepIdentity,
    log: &'a (dyn Fn(String) + Sync),
}

/// Runs a build step, forwarding stdout and stderr line by line; `Err` says how it ended.
async fn run_logged(program: &Path, args: &[&str], build: &BuildContext<'_>) -> Result<(), String> {
    let log = build.log;
    log(format!("$ {} {}", program.display(), args.join(" ")));
    let mut child = build
        .who
        .command(program)
        .args(args)
        .envs(build.vars)
        .current_dir(build.workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so whatever it starts in the background ends with it.
        .process_group(0)
        // A cancelled attempt drops this future: the build must not outlive it.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let group = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let forward = async {
        tokio::join!(forward_lines(stdout, log), forward_lines(stderr, log));
    };
    tokio::pin!(forward);
    let (status, forwarded) = tokio::select! {
        status = child.wait() => (status, false),
        () = &mut forward => (child.wait().await, true),
    };
    // The step is over: what it left running in its group goes too, and with it the
    // pipes it held, so the rest of its output drains (bounded, for a process that
    // escaped the group).
    if let Some(group) = group {
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    }
    if !forwarded {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut forward).await;
    }
    let status = status.map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("it exited with {status}"))
    }
}

async fn forward_lines<R: tokio::io::AsyncRead + Unpin>(
    stream: Option<R>,
    log: &(dyn Fn(String) + Sync),
) {
    if let Some(stream) = stream {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            log(format!("[env] {line}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(pip: &[&str]) -> InstructionEnvironment {
        let plan = EnvPlan::Venv {
            python: None,
            packages: pip.iter().map(|p| p.to_string()).collect(),
            requirements: None,
            build_vars: BTreeMap::new(),
        };
        InstructionEnvironment {
            spec_key: plan.spec_key(),
            plan,
        }
    }

    #[tokio::test]
    async fn concurrent_acquires_of_one_key_build_once_and_lru_evicts_idle_ones() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        // A budget of one byte: every idle environment is beyond it.
        let cache = Arc::new(EnvCache::open(dir.path().join("envs"), 1, "n".into()).unwrap());
        let lines = Mutex::new(Vec::new());
        let log = |line: String| lines.lock().unwrap().push(line);
        let empty = plan(&[]);
        let me = StepIdentity::agent();
        let (a, b) = tokio::join!(
            cache.acquire(&empty, &work, &me, &log),
            cache.acquire(&empty, &work, &me, &log)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.key, b.key);
        let text = lines.lock().unwrap().join("\n");
        assert_eq!(
            text.matches("tacc: building environment").count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.matches("tacc: reusing environment").count(),
            1,
            "{text}"
        );
        assert!(a.bin_dir.join("python").exists());

        // In use: a second environment's build must not evict the first.
        let other = plan(&["--version-is-not-a-package-but-pip-accepts-no-such-flag"]);
        let failed = cache.acquire(&other, &work, &me, &log).await.unwrap_err();
        assert!(failed.contains("`pip install` failed"), "{failed}");
        assert_eq!(cache.keys(), vec![a.key.clone()]);
        assert!(a.bin_dir.exists());
        let key = a.key.clone();
        drop((a, b));
        // Idle now and over budget: the next acquire of another key evicts it.
        let third = plan(&[]);
        let third = InstructionEnvironment {
            spec_key: "another".into(),
            ..third
        };
        let lease = cache.acquire(&third, &work, &me, &log).await.unwrap();
        assert_eq!(cache.keys(), vec![lease.key.clone()]);
        assert!(!dir.path().join("envs").join(&key).exists());
    }
}
