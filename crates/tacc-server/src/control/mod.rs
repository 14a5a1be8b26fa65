//! The control plane's core: durable task lifecycle, the scheduler driven with real time,
//! node liveness, and the desired work of every node. All decisions are taken under one
//! lock so the scheduler sees events in one order and the store never disagrees with it.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tacc_compiler::DirChunkStore;
use tacc_core::{SnapshotId, TaskId, TaskState, Timestamp};
use tacc_proto::AttemptRef;
use tacc_scheduler::{
    Action, Event, Explanation, Placement, Plan, Scheduler, SchedulerConfig, TaskRequest,
};
use tacc_schema::TaskSpec;
use tacc_store::{NewTask, OutputRecord, Store, StoredPlacement, TaskFilter, TaskRecord};
use tokio::sync::Mutex;

use crate::ServerError;
use crate::clock::{Clock, SystemClock};
use comm::{Comm, WatchComm};

mod adaptive;
mod core;
pub(crate) use self::core::{Core, LiveNode};
mod attempts;
mod comm;
mod effects;
mod estimates;
mod facts;
pub(crate) use facts::Facts;
#[cfg(test)]
mod gpu_lifecycle_tests;
mod groups;
mod handlers;
mod hangs;
mod idle_gpus;
#[cfg(test)]
mod lifecycle_tests;
mod nodes;
mod pipelines;
mod plans;
mod records;
mod restart;
mod resume;
mod retry;
mod rules;
mod shell;
mod submission;
mod sweeps;
mod task_accounts;
pub(crate) use submission::Submission;
pub use submission::SubmitOptions;
pub(crate) use task_accounts::TaskAccount;
#[cfg(test)]
mod test_env;
#[cfg(test)]
mod workflow_tests;

use crate::logs::LogBook;
pub use adaptive::{AdaptiveConfig, AdaptiveMode, DefaultBounds};
pub(crate) use groups::Arrays;
pub use nodes::LIVENESS_CHECK_EVERY;
use nodes::node_spec;
pub(crate) use pipelines::Pipelines;
pub use pipelines::StageSubmission;
pub use retry::RetrySettings;
pub(crate) use rules::arrays::RERUN_STATES;
pub(crate) use rules::dev_idle;
pub use rules::idle_gpus::{IdleGpuAction, IdleGpuPolicy};
pub(crate) use rules::sweeps::launched_all as sweep_launched_all;
pub(crate) use sweeps::{Sweeps, run_sweeps};

/// The ports rank 0 of an attempt may be given for its rendezvous (`MASTER_PORT`): from
/// PyTorch's default up, one per attempt whose rank 0 shares the node.
pub(crate) const MASTER_PORTS: std::ops::Range<u16> = 29500..30500;

/// The reason a task its user cancelled ends with.
pub(crate) const CANCELLED_BY_USER: &str = "cancelled by user";

/// The reason of a queued task held while no node is online.
pub(crate) const NO_NODE_REASON: &str = "waiting for a node to register";

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    /// An agent silent for longer than this is lost, and so are the attempts it ran.
    pub heartbeat_timeout: Duration,
    /// Name of the scheduling policy (see `tacc_scheduler::policy_names`).
    pub policy: String,
    /// Users, groups, limits, shares and priority caps.
    pub scheduler: SchedulerConfig,
    /// Datasets an administrator registered: name → absolute path or http(s) URL.
    pub datasets: BTreeMap<String, String>,
    /// A node lost [`FLAP_LOSSES`] times within [`FLAP_WINDOW`] that comes back gets no
    /// work until it has stayed up this long.
    pub node_stable_after: Duration,
    /// Chunks no committed snapshot references are deleted once unused for this long.
    pub chunk_retention: Duration,
    /// Per-user submission rate, queue and log limits.
    pub limits: crate::limits::UserLimits,
    /// Operator mapping of TACC users to Unix accounts on the nodes (`[users.NAME]
    /// unix_user` in the configuration file); unmapped users run as the agent's
    /// unprivileged task account.
    pub unix_users: BTreeMap<String, String>,
    /// The first task uid (and gid) the server allocates to users not in `unix_users`
    /// (`--task-uid-base`): one durable map in the store, the same on every node.
    pub task_uid_base: u32,
    /// A running rank with no output (and no CPU use, where measured) for this long is
    /// flagged silent in its task's usage (`tcloud top`).
    pub silent_after: Duration,
    /// A multi-node attempt whose ranks still running have all been silent this long is
    /// ended as hung (`--hang-after`; `None` is off); a task's `on_hang` overrides it.
    pub hang_after: Option<Duration>,
    /// The operator's idle-GPU policy (`--idle-gpu-*`); `None`: idle GPUs are only shown.
    pub idle_gpu: Option<IdleGpuPolicy>,
    /// The bounds on interactive sessions (`tcloud exec`, `shell`, `port-forward`).
    pub sessions: crate::SessionLimits,
    /// Adaptive allocation: which running tasks' allocations may move, and how fast.
    pub adaptive: AdaptiveConfig,
    /// One of several replicas (`--replicated`): agents are told so at registration.
    pub replicated: bool,
    /// How retries are spaced, and the crash limit.
    pub retry: RetrySettings,
    /// Which webhook destinations are allowed (internal addresses only when the operator
    /// says so).
    pub webhooks: crate::webhook_destination::WebhookPolicy,
    /// Header and idle timeouts and the most connections the listener keeps open.
    pub connections: crate::ConnectionLimits,
    /// Audit retention and the bounds on refused-request noise.
    pub audit: crate::auth::AuditSettings,
    /// Nodes that enrol wait, with no work, until an admin approves them
    /// (`--require-node-approval`).
    pub require_node_approval: bool,
}

impl ServerConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        ServerConfig {
            data_dir,
            heartbeat_timeout: Duration::from_secs(30),
            node_stable_after: Duration::from_secs(60),
            policy: DEFAULT_POLICY.to_string(),
            scheduler: SchedulerConfig::default(),
            datasets: BTreeMap::new(),
            chunk_retention: Duration::from_secs(7 * 24 * 3600),
            limits: crate::limits::UserLimits::default(),
            unix_users: BTreeMap::new(),
            task_uid_base: DEFAULT_TASK_UID_BASE,
            silent_after: Duration::from_secs(300),
            hang_after: Some(DEFAULT_HANG_AFTER),
            idle_gpu: None,
            sessions: crate::SessionLimits::default(),
            adaptive: AdaptiveConfig::default(),
            replicated: false,
            retry: RetrySettings::default(),
            webhooks: Default::default(),
            connections: crate::ConnectionLimits::default(),
            audit: crate::auth::AuditSettings::default(),
            require_node_approval: false,
        }
    }
}

/// How long every running rank of a multi-node attempt must have been silent for it to
/// count as hung, unless the operator or the task says otherwise.
pub const DEFAULT_HANG_AFTER: Duration = Duration::from_secs(30 * 60);

/// The default first uid of the accounts the server allocates for users' tasks: above the
/// ranges distributions give to local and directory accounts.
pub const DEFAULT_TASK_UID_BASE: u32 = 200_000;

/// The production default: multifactor fair share with EASY backfill.
pub const DEFAULT_POLICY: &str = "fairshare";

/// Policies that need knowledge a live cluster does not have.
const SIMULATOR_ONLY_POLICIES: &[&str] = &["sjf"];

/// Wall-clock time, for the parts of the server outside the control plane's clock.
pub fn now() -> Timestamp {
    crate::clock::wall_now()
}

#[derive(Debug)]
pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) logs: LogBook,
    pub(crate) chunks: DirChunkStore,
    pub(crate) outputs_dir: PathBuf,
    pub(crate) config: ServerConfig,
    pub(crate) auth: Arc<crate::auth::Authenticator>,
    pub(crate) audit: Arc<crate::auth::AuditTrail>,
    pub(crate) secret_box: crate::secrets::SecretBox,
    /// Attempts each node holds until it reports their end (late outputs are accepted).
    pub(crate) node_attempts: crate::node_attempts::NodeAttempts,
    /// How far each node's output of each attempt has been applied (repeats dropped).
    pub(crate) log_offsets: crate::log_offsets::LogOffsets,
    /// Questions to nodes about their running attempts (`tcloud ls`, live files).
    pub(crate) node_requests: crate::node_requests::NodeRequests,
    pub(crate) usage: Arc<crate::usage::UsageBook>,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The records of placed tasks, kept beside the store (see `records.rs`).
    pub(crate) placed: Arc<records::PlacedRecords>,
    /// Reads of the durable state before and around turns (`facts/`).
    pub(crate) facts: Facts,
    /// Running attempts' signals, verdicts and allocation changes.
    pub(crate) adaptive: adaptive::AdaptiveBook,
    /// Sweeps whose trials the controller still launches or stops.
    pub(crate) sweeps: Arc<sweeps::OpenSweeps>,
    /// Task uids of users, as the store allocated them.
    pub(crate) task_uids: task_accounts::TaskUidCache,
    /// The scheduler's projection of the queue, per epoch (see `estimates.rs`).
    estimates: estimates::EstimateCache,
    /// The control plane's time: the system's in a server, a manual one in lifecycle tests.
    pub(crate) clock: Arc<dyn Clock>,
    /// How decisions reach the nodes (see `comm.rs`).
    comm: Arc<dyn Comm>,
    pub(crate) inner: Mutex<Core>,
    /// Every change committed, in order, for the lifecycle tests' `take_changes`.
    #[cfg(test)]
    pub(crate) committed: std::sync::Mutex<Vec<tacc_store::TaskChange>>,
}

fn spec_of(record: &TaskRecord) -> Result<TaskSpec, ServerError> {
    serde_json::from_value(record.spec.clone()).map_err(|e| {
        ServerError::Internal(format!(
            "stored spec of task {} is unreadable: {e}",
            record.id
        ))
    })
}

/// What the scheduler is told about a task. `group` is the owner's group from their
/// identity, used where the configuration file does not name one for them.
fn request_of(
    spec: &TaskSpec,
    record: &TaskRecord,
    at: Timestamp,
    group: Option<String>,
) -> TaskRequest {
    TaskRequest {
        wait_for_capacity: Submission::of(record).wait_for_capacity,
        ..request_for(spec, &record.user, at, group)
    }
}

/// What the scheduler is told about a task `user` submits (before it has a record).
fn request_for(spec: &TaskSpec, user: &str, at: Timestamp, group: Option<String>) -> TaskRequest {
    TaskRequest {
        group,
        user: tacc_core::UserName::new(user.to_string()),
        per_node: spec.resources.per_node(),
        gpu_share: spec.resources.gpu_share_percent(),
        nodes: spec.resources.nodes,
        gpu_type: spec.resources.gpu_type.clone(),
        priority: spec.priority,
        preemptible: spec.preemptible,
        time_limit_secs: spec.resources.time_limit.map(|t| t.as_secs()),
        submitted_at: at,
        node_selector: crate::node_selector::of(spec),
        ..TaskRequest::default()
    }
}

fn placements_of(stored: &[StoredPlacement]) -> Vec<Placement> {
    stored
        .iter()
        .map(|p| Placement {
            node: p.node,
            gpu_indices: p.gpu_indices.clone(),
        })
        .collect()
}

impl Control {
    /// The read-only view of the durable state, for the API's reads (`query.rs`).
    pub(crate) fn query(&self) -> crate::query::Query {
        crate::query::Query::new(self.store.clone())
    }

    pub async fn open(
        store: Arc<dyn Store>,
        config: ServerConfig,
    ) -> Result<Arc<Control>, ServerError> {
        Self::open_on(store, config, Arc::new(SystemClock)).await
    }

    /// [`Control::open`] on the given clock.
    pub async fn open_on(
        store: Arc<dyn Store>,
        config: ServerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Control>, ServerError> {
        Self::open_with(store, config, clock, Arc::new(WatchComm::default())).await
    }

    /// [`Control::open`] on the given clock, telling nodes of their work through `comm`.
    pub(crate) async fn open_with(
        store: Arc<dyn Store>,
        config: ServerConfig,
        clock: Arc<dyn Clock>,
        comm: Arc<dyn Comm>,
    ) -> Result<Arc<Control>, ServerError> {
        let control = Self::follower_on(store, config, clock, comm)?;
        control.recover().await?;
        Ok(control)
    }

    /// The control plane of a replica that does not lead (see `crate::replica`): it
    /// answers reads from the store and has recovered nothing, so it decides nothing.
    pub fn open_follower(
        store: Arc<dyn Store>,
        config: ServerConfig,
    ) -> Result<Arc<Control>, ServerError> {
        Self::follower_on(
            store,
            config,
            Arc::new(SystemClock),
            Arc::new(WatchComm::default()),
        )
    }

    fn follower_on(
        store: Arc<dyn Store>,
        config: ServerConfig,
        clock: Arc<dyn Clock>,
        comm: Arc<dyn Comm>,
    ) -> Result<Arc<Control>, ServerError> {
        let io = |what: &str, e: std::io::Error| ServerError::io(what, e);
        let logs = LogBook::open(config.data_dir.join("logs"), config.limits.max_log_bytes)
            .map_err(|e| io("cannot create the log directory", e))?;
        let chunks = DirChunkStore::open(config.data_dir.join("chunks"))
            .map_err(|e| ServerError::Internal(format!("cannot open the chunk store: {e}")))?;
        let outputs_dir = config.data_dir.join("outputs");
        std::fs::create_dir_all(&outputs_dir)
            .map_err(|e| io("cannot create the outputs directory", e))?;
        if SIMULATOR_ONLY_POLICIES.contains(&config.policy.as_str()) {
            return Err(ServerError::Config(format!(
                "policy `{}` orders tasks by their true run time, which only the simulator knows; pick another (known: {})",
                config.policy,
                tacc_scheduler::policy_names().join(", ")
            )));
        }
        let scheduler = Scheduler::by_name(&config.policy, config.scheduler.clone())
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let secret_box = crate::secrets::SecretBox::open(&config.data_dir.join("secret.key"))?;
        let placed = Arc::new(records::PlacedRecords::default());
        let control = Arc::new(Control {
            auth: Arc::new(crate::auth::Authenticator::new(store.clone())),
            audit: Arc::new(crate::auth::AuditTrail::start(store.clone(), config.audit)),
            secret_box,
            node_attempts: Default::default(),
            log_offsets: crate::log_offsets::LogOffsets::new(config.data_dir.join("logs")),
            node_requests: Default::default(),
            usage: Arc::new(crate::usage::UsageBook::new(
                config
                    .idle_gpu
                    .as_ref()
                    .map_or(crate::usage::GPU_BUSY_PERCENT, |p| p.below_percent),
            )),
            metrics: Arc::new(crate::metrics::Metrics::new(logs.written_counter())),
            placed: placed.clone(),
            facts: Facts::new(store.clone(), placed),
            adaptive: adaptive::AdaptiveBook::new(&config.adaptive),
            sweeps: Arc::default(),
            task_uids: Default::default(),
            estimates: estimates::EstimateCache::default(),
            store,
            logs,
            chunks,
            outputs_dir,
            config,
            clock: clock.clone(),
            comm,
            inner: Mutex::new(Core::new(scheduler, clock.instant())),
            #[cfg(test)]
            committed: Default::default(),
        });
        Ok(control)
    }

    /// Rebuild in-memory state from the store after a start or restart. Queued tasks are
    /// held until a node is online; attempts that were starting or running wait for their
    /// node's agent to re-register and claim them, and are lost if it does not.
    async fn recover(&self) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        for record in self.store.list_nodes().await? {
            inner
                .nodes
                .insert(record.id, LiveNode::new(record, self.clock.instant()));
        }
        self.reload(&mut inner, true).await
    }

    /// Read the open tasks into the core from the store: at a start (`restarted`: the
    /// nodes of running attempts are expected back, the fair-share ledgers read back), or
    /// in a live server whose core was emptied of them after a failed turn (`rebuild`, in
    /// `shell.rs`; the scheduler is then rebuilt from the store with the nodes as they are).
    pub(super) async fn reload(
        &self,
        inner: &mut Core,
        restarted: bool,
    ) -> Result<(), ServerError> {
        let open = self
            .store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        // Stages whose failure was committed just before a crash, before their dependents
        // were ended: ended now, once the queue is rebuilt.
        let mut failed_stages = Vec::new();
        let mut reloaded = Vec::with_capacity(open.len());
        for record in open.into_iter().rev() {
            let spec = spec_of(&record)?;
            let facts = match handlers::reload::kind_of(&record) {
                handlers::reload::Kind::Queued => {
                    failed_stages.extend(self.facts.failed_needs(&record).await?);
                    let awaited_sweeps = self.sweeps_awaited_by(&record).await?;
                    let waits = awaited_sweeps.is_empty();
                    handlers::reload::Facts::Queued {
                        retry_at: match waits {
                            true => self.facts.retry_wait(&record, &self.config.retry).await?,
                            false => None,
                        },
                        needs: match waits {
                            true => self.facts.restore_dependencies(&record).await?,
                            false => None,
                        },
                        awaited_sweeps,
                    }
                }
                handlers::reload::Kind::Cancelling => handlers::reload::Facts::Cancelling,
                handlers::reload::Kind::Running => {
                    // The allocation in force, where adaptive allocation moved it.
                    if let Some(resize) = self
                        .store
                        .list_resizes(record.id)
                        .await?
                        .into_iter()
                        .rev()
                        .find(|r| r.attempt == record.attempt)
                    {
                        self.adaptive.restore(
                            record.id,
                            record.attempt,
                            tacc_core::Resources::new(
                                resize.cpu_millis,
                                resize.memory_bytes,
                                spec.resources.per_node().gpus,
                            ),
                        );
                    }
                    handlers::reload::Facts::Running(Box::new(handlers::reload::Placed {
                        account: self.task_account(&record.user).await,
                        secrets: self
                            .secret_box
                            .task_secrets(&*self.store, &self.logs, &record, &spec)
                            .await,
                        inputs: self.attempt_inputs(&record).await?,
                        finished: self.facts.finished_ranks_of(&record).await?,
                        allocation: self.adaptive.allocation(AttemptRef {
                            task: record.id,
                            attempt: record.attempt,
                        }),
                    }))
                }
            };
            let identity_group = match inner.identity_groups.contains_key(&record.user) {
                true => None,
                false => Some(self.auth.group_of(&record.user).await?),
            };
            reloaded.push(handlers::reload::Reloaded {
                record,
                spec,
                identity_group,
                facts,
            });
        }
        let running = handlers::reload::on_reloaded(inner, reloaded);
        if restarted {
            self.expect_back(inner, running).await;
            self.restore_fairshare(inner).await?;
        } else {
            self.resync(inner).await;
        }
        for (stage, reason, state) in failed_stages {
            self.end_dependents(inner, &stage, reason, state).await?;
        }
        Ok(())
    }

    pub fn chunk_store(&self) -> &DirChunkStore {
        &self.chunks
    }

    /// The code snapshots of the attempts assigned to `node` (what its credential may
    /// read: see `agent_access`).
    pub(crate) async fn snapshots_of_node(&self, node: tacc_core::NodeId) -> HashSet<SnapshotId> {
        let inner = self.inner.lock().await;
        inner
            .nodes
            .get(&node)
            .map(|live| {
                live.assignments
                    .values()
                    .filter_map(|a| a.instruction.get("snapshot"))
                    .filter_map(|v| serde_json::from_value::<SnapshotId>(v.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Check a submitted spec against what this server knows (the user's secrets,
    /// registered datasets, the snapshot) and resolve what it names.
    pub(crate) async fn prepare(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: &SnapshotId,
        wait_for_capacity: bool,
    ) -> Result<(TaskSpec, Submission), ServerError> {
        spec.validate()
            .map_err(|e| ServerError::InvalidTask(e.to_string()))?;
        if let Some(notify) = &spec.notify {
            self.check_webhook(&notify.webhook)?;
        }
        let notify_secret = spec.notify.as_ref().map(|n| &n.secret);
        self.check_secrets(user, spec.environment.secrets.iter().chain(notify_secret))
            .await?;
        let spec = crate::artifacts::resolve_registered_datasets(spec, &self.config.datasets)?;
        if self.store.get_snapshot(snapshot).await?.is_none() {
            return Err(ServerError::InvalidTask(format!(
                "snapshot {snapshot} is unknown to this server: upload the code first (tcloud submit does this)"
            )));
        }
        let submission = self.admission(user, &spec, wait_for_capacity).await?;
        Ok((spec, submission))
    }

    /// Refuse at submit what the scheduler would reject at once (a request no node can
    /// ever hold, unless `wait_for_capacity`; one above a hard limit), with its reason,
    /// before anything is stored; and say what the platform changes of what was asked.
    /// While no node is up (a cluster starting) the capacity is unknown: such a task is
    /// held until nodes register, and only hard limits are checked.
    async fn admission(
        &self,
        user: &str,
        spec: &TaskSpec,
        wait_for_capacity: bool,
    ) -> Result<Submission, ServerError> {
        let identity_group = self.auth.group_of(user).await?;
        let mut inner = self.inner.lock().await;
        inner
            .identity_groups
            .insert(user.to_string(), identity_group);
        let group = inner.group_for(&self.config, user);
        let capacity_known = inner.nodes.values().any(LiveNode::schedulable);
        let request = TaskRequest {
            wait_for_capacity: wait_for_capacity || !capacity_known,
            ..request_for(spec, user, self.clock.now(), group)
        };
        if let Some(refusal) = inner.scheduler.refusal(&request) {
            return Err(submission::refused(refusal));
        }
        Ok(Submission {
            wait_for_capacity,
            overrides: submission::overrides(spec, user, inner.scheduler.config()),
        })
    }

    /// A webhook whose host is a literal internal address is refused at submit, as a
    /// mistake in the task file's `notify.webhook` (host names are checked when resolved).
    pub(crate) fn check_webhook(&self, url: &str) -> Result<(), ServerError> {
        self.config.webhooks.check_url(url).map_err(|refused| {
            ServerError::InvalidTask(
                tacc_schema::SchemaError::Invalid {
                    field: "notify.webhook".into(),
                    message: refused.to_string(),
                    help: Some(
                        "give the receiver's public address or host name, or ask the \
                         operator to allow this range"
                            .into(),
                    ),
                }
                .to_string(),
            )
        })
    }

    /// Every secret a submission names must be one of the user's.
    pub(crate) async fn check_secrets(
        &self,
        user: &str,
        names: impl Iterator<Item = &String>,
    ) -> Result<(), ServerError> {
        for name in names {
            if self.store.get_secret(user, name).await?.is_none() {
                return Err(ServerError::InvalidTask(format!(
                    "the task names the secret `{name}`, but you have no secret of that name; \
                     set it with `tcloud secret set {name}` (the value is read from stdin)"
                )));
            }
        }
        Ok(())
    }

    /// Accept a task: validate, make it durable, then let the scheduler see it. With
    /// `keyed`, its idempotency key and reply are committed with the task.
    pub async fn submit(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        options: SubmitOptions,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<TaskRecord, ServerError> {
        let SubmitOptions {
            source,
            wait_for_capacity,
            translated,
        } = options;
        let (spec, mut submission) = self
            .prepare(user, spec, &snapshot, wait_for_capacity)
            .await?;
        submission.overrides.splice(0..0, translated);
        let spec_json =
            serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?;
        let committing = Instant::now();
        let task = NewTask {
            name: spec.name.clone(),
            user: user.to_string(),
            spec: spec_json,
            snapshot,
            source,
            submitted_at: self.clock.now(),
            submission: submission.to_json(),
        };
        let record = match keyed {
            Some(keyed) => self.store.create_task_keyed(task, keyed).await?,
            None => self.store.create_task(task).await?,
        };
        self.metrics.committed("create_task", committing.elapsed());
        self.metrics.submitted();
        let group = self.auth.group_of(user).await?;
        self.turn(async |core: &mut Core| {
            core.identity_groups.insert(user.to_string(), group);
            let group = core.group_for(&self.config, user);
            let request = request_of(&spec, &record, record.submitted_at, group);
            core.specs.insert(record.id, spec);
            let mut fx = effects::Effects::default();
            handlers::submit::on_submitted(core, &mut fx, vec![(record.id, request)]);
            self.carry(core, fx).await
        })
        .await?;
        Ok(record)
    }

    /// A user cancels a task. Queued tasks end at once; starting or running ones are
    /// stopped by their agents, and end when the agents confirm.
    pub async fn cancel(&self, task: TaskId) -> Result<TaskRecord, ServerError> {
        self.cancel_because(task, CANCELLED_BY_USER).await
    }

    /// [`Control::cancel`], the task ending with `reason` (`cluster stopped by tcloud down`).
    pub async fn cancel_because(
        &self,
        task: TaskId,
        reason: &str,
    ) -> Result<TaskRecord, ServerError> {
        self.turn(async |core: &mut Core| {
            let record = self
                .facts
                .task_record(task)
                .await?
                .ok_or(ServerError::TaskNotFound(task))?;
            let mut fx = effects::Effects::default();
            handlers::cancel::on_cancel(
                core,
                &mut fx,
                handlers::cancel::Cancel {
                    record,
                    reason,
                    now: self.clock.now(),
                    config: &self.config,
                },
            );
            self.carry(core, fx).await
        })
        .await?;
        self.store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))
    }

    pub async fn explain(&self, task: TaskId) -> Result<tacc_proto::TaskExplanation, ServerError> {
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
        let projection = self.projection().await;
        let now = self.clock.now();
        let inner = self.inner.lock().await;
        let config = inner.scheduler.config();
        let group = config.group_of(&record.user, None);
        let mut details = vec![format!("user {} is in group {group}", record.user)];
        let user_limits = config.user_limits(&record.user);
        let group_limits = config.group_limits(&group);
        for (whose, limits) in [("user", &user_limits), ("group", &group_limits)] {
            let mut parts = Vec::new();
            if let Some(max) = limits.max_gpus {
                parts.push(format!("{max} GPUs"));
            }
            if let Some(max) = limits.max_cpus {
                parts.push(format!("{max} CPUs"));
            }
            if let Some(max) = limits.max_running_tasks {
                parts.push(format!("{max} running tasks"));
            }
            if let Some(max) = limits.max_queued_tasks {
                parts.push(format!("{max} queued tasks"));
            }
            if !parts.is_empty() {
                details.push(format!("{whose} limits: at most {}", parts.join(", ")));
            }
        }
        let guaranteed = config.guaranteed_gpus(&group);
        if guaranteed > 0 {
            details.push(format!(
                "group {group} is guaranteed {guaranteed} GPUs and may borrow idle ones"
            ));
        }
        let (mut position, mut estimated_start) = (None, None);
        let (mut start_estimate, mut what_if) = (None, None);
        match inner.scheduler.explain_with(task, Some(&projection)) {
            Explanation::Queued {
                position: at,
                estimated_start: start,
                reason,
                ..
            } => {
                position = Some(at as u64);
                estimated_start = start;
                if let Some(estimate) = projection.estimate(task, now) {
                    start_estimate = Some(estimates::view(
                        &estimate,
                        reason.as_ref(),
                        record.user.as_str(),
                    ));
                    if let Some(spec) = inner.specs.get(&task)
                        && estimates::wants_what_ifs(
                            &inner.scheduler,
                            task,
                            spec.resources.per_node(),
                        )
                    {
                        let copy = inner.scheduler.clone();
                        what_if = Some((copy, spec.resources.per_node(), estimate));
                    }
                }
                let waits_for_node = matches!(
                    reason,
                    Some(tacc_scheduler::PendingReason::NoMatchingNode { .. })
                );
                if waits_for_node && let Some(spec) = inner.specs.get(&task) {
                    details.push(crate::node_selector::advice(&crate::node_selector::of(
                        spec,
                    )));
                } else if let Some(tacc_scheduler::PendingReason::WaitingForCapacity { .. }) =
                    reason
                {
                    details.push(
                        "no start estimate: it was submitted with --wait-for-capacity and no node that can hold it has joined yet"
                            .to_string(),
                    );
                } else if start.is_none() && start_estimate.is_none() {
                    details.push(
                        "no start estimate: a task it waits for has no time limit (set resources.time_limit to get one)"
                            .to_string(),
                    );
                }
            }
            Explanation::Preempting { .. } => {
                details.push("it is being preempted and will be requeued".to_string())
            }
            Explanation::Running { .. } | Explanation::Unknown => {}
        }
        if inner.held.contains(&task) {
            let flapping: Vec<&str> = inner
                .nodes
                .values()
                .filter(|n| n.online && n.held_back_until.is_some())
                .map(|n| n.record.name.as_str())
                .collect();
            details.push(if flapping.is_empty() {
                "no node is online yet; start an agent (`taccd agent`) or `tcloud up`".to_string()
            } else {
                format!(
                    "the only nodes up ({}) were lost repeatedly and get work once they have \
                     stayed up for {}s (`taccd server --node-stable-after`)",
                    flapping.join(", "),
                    self.config.node_stable_after.as_secs()
                )
            });
        }
        let policy = inner.scheduler.policy_name().to_string();
        let likely_copy = start_estimate.is_some().then(|| inner.scheduler.clone());
        drop(inner);
        if let (Some(view), Some(copy)) = (start_estimate.as_mut(), likely_copy) {
            view.likely = self.likely_start(copy, task, &view.latest, now).await?;
        }
        let (fewer_gpus, other_nodes) = match what_if {
            Some((copy, per_node, asked)) => {
                estimates::what_ifs(copy, task, per_node, asked, now).await
            }
            None => (None, Vec::new()),
        };
        Ok(tacc_proto::TaskExplanation {
            task_id: task,
            state: record.state,
            reason: record.reason,
            queue_position: position,
            estimated_start,
            start_estimate,
            fewer_gpus,
            other_nodes,
            policy,
            details,
            adaptive: self.adaptive_view(task).await.ok(),
        })
    }

    /// The scheduler's fair-share standing as of `at` (see `tacc_scheduler::Scheduler::standing`).
    pub(crate) async fn fairshare_standing(
        &self,
        at: Timestamp,
    ) -> tacc_scheduler::FairShareStanding {
        self.inner.lock().await.scheduler.standing(at)
    }

    /// The latest start of the scheduler's projection for a queued task (the cached
    /// projection of the current epoch: listing many tasks projects once).
    pub async fn estimated_start(&self, task: TaskId) -> Option<Timestamp> {
        self.projection()
            .await
            .estimate(task, self.clock.now())
            .and_then(|estimate| estimate.latest_at())
    }

    pub async fn record_output(&self, output: OutputRecord) -> Result<(), ServerError> {
        Ok(self.store.add_output(output).await?)
    }
}

// Entry points for the workflows (pipelines, sweeps, arrays).
impl Control {
    /// A workflow's newly stored tasks (an array's elements, a sweep's trials, a
    /// pipeline's stages) reach the scheduler in one turn (see `handlers::accepted`).
    pub(crate) async fn accept(
        &self,
        user: &str,
        accepted: handlers::accepted::Accepted,
    ) -> Result<(), ServerError> {
        let identity_group = self.auth.group_of(user).await?;
        self.turn(async |core: &mut Core| {
            let mut fx = effects::Effects::default();
            handlers::accepted::on_accepted(
                core,
                &mut fx,
                &self.config,
                user,
                identity_group,
                accepted,
            );
            self.carry(core, fx).await
        })
        .await
    }

    /// Cancel the unfinished elements of one group in one turn; returns how many were
    /// asked to stop.
    pub(crate) async fn cancel_group_elements(
        &self,
        group: tacc_core::GroupId,
    ) -> Result<u64, ServerError> {
        self.turn(async |core: &mut Core| {
            let records = self.facts.unfinished_elements(group).await?;
            let mut fx = effects::Effects::default();
            let count = handlers::cancel::on_cancel_group(
                core,
                &mut fx,
                records,
                self.clock.now(),
                &self.config,
            );
            self.carry(core, fx).await?;
            Ok(count)
        })
        .await
    }

    /// A sweep has ended (or was cancelled): the stage tasks waiting only for it go to the
    /// scheduler, or end with `dependency_failed` when it has no best trial.
    pub(crate) async fn sweep_stage_ended(
        &self,
        group: tacc_core::GroupId,
    ) -> Result<(), ServerError> {
        let Some(stage) = self.facts.stage_of_group(group).await? else {
            return Ok(());
        };
        if self.facts.sweep_end(group).await? == rules::sweeps::SweepEnd::Open {
            return Ok(());
        }
        self.turn(async |core: &mut Core| {
            if let Some((reason, state)) = self.facts.stage_failure(&stage).await? {
                return self.end_dependents(core, &stage, reason, state).await;
            }
            let mut released = Vec::new();
            for task in handlers::sweep_ended::released_by(core, group) {
                let Some(record) = self.facts.task_record(task).await? else {
                    continue;
                };
                let needs = match record.state {
                    TaskState::Queued => self.facts.restore_dependencies(&record).await?,
                    _ => None,
                };
                released.push(handlers::sweep_ended::Released { record, needs });
            }
            let mut fx = effects::Effects::default();
            handlers::sweep_ended::on_released(core, &mut fx, &self.config, released);
            self.carry(core, fx).await
        })
        .await
    }

    /// Set a task's reason now (a trial the sweep controller stops says why).
    pub(crate) async fn note_reason(
        &self,
        task: TaskId,
        reason: String,
    ) -> Result<(), ServerError> {
        let change = tacc_store::TaskChange::Reason {
            task,
            reason: Some(reason),
        };
        Ok(self.commit(&[change]).await?)
    }

    /// After `record` ended as `state` for good: when it was a task or array stage's task
    /// and did not succeed, the queued tasks of the stages that need it end now.
    pub(super) async fn stop_dependents(
        &self,
        core: &mut Core,
        record: &TaskRecord,
        state: TaskState,
    ) -> Result<(), ServerError> {
        match self.facts.dependency_failure(record, state).await? {
            Some((stage, reason, end_state)) => {
                self.end_dependents(core, &stage, reason, end_state).await
            }
            None => Ok(()),
        }
    }

    /// End, as `end_state` with `reason`, every queued task of the stages that need
    /// `stage` directly or through others (see `handlers::dependents`).
    pub(super) async fn end_dependents(
        &self,
        core: &mut Core,
        stage: &tacc_store::StageRecord,
        reason: String,
        end_state: TaskState,
    ) -> Result<(), ServerError> {
        let tasks = self.facts.dependent_tasks(stage).await?;
        let mut fx = effects::Effects::default();
        let now = self.clock.now();
        handlers::dependents::on_dependents_ended(core, &mut fx, tasks, &reason, end_state, now);
        Box::pin(self.carry(core, fx)).await
    }

    /// The unfinished sweeps a queued stage task restored after a restart waits for,
    /// each opened again so the sweep controller launches and stops its trials.
    async fn sweeps_awaited_by(
        &self,
        record: &TaskRecord,
    ) -> Result<std::collections::BTreeSet<tacc_core::GroupId>, ServerError> {
        let awaited = self.facts.sweeps_awaited_by(record).await?;
        for group in &awaited {
            self.sweeps.add(*group);
        }
        Ok(awaited)
    }
}
