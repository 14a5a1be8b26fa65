//! One node's share of one attempt: decide who it runs as, prepare the working directory
//! from the pinned snapshot (private to that identity), run `setup` then `run` through the
//! executor, stream output (with the task's secrets masked), keep its outputs (every
//! rank, however it ended: [`crate::outputs`]), and report how it ended.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tacc_compiler::{
    ChunkSource, DirChunkStore, INSTRUCTION_FORMAT, Instruction, Manifest, NodeContext,
};
use tacc_core::SnapshotId;
use tacc_exec::{ExecError, Executor, ExitOutcome, LaunchSpec, OutputLine, Placement};
use tacc_proto::{AgentReport, Assignment, AttemptOutcome, AttemptRef};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::now;
use crate::orphans::GroupRecord;
use crate::secrets::SecretMask;

/// Variables of the agent's own environment that tasks inherit.
const INHERITED_VARS: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TERM", "SHELL",
];

/// The node's caches of code: manifests by snapshot id, chunks by hash, whole files.
#[derive(Debug)]
pub(crate) struct SnapshotCache {
    manifests: Mutex<BTreeMap<SnapshotId, Arc<Manifest>>>,
    chunks: DirChunkStore,
    files: PathBuf,
}

impl SnapshotCache {
    pub fn open(data_dir: &Path) -> Result<Self, tacc_compiler::CompilerError> {
        Ok(SnapshotCache {
            manifests: Mutex::new(BTreeMap::new()),
            chunks: DirChunkStore::open(data_dir.join("chunks"))?,
            files: data_dir.join("files"),
        })
    }
}

/// Why an attempt could not start, as a snake_case reason and a message.
pub(crate) fn launch_failed(reason: &str, message: impl Into<String>) -> AttemptOutcome {
    AttemptOutcome::LaunchFailed {
        reason: reason.into(),
        message: message.into(),
    }
}

pub(crate) fn report(shared: &Shared, report: AgentReport) {
    let _ = shared.reports.send(report);
}

/// The name of an assignment's working directory under the agent's `work/`.
fn workdir_name(assignment: &Assignment) -> String {
    let attempt = assignment.attempt;
    format!(
        "{}-{}-r{}",
        attempt.task, attempt.attempt, assignment.node_rank
    )
}

/// Where an assignment's working directory lies (while its attempt runs here).
pub(crate) fn workdir_of(shared: &Shared, assignment: &Assignment) -> PathBuf {
    shared
        .config
        .data_dir
        .join("work")
        .join(workdir_name(assignment))
}

pub(crate) async fn run(shared: Arc<Shared>, assignment: Assignment, cancel: CancellationToken) {
    let attempt = assignment.attempt;
    let name = workdir_name(&assignment);
    let workdir = workdir_of(&shared, &assignment);
    // Once a process runs, cancelling is the executor's job (SIGTERM, grace, SIGKILL of
    // the group): dropping the future here would orphan the process.
    let mut failed_rank = None;
    let outcome = execute(
        &shared,
        &assignment,
        &workdir,
        &name,
        &cancel,
        &mut failed_rank,
    )
    .await;
    let outcome = if shared.fenced.lock().unwrap().remove(&attempt) {
        launch_failed(
            "node_fenced",
            format!(
                "node {} lost contact with the server and stopped the attempt itself, so that \
                 it never runs twice",
                shared.config.name
            ),
        )
    } else {
        outcome
    };
    // Nothing of the attempt may keep its GPUs from the next task.
    for text in crate::gpu_release::release(shared.gpus.as_ref(), attempt, &assignment.gpu_indices)
    {
        report(&shared, AgentReport::Log { attempt, text });
    }
    // No sample of the attempt may follow its end in the report stream.
    shared.sampling.end(attempt);
    shared.resizing.end(attempt);
    if !shared.config.keep_workdirs {
        let dir = workdir.clone();
        let _ = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
    }
    report(
        &shared,
        AgentReport::Finished {
            attempt,
            at: now(),
            outcome,
            rank: failed_rank,
        },
    );
}

/// Remove a working directory even where the code files in it are read-only.
fn remove_tree(dir: &Path) {
    if std::fs::remove_dir_all(dir).is_err() {
        let _ = std::process::Command::new("chmod")
            .arg("-R")
            .arg("u+w")
            .arg(dir)
            .status();
        let _ = std::fs::remove_dir_all(dir);
    }
}

async fn execute(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
    name: &str,
    cancel: &CancellationToken,
    failed_rank: &mut Option<u32>,
) -> AttemptOutcome {
    let instruction: Instruction = match serde_json::from_value(assignment.instruction.clone()) {
        Ok(instruction) => instruction,
        Err(e) => {
            return launch_failed(
                "bad_instruction",
                format!("this agent cannot read the instruction: {e}"),
            );
        }
    };
    if instruction.format_version > INSTRUCTION_FORMAT {
        return launch_failed(
            "bad_instruction",
            format!(
                "instruction format {} is not the agent's {INSTRUCTION_FORMAT}; upgrade the agent",
                instruction.format_version
            ),
        );
    }
    if let Err(message) = crate::secrets::check_names(&assignment.secrets) {
        return launch_failed("launch_failed", message);
    }
    // Never root: the mapped account, the user's own task uid, or (an agent that is not
    // root) the agent itself.
    let identity = match shared
        .identities
        .for_task(&instruction.user, instruction.unix_user.as_deref())
    {
        Ok(identity) => identity,
        Err(message) => return launch_failed("launch_failed", message),
    };
    let mask = Arc::new(SecretMask::new(assignment.secrets.values()));
    let started = Instant::now();
    let prepared = tokio::select! {
        prepared = prepare_workdir(shared, &instruction.snapshot, workdir) => prepared,
        // Cancelled while preparing: nothing is running yet.
        _ = cancel.cancelled() => return AttemptOutcome::Cancelled,
    };
    if let Err(message) = prepared {
        return launch_failed("snapshot_fetch_failed", message);
    }
    // From here on the working directory exists: whatever becomes of the attempt, its
    // outputs are kept once nothing runs any more.
    let outcome = run_in_workdir(
        shared,
        assignment,
        &instruction,
        &identity,
        mask,
        started,
        workdir,
        name,
        cancel,
        failed_rank,
    )
    .await;
    crate::outputs::keep(
        shared,
        &instruction,
        workdir,
        assignment.node_rank,
        &outcome,
    )
    .await;
    outcome
}

/// Everything after the working directory was built: datasets, environment, runtime,
/// `setup`, then `run`, to the attempt's end.
#[allow(clippy::too_many_arguments)]
async fn run_in_workdir(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    instruction: &Instruction,
    identity: &crate::identity::TaskIdentity,
    mask: Arc<SecretMask>,
    started: Instant,
    workdir: &Path,
    name: &str,
    cancel: &CancellationToken,
    failed_rank: &mut Option<u32>,
) -> AttemptOutcome {
    let attempt = assignment.attempt;
    // Preparation lines (dataset fetches, environment builds) go to the task's log, so a
    // failed build can be read with `tcloud logs`.
    let log_line = |line: String| {
        report(
            shared,
            AgentReport::Log {
                attempt,
                text: format!("{}\n", mask.apply(&line)),
            },
        )
    };
    // The user's directory on this node (their HOME when the account has none): private
    // to their identity, like the working directory.
    let userdir = shared
        .config
        .data_dir
        .join("users")
        .join(user_dir_name(&instruction.user));
    if let Err(e) = crate::layout::private_dir(&userdir, identity.run_as) {
        return launch_failed(
            "launch_failed",
            format!("cannot create {}: {e}", userdir.display()),
        );
    }
    let step = identity.step(&userdir);
    if !instruction.datasets.is_empty() {
        let mounted = tokio::select! {
            mounted = shared.datasets.mount_all(&instruction.datasets, workdir, &step, &log_line) => mounted,
            _ = cancel.cancelled() => return AttemptOutcome::Cancelled,
        };
        if let Err(message) = mounted {
            return launch_failed("dataset_fetch_failed", message);
        }
    }
    // Built by the agent so far, and unreachable by any task; now the task's own.
    if let Some(run_as) = identity.run_as {
        let dir = workdir.to_path_buf();
        let given = tokio::task::spawn_blocking(move || crate::layout::give_tree(&dir, run_as))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        if let Err(e) = given {
            return launch_failed(
                "launch_failed",
                format!(
                    "cannot hand the working directory {} to uid {}: {e}",
                    workdir.display(),
                    run_as.uid
                ),
            );
        }
    }
    // Held until the attempt ends: an environment in use is never evicted.
    let environment = match &instruction.environment {
        None => None,
        Some(wanted) => {
            let acquired = tokio::select! {
                acquired = shared.envs.acquire(wanted, workdir, &step, &log_line) => acquired,
                _ = cancel.cancelled() => return AttemptOutcome::Cancelled,
            };
            match acquired {
                Ok(lease) => Some(lease),
                Err(message) => return launch_failed("env_build_failed", message),
            }
        }
    };
    // Runtimes that failed to launch this attempt for an infrastructure reason.
    let mut failed_runtimes = BTreeMap::new();
    let mut runtime = match crate::runtimes::choose(shared, instruction, &failed_runtimes).await {
        Ok(choice) => choice,
        Err(message) => return launch_failed("runtime_unavailable", message),
    };
    report(shared, AgentReport::Started { attempt, at: now() });
    shared.sampling.begin(
        attempt,
        assignment.node_rank,
        assignment.gpu_indices.clone(),
        now(),
    );
    shared
        .resizing
        .begin(attempt, instruction.processes_per_node.max(1));
    crate::runtimes::announce(shared, attempt, &runtime);

    let node = NodeContext {
        node_rank: assignment.node_rank,
        local_rank: 0,
        gpu_indices: assignment.gpu_indices.clone(),
        master_addr: assignment.master_addr.clone(),
        master_port: assignment.master_port,
        workdir: workdir.to_path_buf(),
        userdir,
    };
    let mut base: BTreeMap<String, String> = INHERITED_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    base.extend(identity.vars(&node.userdir));
    let processes = instruction.processes_per_node.max(1);
    let env_of = |local_rank: u32| {
        let node = NodeContext {
            local_rank,
            ..node.clone()
        };
        let mut env = instruction.environment(&node, &base);
        if let Some(lease) = &environment {
            activate(&mut env, lease);
        }
        crate::secrets::inject(&mut env, &assignment.secrets);
        env
    };
    let env = env_of(0);
    // Lines carry the process's RANK wherever there is more than one.
    let several = instruction.num_nodes * processes > 1;
    let lines_of = |rank: u32| LogLines {
        prefix: several.then(|| format!("[{rank}] ")),
        mask: mask.clone(),
    };
    let lines = lines_of(assignment.node_rank * processes);
    let limit = instruction.time_limit_secs.map(Duration::from_secs);
    let remaining = |limit: Option<Duration>| limit.map(|l| l.saturating_sub(started.elapsed()));
    let grace = shared
        .lease
        .cap_grace(Duration::from_secs(instruction.kill_grace_secs));
    let data_dir = &shared.config.data_dir;
    let placement = Placement {
        image: instruction.image.clone(),
        cpu_millis: instruction.per_node.cpu_millis,
        memory_bytes: instruction.per_node.memory_bytes,
        gpu_indices: assignment.gpu_indices.clone(),
        // Paths the environment names outside the working directory.
        extra_mounts: vec![
            (node.userdir.clone(), true),
            (data_dir.join("datasets"), false),
            (data_dir.join("envs"), false),
        ],
        owner: Some((attempt.task, attempt.attempt, assignment.node_rank)),
        run_as: identity.run_as,
    };

    if let Some(setup) = &instruction.setup {
        let spec = LaunchSpec {
            label: format!("tacc-setup-{name}"),
            workdir: workdir.to_path_buf(),
            script: setup.clone(),
            env: env.clone(),
            time_limit: remaining(limit),
            kill_grace: grace,
            placement: placement.clone(),
        };
        match crate::runtimes::launch_with_failover(
            shared,
            instruction,
            &mut runtime,
            &mut failed_runtimes,
            spec,
            attempt,
            lines.clone(),
            cancel,
            &format!("{name}-setup"),
        )
        .await
        {
            Ok(ExitOutcome::Exited(0)) => {}
            Ok(ExitOutcome::Exited(code)) => {
                return launch_failed("setup_failed", format!("setup exited with code {code}"));
            }
            Ok(ExitOutcome::Signalled(signal)) => {
                return launch_failed(
                    "setup_failed",
                    format!("setup was killed by signal {signal}"),
                );
            }
            Ok(other) => return outcome_of(other),
            Err(outcome) => return outcome,
        }
    }
    if cancel.is_cancelled() {
        return AttemptOutcome::Cancelled;
    }
    if processes > 1 {
        let launches = (0..processes)
            .map(|local_rank| {
                let rank = assignment.node_rank * processes + local_rank;
                crate::processes::RankLaunch {
                    rank,
                    spec: LaunchSpec {
                        label: format!("tacc-{name}-p{local_rank}"),
                        workdir: workdir.to_path_buf(),
                        script: instruction.run.clone(),
                        env: env_of(local_rank),
                        time_limit: remaining(limit),
                        kill_grace: grace,
                        placement: Placement {
                            cpu_millis: crate::processes::share_of(placement.cpu_millis, processes),
                            memory_bytes: crate::processes::share_of(
                                placement.memory_bytes,
                                processes,
                            ),
                            ..placement.clone()
                        },
                    },
                    lines: lines_of(rank),
                    record_name: format!("{name}-p{local_rank}"),
                }
            })
            .collect();
        let executor = crate::runtimes::executor(shared, runtime.runtime);
        let ended =
            match crate::processes::run_ranks(shared, executor, attempt, launches, cancel).await {
                Ok(ended) => ended,
                Err(outcome) => return outcome,
            };
        *failed_rank = ended.failed_rank;
        outcome_of(ended.outcome)
    } else {
        let spec = LaunchSpec {
            label: format!("tacc-{name}"),
            workdir: workdir.to_path_buf(),
            script: instruction.run.clone(),
            env,
            time_limit: remaining(limit),
            kill_grace: grace,
            placement,
        };
        match crate::runtimes::launch_with_failover(
            shared,
            instruction,
            &mut runtime,
            &mut failed_runtimes,
            spec,
            attempt,
            lines,
            cancel,
            name,
        )
        .await
        {
            Ok(outcome) => outcome_of(outcome),
            Err(outcome) => outcome,
        }
    }
}

/// Put the environment's `bin` first on PATH and set its marker variable, as `activate` does.
fn activate(env: &mut BTreeMap<String, String>, lease: &crate::environments::EnvLease) {
    let path = match env.get("PATH") {
        Some(path) if !path.is_empty() => format!("{}:{path}", lease.bin_dir.display()),
        _ => lease.bin_dir.display().to_string(),
    };
    env.insert("PATH".into(), path);
    env.remove("PYTHONHOME");
    env.extend(lease.vars.clone());
}

pub(crate) fn outcome_of(outcome: ExitOutcome) -> AttemptOutcome {
    match outcome {
        ExitOutcome::Exited(code) => AttemptOutcome::Exited { code },
        ExitOutcome::Signalled(signal) => AttemptOutcome::Signalled { signal },
        ExitOutcome::TimeLimit => AttemptOutcome::TimeLimit,
        ExitOutcome::Cancelled => AttemptOutcome::Cancelled,
        ExitOutcome::Infrastructure { reason, message } => {
            AttemptOutcome::LaunchFailed { reason, message }
        }
    }
}

/// How a task's output lines are written into its log: the node's prefix in a
/// multi-node attempt, and the task's secret values masked.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogLines {
    pub prefix: Option<String>,
    pub mask: Arc<SecretMask>,
}

impl LogLines {
    fn format(&self, line: &str) -> String {
        let line = self.mask.apply(line);
        let mut text = String::with_capacity(line.len() + 8);
        if let Some(prefix) = &self.prefix {
            text.push_str(prefix);
        }
        text.push_str(&line);
        text.push('\n');
        text
    }
}

/// Run one script to its end, forwarding its output; `Err` when it could not start.
pub(crate) async fn launch(
    shared: &Arc<Shared>,
    executor: &dyn Executor,
    spec: LaunchSpec,
    attempt: AttemptRef,
    lines: LogLines,
    cancel: &CancellationToken,
    record_name: &str,
) -> Result<ExitOutcome, ExecError> {
    let (tx, mut rx) = mpsc::unbounded_channel::<OutputLine>();
    let handle = executor.launch(spec, tx).await?;
    let _record = handle.pid.and_then(|pid| {
        GroupRecord::write(&shared.config.data_dir.join("run"), record_name, pid).ok()
    });
    if let Some(reader) = handle.usage_reader() {
        shared
            .sampling
            .attach(attempt, record_name, reader, Instant::now());
    }
    if let Some(resizer) = handle.resizer() {
        shared.resizing.attach(attempt, record_name, resizer);
    }
    let output_clock = shared.sampling.output_clock(attempt);
    let forwarder = {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if let Some(clock) = &output_clock {
                    clock.store(now().0, std::sync::atomic::Ordering::Relaxed);
                }
                let text = lines.format(&line.text);
                report(&shared, AgentReport::Log { attempt, text });
            }
        })
    };
    let stop = handle.cancel_token();
    let wait = handle.wait();
    tokio::pin!(wait);
    let outcome = tokio::select! {
        outcome = &mut wait => outcome,
        _ = cancel.cancelled() => {
            stop.cancel();
            wait.await
        }
    };
    shared.sampling.detach(attempt, record_name);
    shared.resizing.detach(attempt, record_name);
    // Every line is forwarded before the attempt's end is reported.
    let _ = forwarder.await;
    Ok(outcome)
}

/// The name of a user's directory under `users/`: the user name where it is a plain file
/// name, else a cleaned form with a hash of the real name (two users never share one).
fn user_dir_name(user: &str) -> String {
    let clean: String = user
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == user && !clean.is_empty() && !clean.starts_with('.') {
        return clean;
    }
    let hash = blake3::hash(user.as_bytes()).to_hex();
    let visible = clean
        .strip_prefix('.')
        .map_or(clean.clone(), |rest| format!("_{rest}"));
    format!("{visible}-{}", &hash[..12])
}

/// Build the working directory from the snapshot, fetching only chunks this node lacks.
async fn prepare_workdir(
    shared: &Arc<Shared>,
    snapshot: &SnapshotId,
    workdir: &Path,
) -> Result<(), String> {
    let cached = shared
        .snapshots
        .manifests
        .lock()
        .unwrap()
        .get(snapshot)
        .cloned();
    let manifest = match cached {
        Some(manifest) => manifest,
        None => {
            let value = shared
                .client
                .get_snapshot(snapshot)
                .await
                .map_err(|e| format!("cannot fetch snapshot {snapshot}: {e}"))?;
            let manifest: Manifest = serde_json::from_value(value)
                .map_err(|e| format!("snapshot {snapshot} is malformed: {e}"))?;
            if manifest.id() != *snapshot {
                return Err(format!(
                    "snapshot {snapshot} does not match its id; refusing to run it"
                ));
            }
            let manifest = Arc::new(manifest);
            shared
                .snapshots
                .manifests
                .lock()
                .unwrap()
                .insert(snapshot.clone(), manifest.clone());
            manifest
        }
    };
    for hash in manifest.chunk_set() {
        if shared.snapshots.chunks.has(&hash) {
            continue;
        }
        let bytes = shared
            .client
            .get_chunk(&hash.to_string())
            .await
            .map_err(|e| format!("cannot fetch chunk {hash}: {e}"))?;
        shared
            .snapshots
            .chunks
            .put(&hash, &bytes)
            .map_err(|e| format!("chunk {hash}: {e}"))?;
    }
    if workdir.symlink_metadata().is_ok() {
        let dir = workdir.to_path_buf();
        let _ = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
    }
    // Private from the start: nobody but the agent may enter it until it is handed over.
    std::fs::DirBuilder::new()
        .mode(crate::layout::PRIVATE_DIR_MODE)
        .create(workdir)
        .map_err(|e| format!("cannot create {}: {e}", workdir.display()))?;
    let shared = shared.clone();
    let workdir = workdir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let source: &dyn ChunkSource = &shared.snapshots.chunks;
        // Hard links share one inode between working directories; only a task that is
        // not the cache's owner is stopped by the read-only mode from writing through
        // them, so an agent running as root (whose tasks get the tree as their own, to
        // write in) makes copies.
        let result = if nix::unistd::geteuid().is_root() {
            tacc_compiler::materialize(&manifest, source, &workdir)
        } else {
            tacc_compiler::materialize_cached(&manifest, source, &shared.snapshots.files, &workdir)
        };
        result
            .map(|_| ())
            .map_err(|e| format!("cannot build the working directory: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_directories_never_collide_or_escape() {
        assert_eq!(user_dir_name("alice"), "alice");
        assert_eq!(user_dir_name("a.b-c_d"), "a.b-c_d");
        let slashed = user_dir_name("a/b");
        let underscored = user_dir_name("a_b");
        assert_ne!(slashed, underscored);
        assert!(slashed.starts_with("a_b-"), "{slashed}");
        for odd in ["..", ".", "", "../etc"] {
            let name = user_dir_name(odd);
            assert!(
                !name.starts_with('.') && !name.contains('/'),
                "{odd}: {name}"
            );
            assert!(name.len() > 12, "{odd}: {name}");
        }
    }

    #[test]
    fn log_lines_are_masked_then_prefixed() {
        let secrets = ["s3cr3t-value".to_string()];
        let lines = LogLines {
            prefix: Some("[1] ".into()),
            mask: Arc::new(SecretMask::new(&secrets)),
        };
        assert_eq!(lines.format("key=s3cr3t-value"), "[1] key=***\n");
        assert_eq!(LogLines::default().format("plain"), "plain\n");
    }
}
