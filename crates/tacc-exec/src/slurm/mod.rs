//! The Slurm backend: an agent on a Slurm login node runs each attempt as one Slurm batch
//! job across the whole allocation.
//!
//! Design (see docs/BACKENDS.md): the agent registers one TACC node per Slurm node, each
//! with its own [`SlurmExecutor`] sharing one [`SlurmBackend`]. TACC's scheduler places a
//! gang on those nodes as on any cluster; the backend collects the launches of all ranks
//! of one attempt (a *gang*), and when the last rank arrives submits ONE `sbatch` job
//! pinned to exactly those nodes. Inside the job, `srun` starts one task per node; each
//! task loads its rank's environment and writes its output to per-rank files on the
//! shared file system, which the rank's handle tails back to the agent live.
//!
//! Every job carries `--comment tacc:<tag>/<gang>` so that a restarted agent re-finds
//! its jobs ([`SlurmBackend::recover`]) instead of submitting them twice.

pub mod pilot;
mod script;
pub mod status;
mod stop;
mod tail;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tacc_core::{AttemptNo, TaskId};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

pub use script::SubmitOptions;
use status::{JobPhase, JobStatus, SlurmNode};
use stop::StopPolicy;
use tail::Tail;

use crate::{
    ExecError, ExecutionHandle, Executor, ExitOutcome, LaunchSpec, OutputLine, OutputSender, Phase,
    RecoveredExecution, Stream, handle_parts,
};

/// How long the ranks of one gang may take to all arrive before the gang gives up.
const GANG_ASSEMBLY_LIMIT: Duration = Duration::from_secs(600);
/// A job pending longer than this gets a line in the task's log saying why.
const PENDING_NOTICE_AFTER: Duration = Duration::from_secs(2);
/// How often a running job's exit files are looked for (a few `stat`s per job).
const EXIT_FILE_CHECK: Duration = Duration::from_millis(20);
/// A job Slurm never listed this long after `sbatch` answered is considered lost.
const UNSEEN_JOB_LIMIT: Duration = Duration::from_secs(60);

/// How the operator's Slurm is used.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// Where gang files (scripts, per-rank environments, per-rank logs) live. Must be on a
    /// file system every Slurm node shares with the login node, like the agent's data dir.
    pub state_dir: PathBuf,
    /// Marks this TACC installation's jobs (`--comment tacc:<tag>/…`); unique per server.
    pub tag: String,
    /// Partition to submit to and to offer (default: Slurm's default, all nodes).
    pub partition: Option<String>,
    /// TACC user → Slurm account; `*` is the fallback. Without a match no `--account`.
    pub accounts: BTreeMap<String, String>,
    /// TACC priority (`low`, `normal`, `high`) → Slurm QoS.
    pub qos: BTreeMap<String, String>,
    /// How often job states are read from Slurm.
    pub poll_interval: Duration,
    /// Read `squeue` as JSON when this Slurm offers it (text otherwise).
    pub prefer_json: bool,
}

impl SlurmConfig {
    pub fn new(state_dir: PathBuf, tag: impl Into<String>) -> Self {
        SlurmConfig {
            state_dir,
            tag: tag.into(),
            partition: None,
            accounts: BTreeMap::new(),
            qos: BTreeMap::new(),
            poll_interval: Duration::from_millis(250),
            prefer_json: true,
        }
    }
}

/// What is known about every job of ours, refreshed by one poller for the whole backend.
type JobTable = Arc<HashMap<u64, JobStatus>>;

/// One Slurm cluster as seen from its login node; shared by the per-node executors.
#[derive(Debug)]
pub struct SlurmBackend {
    config: SlurmConfig,
    json: bool,
    gangs: Mutex<HashMap<String, Gang>>,
    jobs: watch::Receiver<JobTable>,
    recovered: Mutex<BTreeMap<String, Vec<RecoveredExecution>>>,
    shutdown: CancellationToken,
}

impl Drop for SlurmBackend {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Ranks of one attempt gathering before their job is submitted.
#[derive(Debug)]
struct Gang {
    expected: u32,
    ranks: BTreeMap<u32, RankSlot>,
    /// Fires once the gang is submitted (or given up): waiting ranks stop watching.
    closed: CancellationToken,
}

#[derive(Debug)]
struct RankSlot {
    node: String,
    spec: LaunchSpec,
    output: OutputSender,
    exit: oneshot::Sender<ExitOutcome>,
    cancel: CancellationToken,
    /// The job's id, for sessions into the rank, once the gang is submitted.
    job: Arc<std::sync::OnceLock<u64>>,
}

/// The launch's place in its gang, from its typed owner and phase.
#[derive(Debug, Clone)]
struct GangMember {
    key: String,
    rank: u32,
    size: u32,
}

impl GangMember {
    fn of(spec: &LaunchSpec) -> Self {
        let owner = &spec.owner;
        // One gang per attempt, phase and local process: the same script on every node.
        let phase = match spec.phase {
            Phase::Setup => "setup-",
            Phase::Run => "",
        };
        let mut key = format!("tacc-{phase}{}-{}", owner.task, owner.attempt);
        if owner.local_rank > 0 {
            key.push_str(&format!("-p{}", owner.local_rank));
        }
        GangMember {
            key,
            rank: owner.node_rank,
            size: owner.num_nodes.max(1),
        }
    }
}

impl SlurmBackend {
    /// Check that Slurm answers, start the job poller, and re-find the jobs a previous
    /// life of this agent submitted.
    pub async fn start(config: SlurmConfig) -> Result<Arc<SlurmBackend>, ExecError> {
        std::fs::create_dir_all(config.state_dir.join("gangs")).map_err(|source| {
            ExecError::Slurm(format!(
                "cannot create {}: {source}",
                config.state_dir.display()
            ))
        })?;
        slurm_command("squeue", &["-h", "-o", "%i", "-j", "0"])
            .await
            .or_else(|e| {
                // `-j 0` is an invalid id on some versions; only a missing command matters.
                if e.to_string().contains("cannot run") {
                    Err(e)
                } else {
                    Ok(String::new())
                }
            })?;
        let json = config.prefer_json
            && slurm_command("squeue", &["--json", "-h", "-t", "all", "--me"])
                .await
                .ok()
                .and_then(|text| status::parse_squeue_json(&text))
                .is_some();
        let first = read_jobs(json).await.unwrap_or_default();
        let (jobs_tx, jobs_rx) = watch::channel(Arc::new(first));
        let shutdown = CancellationToken::new();
        tokio::spawn(poll_jobs(
            json,
            config.poll_interval,
            jobs_tx,
            shutdown.clone(),
        ));
        let backend = Arc::new(SlurmBackend {
            config,
            json,
            gangs: Mutex::new(HashMap::new()),
            jobs: jobs_rx,
            recovered: Mutex::new(BTreeMap::new()),
            shutdown,
        });
        backend.recover().await;
        Ok(backend)
    }

    /// Whether job states are read as JSON (else as text).
    pub fn reads_json(&self) -> bool {
        self.json
    }

    /// The nodes of the configured partition (or all), with what they offer.
    pub async fn discover_nodes(&self) -> Result<Vec<SlurmNode>, ExecError> {
        let mut args: Vec<&str> = Vec::new();
        if let Some(partition) = &self.config.partition {
            args.extend(["-p", partition]);
        }
        let json_args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
        let nodes = match slurm_command("sinfo", &json_args).await {
            Ok(text) => status::parse_sinfo_json(&text),
            Err(_) => None,
        };
        let mut nodes = match nodes {
            Some(nodes) => nodes,
            None => {
                let text_args: Vec<&str> = args
                    .iter()
                    .copied()
                    .chain(["-h", "-N", "-o", status::SINFO_TEXT_FORMAT])
                    .collect();
                status::parse_sinfo_text(&slurm_command("sinfo", &text_args).await?)
            }
        };
        if let Some(partition) = &self.config.partition {
            nodes.retain(|n| n.partitions.is_empty() || n.partitions.contains(partition));
        }
        Ok(nodes)
    }

    /// The partition this backend's jobs go to: the configured one, else Slurm's default
    /// partition, if Slurm names one.
    pub async fn submit_partition(&self) -> Result<Option<String>, ExecError> {
        if let Some(partition) = &self.config.partition {
            return Ok(Some(partition.clone()));
        }
        let text = slurm_command("sinfo", &["-h", "-o", "%P"]).await?;
        Ok(status::default_partition(&text))
    }

    /// The executor for one Slurm node (one TACC node).
    pub fn executor_for(self: &Arc<Self>, node: &str) -> SlurmExecutor {
        SlurmExecutor {
            backend: self.clone(),
            node: node.to_string(),
        }
    }

    fn gang_dir(&self, gang: &str) -> PathBuf {
        self.config.state_dir.join("gangs").join(gang)
    }

    fn comment_prefix(&self) -> String {
        format!("tacc:{}/", self.config.tag)
    }

    async fn launch_rank(
        self: &Arc<Self>,
        node: &str,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError> {
        let member = GangMember::of(&spec);
        let gang_name = format!("{}-{}", self.config.tag, member.key);
        let (cancel, exit_tx, exit_rx) = handle_parts();
        // Sessions (`tcloud exec`, `shell`) enter the rank as a step of its job.
        let job = Arc::new(std::sync::OnceLock::new());
        let entry = crate::enter::Entry {
            pid: 0,
            cgroup: None,
            workdir: spec.workdir.clone(),
            env: spec.env.clone(),
            run_as: None,
            private_mounts: false,
            via: crate::enter::Via::Slurm {
                job: job.clone(),
                node: node.to_string(),
            },
        };
        let handle = ExecutionHandle::new(None, cancel.clone(), exit_rx).with_entry(Some(entry));
        let slot = RankSlot {
            node: node.to_string(),
            spec,
            output,
            exit: exit_tx,
            cancel: cancel.clone(),
            job,
        };
        let complete = {
            let mut gangs = self.gangs.lock().unwrap();
            let gang = gangs.entry(gang_name.clone()).or_insert_with(|| Gang {
                expected: member.size,
                ranks: BTreeMap::new(),
                closed: CancellationToken::new(),
            });
            gang.ranks.insert(member.rank, slot);
            if gang.ranks.len() as u32 >= gang.expected {
                gangs.remove(&gang_name)
            } else {
                self.watch_waiting_rank(&gang_name, member.rank, gang.closed.clone(), cancel);
                None
            }
        };
        if let Some(gang) = complete {
            gang.closed.cancel();
            self.submit(gang_name, gang.ranks).await?;
        }
        Ok(handle)
    }

    /// A rank waiting for the rest of its gang can be cancelled, or give up.
    fn watch_waiting_rank(
        self: &Arc<Self>,
        gang_name: &str,
        rank: u32,
        closed: CancellationToken,
        cancel: CancellationToken,
    ) {
        let backend = self.clone();
        let gang_name = gang_name.to_string();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                _ = closed.cancelled() => return,
                _ = cancel.cancelled() => ExitOutcome::Cancelled,
                _ = tokio::time::sleep(GANG_ASSEMBLY_LIMIT) => ExitOutcome::Infrastructure {
                    reason: "gang_incomplete".into(),
                    message: format!("not every node of the task was started within {GANG_ASSEMBLY_LIMIT:?}"),
                },
            };
            let slot = {
                let mut gangs = backend.gangs.lock().unwrap();
                let slot = gangs
                    .get_mut(&gang_name)
                    .and_then(|gang| gang.ranks.remove(&rank));
                if gangs.get(&gang_name).is_some_and(|g| g.ranks.is_empty()) {
                    gangs.remove(&gang_name);
                }
                slot
            };
            if let Some(slot) = slot {
                let _ = slot.exit.send(outcome);
            }
        });
    }

    /// Write the gang's files and `sbatch` it; the supervisor takes it from there.
    async fn submit(
        self: &Arc<Self>,
        gang_name: String,
        ranks: BTreeMap<u32, RankSlot>,
    ) -> Result<(), ExecError> {
        // Each submission gets a directory (and comment) of its own: a gang of the same
        // task phase submitted again must not find the files of the last one, nor have
        // them removed under it by the last one's clean-up.
        let job_name = format!("{gang_name}-{}", submission_suffix());
        let dir = self.gang_dir(&job_name);
        let first = ranks.values().next().expect("a gang has a rank");
        let options = SubmitOptions::from_spec(
            &first.spec,
            ranks.len() as u32,
            ranks.values().map(|r| r.node.clone()).collect(),
            &self.config,
            &job_name,
        );
        let prepared = script::write_gang(
            &dir,
            &options,
            ranks.iter().map(|(rank, slot)| (*rank, &slot.spec)),
        );
        if let Err(e) = prepared {
            let message = format!("cannot write the job files in {}: {e}", dir.display());
            return Err(fail_ranks(ranks, ExecError::Slurm(message)));
        }
        let args = options.sbatch_args(&dir);
        let backend = self.clone();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let submitted = slurm_command("sbatch", &arg_refs).await.and_then(|text| {
            // `--parsable` prints `id` or `id;cluster`.
            text.trim()
                .split(';')
                .next()
                .and_then(|id| id.parse::<u64>().ok())
                .ok_or_else(|| ExecError::Slurm(format!("sbatch printed no job id: {text}")))
        });
        let job_id = match submitted {
            Ok(id) => id,
            Err(error) => return Err(fail_ranks(ranks, error)),
        };
        let _ = std::fs::write(dir.join("job_id"), job_id.to_string());
        for slot in ranks.values() {
            let _ = slot.job.set(job_id);
        }
        let time_limit = first.spec.time_limit;
        let stop = StopPolicy {
            signal: first.spec.stop_signal,
            grace: first.spec.kill_grace,
        };
        let slots = ranks
            .into_iter()
            .map(|(rank, slot)| SupervisedRank {
                rank,
                output: slot.output,
                exit: Some(slot.exit),
                cancel: slot.cancel,
                tail: Tail::resume(&dir, rank),
            })
            .collect();
        tokio::spawn(backend.supervise(job_id, dir, slots, time_limit, stop, false));
        Ok(())
    }

    /// Re-find the jobs of a previous life: each gang still in Slurm gets a supervisor
    /// again, and its ranks wait in [`Self::recovered`] for their node's agent.
    async fn recover(self: &Arc<Self>) {
        let jobs = self.jobs.borrow().clone();
        let prefix = self.comment_prefix();
        for job in jobs.values() {
            let Some(gang_name) = job.comment.strip_prefix(&prefix) else {
                continue;
            };
            let dir = self.gang_dir(gang_name);
            let Ok(manifest) = script::GangManifest::read(&dir) else {
                continue; // finished and cleaned up
            };
            if manifest.phase != "run" {
                // A setup step cannot be resumed mid-way: stop it; the attempt is retried.
                let _ = slurm_command("scancel", &[&job.job_id.to_string()]).await;
                remove_gang_dir(&dir);
                continue;
            }
            let mut slots = Vec::new();
            for member in &manifest.ranks {
                let (cancel, exit_tx, exit_rx) = handle_parts();
                let (out_tx, out_rx) = crate::output_channel();
                slots.push(SupervisedRank {
                    rank: member.rank,
                    output: out_tx,
                    exit: Some(exit_tx),
                    cancel: cancel.clone(),
                    tail: Tail::resume(&dir, member.rank),
                });
                let recovered = RecoveredExecution {
                    task: TaskId(manifest.task),
                    attempt: AttemptNo(manifest.attempt),
                    node_rank: member.rank,
                    num_nodes: manifest.ranks.len() as u32,
                    handle: ExecutionHandle::new(None, cancel, exit_rx),
                    output: out_rx,
                };
                self.recovered
                    .lock()
                    .unwrap()
                    .entry(member.node.clone())
                    .or_default()
                    .push(recovered);
            }
            tracing::info!(
                "re-found slurm job {} (task {} attempt {})",
                job.job_id,
                manifest.task,
                manifest.attempt
            );
            let limit = manifest.time_limit_secs.map(Duration::from_secs);
            let stop = manifest.stop_policy();
            tokio::spawn(
                self.clone()
                    .supervise(job.job_id, dir, slots, limit, stop, true),
            );
        }
    }

    /// Follow one job to its end: tail every rank's output, enforce the time limit,
    /// carry out cancel (stop signal, grace, then `scancel`), and give each rank its
    /// outcome.
    async fn supervise(
        self: Arc<Self>,
        job_id: u64,
        dir: PathBuf,
        mut ranks: Vec<SupervisedRank>,
        time_limit: Option<Duration>,
        stop: StopPolicy,
        recovered: bool,
    ) {
        let mut jobs = self.jobs.clone();
        let submitted = Instant::now();
        let mut seen = recovered;
        let mut started: Option<Instant> = None;
        let mut pending_reason = String::new();
        let mut pending_since: Option<Instant> = None;
        let mut stopping: Option<ExitOutcome> = None;
        // When the grace after the stop signal runs out, until the job is cancelled.
        let mut kill_at: Option<Instant> = None;
        let mut ended_by_exit_files = false;
        let final_status = loop {
            for rank in &mut ranks {
                rank.tail.forward(&rank.output, false).await;
            }
            let current = jobs.borrow_and_update().get(&job_id).cloned();
            if stopping.is_none() {
                if ranks.iter().any(|r| r.cancel.is_cancelled()) {
                    stopping = Some(ExitOutcome::Cancelled);
                } else if let (Some(limit), Some(at)) = (time_limit, started) {
                    if at.elapsed() >= limit {
                        stopping = Some(ExitOutcome::TimeLimit);
                    }
                }
                if stopping.is_some() {
                    // `node.sh` creates a rank's output file as it starts the task:
                    // before that there is no process to save anything.
                    let task_started = ranks
                        .iter()
                        .any(|r| dir.join(format!("out-{}.log", r.rank)).exists());
                    kill_at = Some(signal_job(job_id, stop, task_started).await);
                }
            }
            if kill_at.is_some_and(|at| Instant::now() >= at) {
                kill_at = None;
                let _ = slurm_command("scancel", &[&job_id.to_string()]).await;
            }
            // Each rank's script writes its exit file after its last output: once all are
            // there the attempt is over, without waiting for the next squeue poll (also
            // when a task ends within its grace: it keeps the outcome of the stop).
            if ranks
                .iter()
                .all(|r| dir.join(format!("exit-{}", r.rank)).exists())
            {
                ended_by_exit_files = true;
                break None;
            }
            match &current {
                Some(job) => {
                    seen = true;
                    match status::phase_of(&job.state) {
                        JobPhase::Pending => {
                            // Only a real wait is worth a line in the task's log.
                            let waiting = pending_since.get_or_insert_with(Instant::now).elapsed();
                            if waiting >= PENDING_NOTICE_AFTER
                                && !matches!(job.reason.as_str(), "" | "None")
                                && job.reason != pending_reason
                            {
                                pending_reason = job.reason.clone();
                                if let Some(rank) = ranks.first() {
                                    let _ = rank
                                        .output
                                        .send(OutputLine {
                                            stream: Stream::Stderr,
                                            text: format!(
                                                "tacc: slurm job {job_id} is pending ({})",
                                                job.reason
                                            ),
                                            partial: false,
                                        })
                                        .await;
                                }
                            }
                        }
                        JobPhase::Running => {
                            started.get_or_insert_with(Instant::now);
                        }
                        _ => break Some(job.clone()),
                    }
                }
                None if seen || submitted.elapsed() > UNSEEN_JOB_LIMIT => break None,
                None => {}
            }
            tokio::select! {
                _ = jobs.changed() => {}
                _ = tokio::time::sleep(self.config.poll_interval.min(EXIT_FILE_CHECK)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        };
        if !ended_by_exit_files {
            // Slurm may report the end a moment before the last bytes reach the shared disk.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for rank in &mut ranks {
            rank.tail.forward(&rank.output, true).await;
        }
        for rank in &mut ranks {
            let outcome = match (&stopping, &final_status) {
                (Some(outcome), _) => outcome.clone(),
                (None, Some(job)) => outcome_of_job(job, read_exit_file(&dir, rank.rank)),
                (None, None) => match read_exit_file(&dir, rank.rank) {
                    Some(code) => ExitOutcome::Exited(code),
                    None => ExitOutcome::Infrastructure {
                        reason: "lost".into(),
                        message: format!("slurm no longer knows job {job_id}"),
                    },
                },
            };
            if let Some(exit) = rank.exit.take() {
                let _ = exit.send(outcome);
            }
        }
        remove_gang_dir(&dir);
    }
}

/// Deliver the stop signal to the processes of a job whose task has started; when the
/// grace runs out. A task not started yet has nothing to save, and an uncatchable
/// signal or one Slurm will not deliver gives it no chance to: the job is cancelled now.
/// Whether the task started is not read from the last `squeue`, which may not show a
/// job running whose task has already printed; asking Slurm to signal a job that is
/// still pending makes `scancel` retry for a minute before it gives up.
async fn signal_job(job_id: u64, stop: StopPolicy, task_started: bool) -> Instant {
    if !task_started || !stop.catchable() {
        return Instant::now();
    }
    let args = stop.scancel_signal_args(job_id);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    match slurm_command("scancel", &arg_refs).await {
        Ok(_) => Instant::now() + stop.grace,
        Err(error) => {
            tracing::info!("slurm job {job_id} not signalled, cancelling it now: {error}");
            Instant::now()
        }
    }
}

fn fail_ranks(ranks: BTreeMap<u32, RankSlot>, error: ExecError) -> ExecError {
    for slot in ranks.into_values() {
        let _ = slot.exit.send(ExitOutcome::Infrastructure {
            reason: "launch_failed".into(),
            message: error.to_string(),
        });
    }
    error
}

/// Unique per submission, also across restarts of the agent: milliseconds since the epoch
/// and a counter, in hex.
fn submission_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{millis:x}{count:x}")
}

fn remove_gang_dir(dir: &Path) {
    // For debugging a backend problem: keep scripts and per-rank logs of ended jobs.
    if std::env::var_os("TACC_SLURM_KEEP_JOB_FILES").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn read_exit_file(dir: &Path, rank: u32) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("exit-{rank}")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How a job that ended by itself ended for one rank.
fn outcome_of_job(job: &JobStatus, rank_exit: Option<i32>) -> ExitOutcome {
    match status::phase_of(&job.state) {
        JobPhase::Completed => match rank_exit.or(job.exit_code) {
            Some(code) => ExitOutcome::Exited(code),
            None if job.state == "COMPLETED" => ExitOutcome::Exited(0),
            None => ExitOutcome::Exited(1),
        },
        JobPhase::TimeLimit => ExitOutcome::TimeLimit,
        JobPhase::Cancelled => ExitOutcome::Infrastructure {
            reason: "cancelled_in_slurm".into(),
            message: format!(
                "slurm job {} was cancelled outside TACC ({})",
                job.job_id, job.reason
            ),
        },
        JobPhase::Infrastructure(reason) => ExitOutcome::Infrastructure {
            reason: reason.into(),
            message: format!(
                "slurm job {} ended {} ({})",
                job.job_id, job.state, job.reason
            ),
        },
        JobPhase::Pending | JobPhase::Running => ExitOutcome::Infrastructure {
            reason: "lost".into(),
            message: format!("slurm job {} in state {}", job.job_id, job.state),
        },
    }
}

#[derive(Debug)]
struct SupervisedRank {
    rank: u32,
    output: OutputSender,
    exit: Option<oneshot::Sender<ExitOutcome>>,
    cancel: CancellationToken,
    tail: Tail,
}

/// Run a Slurm command with an argument list; its stdout, or what went wrong.
async fn slurm_command(program: &str, args: &[&str]) -> Result<String, ExecError> {
    let output = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| ExecError::Slurm(format!("cannot run `{program}`: {e}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(ExecError::Slurm(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

async fn read_jobs(json: bool) -> Result<HashMap<u64, JobStatus>, ExecError> {
    let jobs = if json {
        let text = slurm_command("squeue", &["--json", "-t", "all"]).await?;
        status::parse_squeue_json(&text)
            .ok_or_else(|| ExecError::Slurm("squeue --json printed no job list".into()))?
    } else {
        let text = slurm_command(
            "squeue",
            &["-h", "-t", "all", "-o", status::SQUEUE_TEXT_FORMAT],
        )
        .await?;
        status::parse_squeue_text(&text)
    };
    Ok(jobs.into_iter().map(|job| (job.job_id, job)).collect())
}

/// One poller for the whole backend, however many jobs run.
async fn poll_jobs(
    json: bool,
    interval: Duration,
    jobs: watch::Sender<JobTable>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match read_jobs(json).await {
            Ok(table) => {
                let _ = jobs.send(Arc::new(table));
            }
            Err(e) => tracing::warn!("cannot read job states from slurm: {e}"),
        }
    }
}

/// Runs the launches of one TACC node through the shared [`SlurmBackend`].
#[derive(Debug, Clone)]
pub struct SlurmExecutor {
    backend: Arc<SlurmBackend>,
    node: String,
}

#[async_trait::async_trait]
impl Executor for SlurmExecutor {
    fn kind(&self) -> crate::RuntimeKind {
        crate::RuntimeKind::Slurm
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError> {
        spec.require_workdir()?;
        self.backend.launch_rank(&self.node, spec, output).await
    }

    async fn recover(&self) -> Vec<RecoveredExecution> {
        self.backend
            .recovered
            .lock()
            .unwrap()
            .remove(&self.node)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_of_one_attempt_phase_and_process_share_a_gang() {
        let member = |node_rank: u32, local_rank: u32, phase: Phase| {
            let mut spec = crate::contract::spec(Path::new("/w"), "true");
            spec.owner.task = TaskId(7);
            spec.owner.attempt = AttemptNo(2);
            spec.owner.num_nodes = 3;
            spec.owner.node_rank = node_rank;
            spec.owner.local_rank = local_rank;
            spec.phase = phase;
            GangMember::of(&spec)
        };
        let run = member(2, 0, Phase::Run);
        assert_eq!((run.key.as_str(), run.rank, run.size), ("tacc-7-2", 2, 3));
        assert_eq!(member(0, 0, Phase::Run).key, run.key);
        assert_eq!(member(1, 0, Phase::Setup).key, "tacc-setup-7-2");
        assert_eq!(member(1, 1, Phase::Run).key, "tacc-7-2-p1");
    }
}
