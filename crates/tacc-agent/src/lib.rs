//! `tacc-agent`: the node agent behind `taccd agent` (and inside `taccd dev`). It registers
//! its machine's resources with the control plane, long-polls for the set of attempts the
//! node should run, and reconciles: starts what is new (materialising the pinned code
//! snapshot into a fresh working directory), stops what is no longer wanted, and streams
//! output lines, state changes and outputs back — over HTTP in every mode, so an agent in
//! the server's process and one on another machine behave the same.
//!
//! It runs user code only through a `tacc-exec` [`Executor`]; it must not depend on the
//! server, the store or the scheduler.

mod adopt;
mod attempt;
mod capacity;
mod datasets;
mod ends;
mod environments;
mod fencing;
mod finished_attempts;
mod gpu_release;
mod gpu_share_env;
mod gpus;
mod handed_work;
mod identity;
mod identity_cache;
mod layout;
mod live_files;
mod metrics;
mod mig;
mod node_secrets;
mod orphans;
mod private_tmp;
mod process_mark;
mod reporter;
mod resize;
mod runtimes;
mod sampler;
mod secrets;
mod sessions;
mod spool;
mod tree_removal;
pub mod watchdog;
mod work_plan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use capacity::detect_capacity;
pub use gpus::{FakeGpus, GpuProbe, NvmlProbe, choose_probe, detect_gpus};
pub use process_mark::ProcessMark;
use tacc_client::Client;
use tacc_core::{NodeId, Resources};
use tacc_exec::{DockerExecutor, Executor};
use tacc_proto::{
    AgentReport, Assignment, AttemptRef, NodeRequest, NodeRequestKind, RegisterAgent,
};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot prepare the agent directory {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where an agent keeps its node credential (mode 0600).
pub fn credential_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("node.token")
}

/// The node credential an earlier registration left in `data_dir`, if any.
pub fn stored_credential(data_dir: &std::path::Path) -> Result<Option<String>, AgentError> {
    let path = credential_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(Some(text.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AgentError::DataDir {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Write `bytes` readable by this account only (0600), replacing any earlier file
/// atomically and durably (the file, then its directory, are synced).
pub(crate) fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&partial, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: String,
    pub data_dir: PathBuf,
    pub capacity: Resources,
    pub gpu_type: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Address other nodes use to reach this one (the master address of multi-node tasks).
    pub address: String,
    /// How long one work poll may wait for a change.
    pub poll_wait: Duration,
    /// Keep attempts' working directories after they end (for debugging).
    pub keep_workdirs: bool,
    /// Where attempts' working directories go; `None` is `DATA/work`. Given its own
    /// volume, a task filling its working directory cannot fill the disk the agent keeps
    /// its reports on.
    pub work_dir: Option<PathBuf>,
    /// Total size of managed environments past which idle ones are evicted (LRU).
    pub env_cache_bytes: u64,
}

/// What the attempt runners share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub client: Client,
    pub config: AgentConfig,
    pub executor: Arc<dyn Executor>,
    /// The container runtime, when this node has a Docker engine.
    pub container: Option<Arc<DockerExecutor>>,
    pub node: Mutex<Option<NodeId>>,
    pub reports: reporter::Reports,
    pub snapshots: attempt::SnapshotCache,
    pub envs: Arc<environments::EnvCache>,
    pub datasets: datasets::DatasetCache,
    /// Who each attempt runs as.
    pub identities: identity::Identities,
    /// Whether attempts get a private /tmp and /dev/shm.
    pub private_tmps: private_tmp::PrivateTmps,
    /// The server's heartbeat lease, renewed by every answer.
    pub lease: fencing::Lease,
    /// The pipe to this agent's watchdog process, if it has one (see [`watchdog`]).
    pub watchdog: Mutex<Option<std::process::ChildStdin>>,
    /// Attempts this agent stopped because it lost contact with the server.
    pub fenced: Mutex<BTreeSet<AttemptRef>>,
    /// The node's GPUs, for registration and the sampler.
    pub gpus: Arc<dyn gpus::GpuProbe>,
    /// Running attempts as the resource sampler sees them.
    pub sampling: sampler::Sampling,
    /// Running attempts' executions whose limits can change live.
    pub resizing: Arc<resize::Resizing>,
    /// Running executions an interactive session can enter.
    pub entries: sessions::Entries,
    /// The secret values of every running attempt, masked in every task's log.
    pub secrets: Arc<node_secrets::NodeSecrets>,
}

impl AgentConfig {
    /// The directory attempts' working directories go in.
    pub fn work_root(&self) -> PathBuf {
        self.work_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("work"))
    }
}

impl Shared {
    pub fn node(&self) -> Option<NodeId> {
        *self.node.lock().unwrap()
    }
}

/// Attempts this agent has started, and those it finished (so a finished attempt that
/// a server still lists, or lists again, is never started twice).
#[derive(Debug, Default)]
struct Attempts {
    running: BTreeMap<AttemptRef, CancellationToken>,
    finished: finished_attempts::FinishedAttempts,
    /// Working directories of the running attempts (for the server's questions).
    workdirs: BTreeMap<AttemptRef, PathBuf>,
    /// The version of the node's desired work applied last (beside `running`: a report
    /// batch asking for newer work lists both as of one moment).
    work: handed_work::WorkVersion,
}

#[derive(Debug)]
pub struct Agent {
    shared: Arc<Shared>,
    attempts: Arc<Mutex<Attempts>>,
    /// A join token to enrol with should the server refuse the node's stored credential
    /// because the node changed its name or grew (`reenrol_required`); used once.
    enrol_token: Mutex<Option<String>>,
}

impl Agent {
    pub fn new(
        client: Client,
        config: AgentConfig,
        executor: Arc<dyn Executor>,
    ) -> Result<Agent, AgentError> {
        let data_dir_error = |source: std::io::Error| AgentError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&config.data_dir).map_err(data_dir_error)?;
        let identities =
            identity::Identities::open(&config.data_dir, &config.name, executor.honours_run_as());
        layout::prepare(&config.data_dir, identities.switches()).map_err(data_dir_error)?;
        let private_tmps = private_tmp::PrivateTmps::open(&config.data_dir, identities.switches());
        if let Some(work_dir) = &config.work_dir {
            layout::prepare_work_dir(work_dir, identities.switches()).map_err(|source| {
                AgentError::DataDir {
                    path: work_dir.display().to_string(),
                    source,
                }
            })?;
        }
        let reports = reporter::Reports::open(&config.data_dir).map_err(data_dir_error)?;
        // Attempts that ended in a previous life are never started again.
        let attempts = Attempts {
            finished: reports.undelivered_ends().into_iter().collect(),
            ..Attempts::default()
        };
        let snapshots =
            attempt::SnapshotCache::open(&config.data_dir).map_err(|e| AgentError::DataDir {
                path: config.data_dir.display().to_string(),
                source: std::io::Error::other(e.to_string()),
            })?;
        let envs = environments::EnvCache::open(
            config.data_dir.join("envs"),
            config.env_cache_bytes,
            config.name.clone(),
        )
        .map_err(data_dir_error)?;
        let datasets = datasets::DatasetCache::open(config.data_dir.join("datasets"))
            .map_err(data_dir_error)?;
        Ok(Agent {
            shared: Arc::new(Shared {
                client,
                config,
                executor,
                container: None,
                node: Mutex::new(None),
                reports,
                snapshots,
                envs: Arc::new(envs),
                datasets,
                identities,
                private_tmps,
                lease: fencing::Lease::new(std::time::Instant::now()),
                fenced: Mutex::new(BTreeSet::new()),
                watchdog: Mutex::new(None),
                gpus: Arc::new(gpus::FakeGpus::default()),
                sampling: sampler::Sampling::default(),
                resizing: Default::default(),
                entries: Default::default(),
                secrets: Default::default(),
            }),
            attempts: Arc::new(Mutex::new(attempts)),
            enrol_token: Mutex::new(None),
        })
    }

    /// Enrol again with `join_token` when the server says this node's stored credential
    /// no longer fits it (a new name, more capacity than it enrolled with).
    pub fn with_enrol_token(self, join_token: String) -> Agent {
        *self.enrol_token.lock().unwrap() = Some(join_token);
        self
    }

    /// Ping the watchdog process whose standard input is `pipe` while this agent runs: it
    /// kills the agent's tasks should the agent die or stop answering (see [`watchdog`]).
    pub fn with_watchdog(self, pipe: std::process::ChildStdin) -> Agent {
        if let Err(e) = watchdog::nonblocking(&pipe) {
            // A blocking pipe still works until the watchdog stops reading.
            tracing::warn!("cannot make the pipe to the agent's watchdog non-blocking: {e}");
        }
        *self.shared.watchdog.lock().unwrap() = Some(pipe);
        self
    }

    /// Offer the container runtime too: tasks with `environment.image` (or `runtime:
    /// container`) run in containers of this Docker engine.
    pub fn with_container_runtime(mut self, docker: DockerExecutor) -> Agent {
        Arc::get_mut(&mut self.shared)
            .expect("configured before the agent runs")
            .container = Some(Arc::new(docker));
        self
    }

    /// Describe and sample the node's GPUs with `probe` (NVML, or fakes for `--gpus N`;
    /// none by default).
    pub fn with_gpu_probe(mut self, probe: Arc<dyn GpuProbe>) -> Agent {
        Arc::get_mut(&mut self.shared)
            .expect("configured before the agent runs")
            .gpus = probe;
        self
    }

    /// Run until `shutdown` is cancelled. Processes left by a previous life of this agent
    /// (after a crash) are killed first: their attempts are lost, and the server learns
    /// so when this agent registers without them.
    pub async fn run(self, shutdown: CancellationToken) {
        // On a worker of the runtime rather than where `run` is awaited (`taccd`'s main
        // thread, in `block_on`): there, every poll answer woke that thread and every
        // attempt it started woke a parked worker, two thread hand-offs per poll.
        // Stopped with this future, as before: dropping `run` stops the agent.
        struct AbortOnDrop(tokio::task::JoinHandle<()>);
        impl Drop for AbortOnDrop {
            fn drop(&mut self) {
                self.0.abort();
            }
        }
        let mut serving = AbortOnDrop(tokio::spawn(self.serve(shutdown)));
        if let Err(error) = (&mut serving.0).await {
            if error.is_panic() {
                std::panic::resume_unwind(error.into_panic());
            }
        }
    }

    async fn serve(self, shutdown: CancellationToken) {
        let killed = orphans::kill_leftovers(&self.shared.config.data_dir.join("run"));
        watchdog::keep_pinging(self.shared.clone());
        if killed > 0 {
            tracing::warn!("killed {killed} process group(s) left by a previous run of this agent");
        }
        // Executions that outlived the previous life (Slurm jobs) are claimed, not lost.
        for recovered in self.shared.executor.recover().await {
            self.adopt(recovered);
        }
        // Containers of the previous life are removed (their attempts are lost).
        if let Some(docker) = &self.shared.container {
            docker.recover().await;
        }
        let Some(node) = self.register(&shutdown).await else {
            return;
        };
        // Work a report batch's answer carries is applied here, in the poll loop, one
        // set at a time.
        let (handed_tx, mut handed) = tokio::sync::mpsc::unbounded_channel();
        let reporter = tokio::spawn(reporter::run(
            self.shared.clone(),
            shutdown.clone(),
            self.attempts.clone(),
            handed_tx,
        ));
        let fencing = tokio::spawn(fence_when_cut_off(
            self.shared.clone(),
            self.attempts.clone(),
            shutdown.clone(),
        ));
        let sampler = tokio::spawn(sampler::run(self.shared.clone(), shutdown.clone()));
        let mut node = node;
        let mut backoff = Backoff::default();
        'polls: loop {
            let (after, running) = {
                let attempts = self.attempts.lock().unwrap();
                (
                    attempts.work.after(),
                    attempts.running.keys().copied().collect(),
                )
            };
            let wait = self.shared.lease.poll_wait(self.shared.config.poll_wait);
            let poll = self.shared.client.agent_work(node, after, wait, running);
            tokio::pin!(poll);
            let work = loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break 'polls,
                    work = &mut poll => break work,
                    Some(handed) = handed.recv() => {
                        let handed_work::HandedWork { generation, work } = handed;
                        let path = handed_work::Path::Report { generation };
                        self.reconcile(path, work.version, work.assignments);
                    }
                }
            };
            match work {
                Ok(work) => {
                    self.shared.lease.renewed(std::time::Instant::now());
                    backoff.reset();
                    self.reconcile(handed_work::Path::Poll, work.version, work.assignments);
                    self.answer(node, work.requests);
                }
                Err(e)
                    if e.code() == Some("node_not_registered") || e.code() == Some("not_found") =>
                {
                    tracing::warn!("the server no longer knows this node ({e}); registering again");
                    match self.register(&shutdown).await {
                        Some(id) => node = id,
                        None => break,
                    }
                }
                Err(e) => {
                    // Nothing listens at the server's address: the server is down, and a
                    // server that starts again gives every node a fresh heartbeat period
                    // before it retries anything, so there is nobody to fence against.
                    if e.is_refused() {
                        self.shared.lease.renewed(std::time::Instant::now());
                    }
                    tracing::warn!("polling for work failed: {e}");
                    if backoff.wait(&shutdown).await.is_err() {
                        break;
                    }
                }
            }
        }
        let running: Vec<CancellationToken> = self
            .attempts
            .lock()
            .unwrap()
            .running
            .values()
            .cloned()
            .collect();
        for token in running {
            token.cancel();
        }
        let _ = fencing.await;
        let _ = sampler.await;
        let _ = reporter.await;
    }

    /// Attempts this agent runs right now (sent with every poll and registration).
    fn running_attempts(&self) -> Vec<AttemptRef> {
        self.attempts
            .lock()
            .unwrap()
            .running
            .keys()
            .copied()
            .collect()
    }

    /// What a registration claims: the running attempts and those that ended here whose
    /// end the server has not acknowledged (it may have restarted meanwhile).
    fn claimed_attempts(&self) -> Vec<AttemptRef> {
        let mut claimed: BTreeSet<AttemptRef> = self.running_attempts().into_iter().collect();
        claimed.extend(self.shared.reports.undelivered_ends());
        claimed.into_iter().collect()
    }

    /// Register (again), retrying until the server answers or we are shut down.
    async fn register(&self, shutdown: &CancellationToken) -> Option<NodeId> {
        let mut backoff = Backoff::default();
        loop {
            let running = self.claimed_attempts();
            let registration = RegisterAgent {
                name: self.shared.config.name.clone(),
                capacity: self.shared.config.capacity,
                gpu_type: self.shared.config.gpu_type.clone(),
                labels: runtimes::registration_labels(&self.shared),
                running,
                address: self.shared.config.address.clone(),
                gpus: self.shared.gpus.devices(),
                life: life(),
            };
            match self.shared.client.register_agent(&registration).await {
                Ok(registered) => {
                    if let Some(credential) = &registered.node_token {
                        // Kept before use: a restart must find it, or the node could
                        // never register under its name again.
                        let path = credential_path(&self.shared.config.data_dir);
                        if let Err(e) = write_private(&path, credential.as_bytes()) {
                            tracing::error!(
                                "cannot keep this node's credential in {}: {e}",
                                path.display()
                            );
                            backoff.wait(shutdown).await.ok()?;
                            continue;
                        }
                        self.shared.client.set_token(credential.clone());
                    }
                    *self.shared.node.lock().unwrap() = Some(registered.node_id);
                    self.attempts.lock().unwrap().work.registered();
                    self.shared.lease.granted(
                        Duration::from_millis(registered.heartbeat_timeout_ms),
                        std::time::Instant::now(),
                    );
                    self.shared.lease.set_replicated(registered.replicated);
                    // At once: an agent stopped right after it registered must be fenced.
                    watchdog::ping(&self.shared);
                    tracing::info!(
                        "registered as node {} ({}) with {}",
                        registered.node_id,
                        self.shared.config.name,
                        self.shared.config.capacity
                    );
                    return Some(registered.node_id);
                }
                Err(e) => {
                    tracing::warn!("cannot register with the server: {e}");
                    if e.code() == Some("reenrol_required") {
                        let join = self.enrol_token.lock().unwrap().take();
                        if let Some(join) = join {
                            tracing::info!(
                                "enrolling this node again with the join token it was given"
                            );
                            self.shared.client.set_token(join);
                            continue;
                        }
                    }
                    backoff.wait(shutdown).await.ok()?;
                }
            }
        }
    }

    fn adopt(&self, recovered: tacc_exec::RecoveredExecution) {
        let key = adopt::attempt_of(&recovered);
        let token = CancellationToken::new();
        self.shared.reports.starting(key);
        self.attempts
            .lock()
            .unwrap()
            .running
            .insert(key, token.clone());
        let shared = self.shared.clone();
        let registry = self.attempts.clone();
        tokio::spawn(async move {
            adopt::run(shared, recovered, token).await;
            let mut attempts = registry.lock().unwrap();
            attempts.running.remove(&key);
            attempts.finished.insert(key);
        });
    }

    /// Apply version `version` of the node's desired work, which arrived on `path`
    /// (unless newer work was applied already: `handed_work`): start what is new, stop
    /// what is no longer assigned.
    fn reconcile(&self, path: handed_work::Path, version: u64, desired: Vec<Assignment>) {
        let mut attempts = self.attempts.lock().unwrap();
        if !attempts.work.take(path, version) {
            return;
        }
        let running: BTreeSet<AttemptRef> = attempts.running.keys().copied().collect();
        let plan = work_plan::plan(&running, &attempts.finished, desired);
        for attempt in &plan.stop {
            tracing::info!(
                "stopping task {} attempt {}: no longer assigned",
                attempt.task,
                attempt.attempt
            );
            attempts.running[attempt].cancel();
        }
        for (attempt, allocation) in plan.resize {
            resize::Resizing::want(&self.shared, attempt, allocation);
        }
        for assignment in plan.start {
            let key = assignment.attempt;
            let token = CancellationToken::new();
            self.shared.reports.starting(key);
            attempts.running.insert(key, token.clone());
            attempts
                .workdirs
                .insert(key, attempt::workdir_of(&self.shared, &assignment));
            let shared = self.shared.clone();
            let registry = self.attempts.clone();
            tokio::spawn(async move {
                let leftover = attempt::run(shared, assignment, token).await;
                {
                    let mut attempts = registry.lock().unwrap();
                    attempts.running.remove(&key);
                    attempts.workdirs.remove(&key);
                    attempts.finished.insert(key);
                }
                attempt::remove_leftovers(leftover).await;
            });
        }
    }

    /// Answer the server's questions about running attempts, each on its own task so a
    /// slow one holds up neither the others nor the poll.
    fn answer(&self, node: NodeId, requests: Vec<NodeRequest>) {
        for request in requests {
            let workdir = self
                .attempts
                .lock()
                .unwrap()
                .workdirs
                .get(&request.attempt)
                .cloned();
            if let NodeRequestKind::Session { rank, session } = request.kind.clone() {
                tokio::spawn(sessions::serve(
                    self.shared.clone(),
                    node,
                    request,
                    rank,
                    session,
                    workdir.is_some(),
                ));
                continue;
            }
            tokio::spawn(live_files::answer(
                self.shared.clone(),
                node,
                request,
                workdir,
            ));
        }
    }
}

/// Stop every running attempt once the server has been silent for too long (see
/// [`fencing`]); their ends are reported as `node_fenced` when the server is back.
async fn fence_when_cut_off(
    shared: Arc<Shared>,
    attempts: Arc<Mutex<Attempts>>,
    shutdown: CancellationToken,
) {
    const EVERY: Duration = Duration::from_millis(200);
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = std::time::Instant::now();
    let mut resumed_at: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = std::time::Instant::now();
        // This agent itself was stalled (stopped, starved): the server's answer may be
        // waiting unread. Give the poll a moment to renew the lease before judging it.
        if now.duration_since(last_tick) > EVERY * 5 {
            resumed_at = Some(now);
        }
        last_tick = now;
        if resumed_at.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            continue;
        }
        let Some(silence) = shared.lease.expired(now) else {
            continue;
        };
        // Nothing to stop: no need to ask whether the server is stalled or cut off.
        if attempts.lock().unwrap().running.is_empty() {
            continue;
        }
        if !shared.lease.replicated()
            && fencing::server_host_accepts(shared.client.base_url(), shared.lease.probe_limit())
                .await
        {
            tracing::warn!(
                "the server accepts connections but has not answered for {}s: it is \
                 stalled, not cut off, so the attempts here keep running",
                silence.as_secs()
            );
            shared.lease.renewed(std::time::Instant::now());
            continue;
        }
        let attempts = attempts.lock().unwrap();
        let mut fenced = shared.fenced.lock().unwrap();
        for (attempt, token) in &attempts.running {
            if token.is_cancelled() || !fenced.insert(*attempt) {
                continue;
            }
            tracing::warn!(
                "no answer from the server for {}s: stopping task {} attempt {} so that it \
                 never runs twice (the server retries it elsewhere)",
                silence.as_secs(),
                attempt.task,
                attempt.attempt
            );
            shared.reports.send(AgentReport::Log {
                attempt: *attempt,
                text: format!(
                    "tacc: this node lost contact with the server for {}s; the attempt was \
                     stopped here so that it never runs twice\n",
                    silence.as_secs()
                ),
                offset: None,
            });
            token.cancel();
        }
    }
}

/// Exponential backoff from 50 ms to 2 s for reconnecting to the server.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: Duration::from_millis(50),
        }
    }
}

impl Backoff {
    pub fn reset(&mut self) {
        *self = Backoff::default();
    }

    /// Wait the current delay; `Err` when shut down meanwhile.
    pub async fn wait(&mut self, shutdown: &CancellationToken) -> Result<(), ()> {
        let delay = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        tokio::select! {
            _ = shutdown.cancelled() => Err(()),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }
}

/// Wall-clock time for reports; agents stamp when things happened on their node.
pub(crate) fn now() -> tacc_core::Timestamp {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    tacc_core::Timestamp(millis)
}

/// This agent process's life (see `RegisterAgent::life`): random per process start,
/// never 0.
fn life() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static LIFE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIFE.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.finish().max(1)
    })
}
