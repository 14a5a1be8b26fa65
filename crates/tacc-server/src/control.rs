//! The control plane's core: durable task lifecycle, the scheduler driven with real time,
//! node liveness, and the desired work of every node. All decisions are taken under one
//! lock so the scheduler sees events in one order and the store never disagrees with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tacc_compiler::{DirChunkStore, Instruction};
use tacc_core::{NodeId, Resources, SnapshotId, TaskId, TaskState, Timestamp};
use tacc_proto::{AgentReport, Assignment, AttemptOutcome, AttemptRef, DesiredWork, RegisterAgent};
use tacc_scheduler::{
    Action, Event, Explanation, NodeSpec, Placement, Plan, Scheduler, SchedulerConfig, TaskRequest,
};
use tacc_schema::{RetryOn, TaskSpec};
use tacc_store::{
    NewNode, NewTask, NodeRecord, OutputRecord, Store, StoredPlacement, TaskChange, TaskFilter,
    TaskRecord, Transition,
};
use tokio::sync::{Mutex, watch};

use crate::ServerError;
use crate::logs::LogBook;

/// The ports rank 0 of an attempt may be given for its rendezvous (`MASTER_PORT`): from
/// PyTorch's default up, one per attempt whose rank 0 shares the node.
const MASTER_PORTS: std::ops::Range<u16> = 29500..30500;

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
    /// A running rank with no output (and no CPU use, where measured) for this long is
    /// flagged silent in its task's usage (`tcloud top`).
    pub silent_after: Duration,
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
            silent_after: Duration::from_secs(300),
        }
    }
}

/// How often the server checks node liveness ([`Control::check_liveness`]).
pub const LIVENESS_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often within [`FLAP_WINDOW`] a node must have been lost to count as flapping.
pub const FLAP_LOSSES: usize = 2;
/// The window in which losses of a node count towards flapping.
pub const FLAP_WINDOW: Duration = Duration::from_secs(600);

/// The production default: multifactor fair share with EASY backfill.
pub const DEFAULT_POLICY: &str = "fairshare";

/// Policies that need knowledge a live cluster does not have.
const SIMULATOR_ONLY_POLICIES: &[&str] = &["sjf"];

pub fn now() -> Timestamp {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Timestamp(millis)
}

#[derive(Debug)]
pub(crate) struct LiveNode {
    record: NodeRecord,
    online: bool,
    last_seen: Instant,
    version: watch::Sender<u64>,
    pub(crate) assignments: BTreeMap<AttemptRef, Assignment>,
    /// Attempts withdrawn by a cancel, until the agent confirms they are not running.
    cancelling: BTreeSet<AttemptRef>,
    /// When the node was lost recently (heartbeat timeouts), oldest first.
    losses: Vec<Instant>,
    /// A flapping node that came back is up but gets no work before this instant.
    held_back_until: Option<Instant>,
    /// Attempts the agent claimed at registration that are not (or no longer) its to
    /// run: until it has stopped them, it gets no new work.
    stale_claims: BTreeSet<AttemptRef>,
}

impl LiveNode {
    fn new(record: NodeRecord) -> LiveNode {
        LiveNode {
            record,
            online: false,
            last_seen: Instant::now(),
            version: watch::channel(0).0,
            assignments: BTreeMap::new(),
            cancelling: BTreeSet::new(),
            losses: Vec::new(),
            held_back_until: None,
            stale_claims: BTreeSet::new(),
        }
    }

    /// Whether the scheduler may place work on the node (it knows the node as up).
    fn schedulable(&self) -> bool {
        self.online && self.held_back_until.is_none()
    }

    /// Whether the node was lost often enough lately to count as flapping.
    fn flapping(&self) -> bool {
        self.losses
            .iter()
            .filter(|at| at.elapsed() < FLAP_WINDOW)
            .count()
            >= FLAP_LOSSES
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    scheduler: Scheduler,
    pub(crate) nodes: BTreeMap<NodeId, LiveNode>,
    /// Queued tasks not yet given to the scheduler because no node is online: the
    /// scheduler would reject them as never fitting an empty cluster.
    held: BTreeSet<TaskId>,
    /// Task specs of every non-terminal task, parsed once.
    specs: BTreeMap<TaskId, TaskSpec>,
    /// Tasks told to stop by a preemption, until their attempt has ended.
    preempting: BTreeSet<TaskId>,
    /// Node ranks of multi-node attempts that already ended successfully; the attempt
    /// succeeds when every rank has.
    finished_ranks: BTreeMap<AttemptRef, BTreeSet<u32>>,
    /// When node liveness was last checked (to tell a stalled server from silent nodes).
    last_liveness_check: Instant,
    /// The group of each task owner's identity (users the configuration file gives no
    /// group are accounted to this one).
    identity_groups: BTreeMap<String, Option<String>>,
}

impl Inner {
    fn group_for(&self, config: &ServerConfig, user: &str) -> Option<String> {
        let configured = config
            .scheduler
            .users
            .get(user)
            .is_some_and(|u| u.group.is_some());
        if configured {
            return None;
        }
        self.identity_groups.get(user).cloned().flatten()
    }
}

#[derive(Debug)]
pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) logs: LogBook,
    pub(crate) chunks: DirChunkStore,
    pub(crate) outputs_dir: PathBuf,
    pub(crate) config: ServerConfig,
    pub(crate) auth: crate::auth::Authenticator,
    pub(crate) audit: crate::auth::AuditTrail,
    pub(crate) secret_box: crate::secrets::SecretBox,
    pub(crate) submit_buckets: crate::limits::SubmitBuckets,
    pub(crate) chunk_sets: crate::agent_access::ChunkSets,
    /// Attempts each node holds until it reports their end (late outputs are accepted).
    pub(crate) node_attempts: crate::node_attempts::NodeAttempts,
    /// Questions to nodes about their running attempts (`tcloud ls`, live files).
    pub(crate) node_requests: crate::node_requests::NodeRequests,
    pub(crate) usage: crate::usage::UsageBook,
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) inner: Mutex<Inner>,
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
        group,
        user: tacc_core::UserName::new(record.user.clone()),
        per_node: spec.resources.per_node(),
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

/// What becomes of an attempt that ended, and why.
fn final_state(
    outcome: &AttemptOutcome,
    cancel_requested: bool,
) -> (TaskState, Option<String>, Option<i32>) {
    match outcome {
        _ if cancel_requested => (TaskState::Cancelled, Some("cancelled by user".into()), None),
        AttemptOutcome::Cancelled => (TaskState::Cancelled, Some("cancelled".into()), None),
        AttemptOutcome::Exited { code: 0 } => (TaskState::Succeeded, None, Some(0)),
        AttemptOutcome::Exited { code } => (
            TaskState::Failed,
            Some(format!("exit code {code}")),
            Some(*code),
        ),
        AttemptOutcome::Signalled { signal } => (
            TaskState::Failed,
            Some(format!("killed by signal {signal}")),
            Some(128 + signal),
        ),
        AttemptOutcome::TimeLimit => (TaskState::Failed, Some("time limit reached".into()), None),
        AttemptOutcome::LaunchFailed { reason, message } => (
            TaskState::Failed,
            Some(format!("{reason}: {message}")),
            None,
        ),
    }
}

impl Control {
    pub async fn open(
        store: Arc<dyn Store>,
        config: ServerConfig,
    ) -> Result<Arc<Control>, ServerError> {
        let io = |what: &str, e: std::io::Error| ServerError::Internal(format!("{what}: {e}"));
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
        let control = Arc::new(Control {
            auth: crate::auth::Authenticator::new(store.clone()),
            audit: crate::auth::AuditTrail::start(store.clone()),
            secret_box,
            submit_buckets: Default::default(),
            chunk_sets: Default::default(),
            node_attempts: Default::default(),
            node_requests: Default::default(),
            usage: Default::default(),
            metrics: crate::metrics::Metrics::new(logs.written_counter()),
            store,
            logs,
            chunks,
            outputs_dir,
            config,
            inner: Mutex::new(Inner {
                scheduler,
                nodes: BTreeMap::new(),
                held: BTreeSet::new(),
                specs: BTreeMap::new(),
                preempting: BTreeSet::new(),
                finished_ranks: BTreeMap::new(),
                last_liveness_check: Instant::now(),
                identity_groups: BTreeMap::new(),
            }),
        });
        control.recover().await?;
        Ok(control)
    }

    /// Rebuild in-memory state from the store after a start or restart. Queued tasks are
    /// held until a node is online; attempts that were starting or running wait for their
    /// node's agent to re-register and claim them, and are lost if it does not.
    async fn recover(&self) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        for record in self.store.list_nodes().await? {
            inner.nodes.insert(record.id, LiveNode::new(record));
        }
        let open = self
            .store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        for record in open.into_iter().rev() {
            let spec = spec_of(&record)?;
            if record.state == TaskState::Queued {
                inner.held.insert(record.id);
            } else if !record.cancel_requested {
                let secrets = self.task_secrets(&record, &spec).await;
                let assignments = assignments_for(
                    &record,
                    &spec,
                    &inner.nodes,
                    self.config.unix_users.get(&record.user),
                    &secrets,
                );
                for (node, assignment) in assignments {
                    if let Some(live) = inner.nodes.get_mut(&node) {
                        live.assignments.insert(assignment.attempt, assignment);
                    }
                }
            }
            if !inner.identity_groups.contains_key(&record.user) {
                let group = self.auth.group_of(&record.user).await?;
                inner.identity_groups.insert(record.user.clone(), group);
            }
            inner.specs.insert(record.id, spec);
        }
        Ok(())
    }

    pub fn chunk_store(&self) -> &DirChunkStore {
        &self.chunks
    }

    /// Accept a task: validate, make it durable, then let the scheduler see it.
    pub async fn submit(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        source: Option<String>,
    ) -> Result<TaskRecord, ServerError> {
        spec.validate()
            .map_err(|e| ServerError::InvalidTask(e.to_string()))?;
        for name in &spec.environment.secrets {
            if self.store.get_secret(user, name).await?.is_none() {
                return Err(ServerError::InvalidTask(format!(
                    "environment.secrets names `{name}`, but you have no secret of that name; \
                     set it with `tcloud secret set {name}` (the value is read from stdin)"
                )));
            }
        }
        let spec = self.resolve_registered_datasets(spec)?;
        if self.store.get_snapshot(&snapshot).await?.is_none() {
            return Err(ServerError::InvalidTask(format!(
                "snapshot {snapshot} is unknown to this server: upload the code first (tcloud submit does this)"
            )));
        }
        let spec_json =
            serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?;
        let committing = Instant::now();
        let record = self
            .store
            .create_task(NewTask {
                name: spec.name.clone(),
                user: user.to_string(),
                spec: spec_json,
                snapshot,
                source,
                submitted_at: now(),
            })
            .await?;
        self.metrics.committed("create_task", committing.elapsed());
        self.metrics.submitted();
        let group = self.auth.group_of(user).await?;
        let mut inner = self.inner.lock().await;
        inner.identity_groups.insert(user.to_string(), group);
        let group = inner.group_for(&self.config, user);
        let request = request_of(&spec, &record, record.submitted_at, group);
        inner.specs.insert(record.id, spec);
        if inner.nodes.values().any(LiveNode::schedulable) {
            self.drive(
                &mut inner,
                Event::TaskSubmitted {
                    task: record.id,
                    request,
                },
            )
            .await;
        } else {
            inner.held.insert(record.id);
            self.commit(&[TaskChange::Reason {
                task: record.id,
                reason: Some(NO_NODE_REASON.into()),
            }])
            .await?;
        }
        Ok(record)
    }

    /// Feed one event to the scheduler and carry out its plan in one store transaction.
    /// A failure here never loses a task: the task stays durable in its last state and
    /// the scheduler is rebuilt from the store.
    async fn drive(&self, inner: &mut Inner, event: Event) {
        let deciding = Instant::now();
        let decided = inner.scheduler.handle(now(), event);
        self.metrics.decided(deciding.elapsed());
        let plan = match decided {
            Ok(plan) => plan,
            Err(e) => {
                tracing::error!("scheduler refused an event: {e}");
                return;
            }
        };
        if let Err(e) = self.carry_out(inner, plan).await {
            tracing::error!("could not record a scheduling plan, rebuilding from the store: {e}");
            self.resync(inner).await;
        }
    }

    /// Record a plan in one transaction, then hand the started attempts to their nodes and
    /// withdraw the preempted ones.
    async fn carry_out(&self, inner: &mut Inner, plan: Plan) -> Result<(), ServerError> {
        if plan.actions.is_empty() {
            return Ok(());
        }
        let mut changes = Vec::new();
        let mut starts = Vec::new();
        let mut preempted = Vec::new();
        for action in plan.actions {
            match action {
                Action::Start { task, placements } => {
                    let Some(record) = self.store.get_task(task).await? else {
                        continue;
                    };
                    let stored: Vec<StoredPlacement> = placements
                        .iter()
                        .map(|p| StoredPlacement {
                            node: p.node,
                            gpu_indices: p.gpu_indices.clone(),
                        })
                        .collect();
                    changes.push(TaskChange::Transition(Transition {
                        placements: stored.clone(),
                        ..Transition::new(
                            task,
                            TaskState::Queued,
                            TaskState::Starting,
                            record.attempt,
                            plan.at,
                        )
                    }));
                    starts.push(TaskRecord {
                        placements: stored,
                        state: TaskState::Starting,
                        ..record
                    });
                }
                Action::Pending { task, reason } => changes.push(TaskChange::Reason {
                    task,
                    reason: Some(reason.to_string()),
                }),
                Action::Reject { task, reason } => {
                    let Some(record) = self.store.get_task(task).await? else {
                        continue;
                    };
                    changes.push(TaskChange::Transition(Transition {
                        reason: Some(reason.to_string()),
                        ..Transition::new(
                            task,
                            TaskState::Queued,
                            TaskState::Failed,
                            record.attempt,
                            plan.at,
                        )
                    }));
                    inner.specs.remove(&task);
                    self.logs.wake(task);
                }
                Action::Preempt { task, .. } => preempted.push(task),
            }
        }
        self.commit(&changes).await?;
        for record in starts {
            let Some(spec) = inner.specs.get(&record.id) else {
                continue;
            };
            let secrets = self.task_secrets(&record, spec).await;
            let unix_user = self.config.unix_users.get(&record.user);
            for (node, assignment) in
                assignments_for(&record, spec, &inner.nodes, unix_user, &secrets)
            {
                if let Some(live) = inner.nodes.get_mut(&node) {
                    live.assignments.insert(assignment.attempt, assignment);
                    live.version.send_modify(|v| *v += 1);
                }
            }
        }
        // The agent stops a withdrawn attempt with SIGTERM, then SIGKILL after the task's
        // grace period; its end comes back as a cancelled attempt and is requeued.
        for task in preempted {
            inner.preempting.insert(task);
            for live in inner.nodes.values_mut() {
                let withdrawn: Vec<AttemptRef> = live
                    .assignments
                    .keys()
                    .filter(|a| a.task == task)
                    .copied()
                    .collect();
                for attempt in withdrawn {
                    live.assignments.remove(&attempt);
                    live.cancelling.insert(attempt);
                    live.version.send_modify(|v| *v += 1);
                }
            }
        }
        Ok(())
    }

    /// Throw the scheduler's state away, rebuild it from the store in one batch, and carry
    /// out what it decides.
    async fn resync(&self, inner: &mut Inner) {
        let mut scheduler = Scheduler::by_name(&self.config.policy, self.config.scheduler.clone())
            .expect("the policy was checked at start");
        let mut events: Vec<Event> = inner
            .nodes
            .values()
            .filter(|n| n.schedulable())
            .flat_map(|live| {
                let up = Event::NodeUp(node_spec(&live.record));
                if live.record.drained {
                    vec![up, Event::NodeDrained(live.record.id)]
                } else {
                    vec![up]
                }
            })
            .collect();
        let open = self
            .store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        for record in open.into_iter().rev() {
            let Some(spec) = inner.specs.get(&record.id) else {
                continue;
            };
            let group = inner.group_for(&self.config, &record.user);
            let request = request_of(spec, &record, record.submitted_at, group);
            events.push(if record.state == TaskState::Queued {
                Event::TaskSubmitted {
                    task: record.id,
                    request,
                }
            } else {
                Event::TaskRestored {
                    task: record.id,
                    request,
                    placements: placements_of(&record.placements),
                }
            });
        }
        let plan = scheduler.handle(now(), Event::Batch(events));
        inner.scheduler = scheduler;
        match plan {
            Ok(plan) => {
                if let Err(e) = Box::pin(self.carry_out(inner, plan)).await {
                    tracing::error!(
                        "could not record the rebuilt scheduler's plan: {e}; it is retried on the next event"
                    );
                }
            }
            Err(e) => tracing::error!("rebuilding the scheduler failed: {e}"),
        }
    }

    /// A user cancels a task. Queued tasks end at once; starting or running ones are
    /// stopped by their agents, and end when the agents confirm.
    pub async fn cancel(&self, task: TaskId) -> Result<TaskRecord, ServerError> {
        let mut inner = self.inner.lock().await;
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
        match record.state {
            TaskState::Queued => {
                self.commit(&[TaskChange::Transition(Transition {
                    reason: Some("cancelled by user".into()),
                    ..Transition::new(
                        task,
                        TaskState::Queued,
                        TaskState::Cancelled,
                        record.attempt,
                        now(),
                    )
                })])
                .await?;
                inner.specs.remove(&task);
                if !inner.held.remove(&task) {
                    self.drive(&mut inner, Event::TaskCancelled(task)).await;
                }
                self.logs.wake(task);
            }
            TaskState::Starting | TaskState::Running if !record.cancel_requested => {
                self.commit(&[TaskChange::CancelRequested { task }]).await?;
                let attempt = AttemptRef {
                    task,
                    attempt: record.attempt,
                };
                for live in inner.nodes.values_mut() {
                    if live.assignments.remove(&attempt).is_some() {
                        live.cancelling.insert(attempt);
                        live.version.send_modify(|v| *v += 1);
                    }
                }
                // An attempt whose node is gone has nobody left to confirm the cancel.
                let placed_on_live_node = record
                    .placements
                    .iter()
                    .any(|p| inner.nodes.get(&p.node).is_some_and(|n| n.online));
                if !placed_on_live_node {
                    self.finish_attempt(&mut inner, attempt, AttemptOutcome::Cancelled, now())
                        .await?;
                }
            }
            _ => {}
        }
        self.store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))
    }

    /// An agent (re)registers. Attempts the server placed on this node that the agent does
    /// not report are lost: their processes are gone with the agent's previous life.
    pub async fn register_agent(
        &self,
        registration: RegisterAgent,
    ) -> Result<NodeRecord, ServerError> {
        let mut inner = self.inner.lock().await;
        let record = self
            .store
            .register_node(NewNode {
                name: registration.name.clone(),
                capacity: registration.capacity,
                gpu_type: registration.gpu_type.clone(),
                labels: registration.labels.clone(),
                address: registration.address.clone(),
                registered_at: now(),
            })
            .await?;
        // Read before the node comes up: a queued task the scheduler places on it at once
        // is new work for the agent, not an attempt its previous life left unclaimed.
        let active = self
            .store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        // A node that re-registers while still online (its agent restarted faster than
        // the heartbeat timeout) is already known to the scheduler with its allocations.
        let was_online = inner.nodes.get(&record.id).is_some_and(|n| n.online);
        let claimed: BTreeSet<AttemptRef> = registration.running.iter().copied().collect();
        let stable_after = self.config.node_stable_after;
        let live = inner
            .nodes
            .entry(record.id)
            .or_insert_with(|| LiveNode::new(record.clone()));
        live.record = record.clone();
        live.online = true;
        self.node_attempts
            .forget_node(record.id, &registration.running);
        live.last_seen = Instant::now();
        if !was_online && live.flapping() {
            tracing::warn!(
                "node {} came back after being lost {} times in {}s: no work for it until it has \
                 stayed up for {}s",
                record.name,
                live.losses.len(),
                FLAP_WINDOW.as_secs(),
                stable_after.as_secs()
            );
            live.held_back_until = Some(Instant::now() + stable_after);
        }
        if !was_online && live.held_back_until.is_none() {
            self.node_joins_scheduler(&mut inner, record.id).await;
        }

        for task in active
            .into_iter()
            .rev()
            .filter(|t| t.placements.iter().any(|p| p.node == record.id))
        {
            let attempt = AttemptRef {
                task: task.id,
                attempt: task.attempt,
            };
            let all_nodes_online = task
                .placements
                .iter()
                .all(|p| inner.nodes.get(&p.node).is_some_and(|n| n.online));
            if claimed.contains(&attempt) && all_nodes_online && !task.cancel_requested {
                if was_online {
                    continue;
                }
                if let Some(spec) = inner.specs.get(&task.id) {
                    let group = inner.group_for(&self.config, &task.user);
                    let event = Event::TaskRestored {
                        task: task.id,
                        request: request_of(spec, &task, task.submitted_at, group),
                        placements: placements_of(&task.placements),
                    };
                    self.drive(&mut inner, event).await;
                }
            } else {
                let outcome = AttemptOutcome::LaunchFailed {
                    reason: "node_restarted".into(),
                    message: format!(
                        "the agent on node {} restarted while the attempt was {}; its processes were stopped",
                        record.name, task.state
                    ),
                };
                self.lose_attempt(&mut inner, attempt, outcome).await?;
            }
        }
        self.release_held(&mut inner).await?;
        if let Some(live) = inner.nodes.get_mut(&record.id) {
            live.stale_claims = claimed
                .into_iter()
                .filter(|attempt| !live.assignments.contains_key(attempt))
                .collect();
            if !live.stale_claims.is_empty() {
                tracing::warn!(
                    "node {} still runs {} attempt(s) that ended or moved while it was away: \
                     they are stopped before it gets new work",
                    record.name,
                    live.stale_claims.len()
                );
            }
            live.version.send_modify(|v| *v += 1);
        }
        Ok(record)
    }

    /// The work a node should be doing; also counts as the node's heartbeat. `running` is
    /// what the agent runs now: a cancelled attempt it does not run (it never received
    /// it, or already stopped it) is cancelled here, since no report about it will come.
    pub async fn desired_work(
        &self,
        node: NodeId,
        running: &[AttemptRef],
    ) -> Result<(DesiredWork, watch::Receiver<u64>), ServerError> {
        let mut inner = self.inner.lock().await;
        let live = inner
            .nodes
            .get_mut(&node)
            .ok_or(ServerError::NodeNotFound(node))?;
        if !live.online {
            return Err(ServerError::NodeNotRegistered(node));
        }
        live.last_seen = Instant::now();
        let settled: Vec<AttemptRef> = live
            .cancelling
            .iter()
            .filter(|a| !running.contains(a))
            .copied()
            .collect();
        for attempt in &settled {
            live.cancelling.remove(attempt);
        }
        for attempt in settled {
            self.finish_attempt(&mut inner, attempt, AttemptOutcome::Cancelled, now())
                .await?;
        }
        let live = inner
            .nodes
            .get_mut(&node)
            .ok_or(ServerError::NodeNotFound(node))?;
        if !live.stale_claims.is_empty() {
            live.stale_claims
                .retain(|attempt| running.contains(attempt));
            if live.stale_claims.is_empty() {
                // Answer the next poll at once with the work that was held back.
                live.version.send_modify(|v| *v += 1);
            }
        }
        let assignments = if live.stale_claims.is_empty() {
            live.assignments.values().cloned().collect()
        } else {
            // What it already runs and may keep; nothing new until the stale are gone.
            live.assignments
                .values()
                .filter(|a| running.contains(&a.attempt))
                .cloned()
                .collect()
        };
        let receiver = live.version.subscribe();
        Ok((
            DesiredWork {
                version: *live.version.borrow(),
                assignments,
                requests: Vec::new(),
            },
            receiver,
        ))
    }

    pub async fn touch(&self, node: NodeId) {
        if let Some(live) = self.inner.lock().await.nodes.get_mut(&node) {
            live.last_seen = Instant::now();
        }
    }

    /// Apply an agent's reports, in order.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let mut inner = self.inner.lock().await;
        match inner.nodes.get_mut(&node) {
            Some(live) => live.last_seen = Instant::now(),
            None => return Err(ServerError::NodeNotFound(node)),
        }
        let mut ack = tacc_proto::ReportsAck::default();
        for report in reports {
            if let AgentReport::Usage(sample) = report {
                let attempt = sample.attempt;
                if self.accept_usage(node, sample).await? {
                    ack.accepted += 1;
                } else {
                    ack.rejected += 1;
                    self.audit.record_as(
                        format!("node:{node}"),
                        "report.rejected",
                        format!("task:{}/{}", attempt.task, attempt.attempt),
                        false,
                        "usage report for a rank this node does not run".into(),
                    );
                }
                continue;
            }
            // Never trust the other side: a report counts only for an attempt of this
            // node's own, and an ending only while the attempt has not ended yet.
            let (attempt, ending) = match &report {
                AgentReport::Log { attempt, .. } | AgentReport::RuntimeChosen { attempt, .. } => {
                    (*attempt, false)
                }
                AgentReport::Started { attempt, .. } => (*attempt, false),
                AgentReport::Finished { attempt, .. } => (*attempt, true),
                AgentReport::Usage(sample) => (sample.attempt, false),
            };
            let current = self.attempt_is_on_node(node, attempt, !ending).await?;
            // The node's own end of an attempt it held, and its last lines, count even
            // when the task has moved on (another rank ended it, a retry, a preemption).
            let held = if ending {
                self.node_attempts.finish(node, attempt)
            } else {
                self.node_attempts.rank_of(node, attempt).is_some()
            };
            if !current && held {
                ack.accepted += 1;
                if let AgentReport::Log { attempt, text } = &report {
                    self.logs.append(attempt.task, text).map_err(|e| {
                        ServerError::Internal(format!(
                            "cannot write the log of task {}: {e}",
                            attempt.task
                        ))
                    })?;
                }
                continue;
            }
            if !current {
                ack.rejected += 1;
                self.audit.record_as(
                    format!("node:{node}"),
                    "report.rejected",
                    format!("task:{}/{}", attempt.task, attempt.attempt),
                    false,
                    format!(
                        "{} report for an attempt this node does not run{}",
                        report_kind(&report),
                        if ending {
                            " (or that already ended)"
                        } else {
                            ""
                        }
                    ),
                );
                continue;
            }
            ack.accepted += 1;
            match report {
                AgentReport::Log { attempt, text } => {
                    self.logs.append(attempt.task, &text).map_err(|e| {
                        ServerError::Internal(format!(
                            "cannot write the log of task {}: {e}",
                            attempt.task
                        ))
                    })?;
                }
                AgentReport::Started { attempt, at } => {
                    let Some(record) = self.store.get_task(attempt.task).await? else {
                        continue;
                    };
                    if record.attempt == attempt.attempt && record.state == TaskState::Starting {
                        self.commit(&[TaskChange::Transition(Transition::new(
                            attempt.task,
                            TaskState::Starting,
                            TaskState::Running,
                            attempt.attempt,
                            at,
                        ))])
                        .await?;
                        self.metrics
                            .started(record.submitted_at, attempt.attempt, now());
                    }
                }
                AgentReport::Finished {
                    attempt,
                    at,
                    outcome,
                    rank,
                } => {
                    self.note_rank_finished(node, attempt, &outcome, at).await?;
                    self.rank_finished(&mut inner, node, attempt, outcome, rank, at)
                        .await?;
                }
                AgentReport::Usage(_) => {}
                AgentReport::RuntimeChosen {
                    attempt,
                    runtime,
                    why,
                } => {
                    let Some(record) = self.store.get_task(attempt.task).await? else {
                        continue;
                    };
                    if record.attempt == attempt.attempt && !record.state.is_terminal() {
                        self.commit(&[TaskChange::Reason {
                            task: attempt.task,
                            reason: Some(format!("runtime {runtime}: {why}")),
                        }])
                        .await?;
                    }
                }
            }
        }
        Ok(ack)
    }

    /// An attempt's node vanished: the attempt is lost (and maybe retried).
    async fn lose_attempt(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
    ) -> Result<(), ServerError> {
        let Some(record) = self.store.get_task(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let reason = match &outcome {
            AttemptOutcome::LaunchFailed { reason, message } => format!("{reason}: {message}"),
            other => format!("{other:?}"),
        };
        let state = if record.cancel_requested {
            TaskState::Cancelled
        } else {
            TaskState::Lost
        };
        self.end_attempt(inner, record, state, Some(reason), None, now(), true)
            .await
    }

    /// One node's part of an attempt ended. A multi-node attempt succeeds when every node
    /// rank has; the first part that does not succeed ends it for all (the others are
    /// withdrawn, so their agents stop them), named in the reason.
    async fn rank_finished(
        &self,
        inner: &mut Inner,
        node: NodeId,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        process_rank: Option<u32>,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        // A node that stopped an attempt because it lost contact with the server failed as
        // a node, not the task: the attempt is lost and follows the retry policy.
        if matches!(&outcome, AttemptOutcome::LaunchFailed { reason, .. } if reason == "node_fenced")
        {
            return self.lose_attempt(inner, attempt, outcome).await;
        }
        let Some(record) = self.store.get_task(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let nodes = record.placements.len() as u32;
        let node_rank = record
            .placements
            .iter()
            .position(|p| p.node == node)
            .map_or(0, |r| r as u32);
        if nodes > 1
            && outcome == (AttemptOutcome::Exited { code: 0 })
            && !record.cancel_requested
            && !inner.preempting.contains(&record.id)
        {
            let done = inner.finished_ranks.entry(attempt).or_default();
            done.insert(node_rank);
            if (done.len() as u32) < nodes {
                return Ok(());
            }
        }
        let processes = inner
            .specs
            .get(&record.id)
            .map_or(1, |spec| spec.resources.processes_per_node());
        let blame = (nodes * processes > 1).then(|| {
            let rank = process_rank.unwrap_or(node_rank * processes);
            let name = inner
                .nodes
                .get(&node)
                .map_or_else(|| node.to_string(), |n| n.record.name.clone());
            if processes > 1 {
                format!(
                    "rank {rank} (node {name}, local rank {})",
                    rank.saturating_sub(node_rank * processes)
                )
            } else {
                format!("rank {rank} (node {name})")
            }
        });
        self.finish_attempt_blaming(inner, attempt, outcome, at, blame)
            .await
    }

    async fn finish_attempt(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        self.finish_attempt_blaming(inner, attempt, outcome, at, None)
            .await
    }

    /// End an attempt as `outcome` says; `blame` names the rank whose end it was when the
    /// attempt had several, and goes into the reason of a failure.
    async fn finish_attempt_blaming(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        at: Timestamp,
        blame: Option<String>,
    ) -> Result<(), ServerError> {
        let Some(record) = self.store.get_task(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let was_preempted = inner.preempting.remove(&record.id);
        if was_preempted && outcome == AttemptOutcome::Cancelled && !record.cancel_requested {
            return self.requeue_preempted(inner, record, at).await;
        }
        let (state, reason, exit_code) = final_state(&outcome, record.cancel_requested);
        let reason = match (state, blame, reason) {
            (TaskState::Failed, Some(blame), Some(reason)) => {
                Some(format!("{blame}: {reason}; the other ranks were stopped"))
            }
            (_, _, reason) => reason,
        };
        self.end_attempt(inner, record, state, reason, exit_code, at, false)
            .await
    }

    /// A preempted attempt has stopped: the task goes back to the queue as a new attempt.
    async fn requeue_preempted(
        &self,
        inner: &mut Inner,
        record: TaskRecord,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        let task = record.id;
        self.commit(&[TaskChange::Transition(Transition {
            reason: Some(format!("preempted during attempt {}", record.attempt)),
            ..Transition::new(
                task,
                record.state,
                TaskState::Queued,
                record.attempt.next(),
                at,
            )
        })])
        .await?;
        let attempt = AttemptRef {
            task,
            attempt: record.attempt,
        };
        for live in inner.nodes.values_mut() {
            // Wake the node's poll: its part of the attempt is withdrawn, so it stops it
            // now (a rank still running when another ended the attempt).
            if live.assignments.remove(&attempt).is_some() {
                live.version.send_modify(|v| *v += 1);
            }
            live.cancelling.remove(&attempt);
        }
        self.drive(inner, Event::TaskPreempted(task)).await;
        self.logs.wake(task);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn end_attempt(
        &self,
        inner: &mut Inner,
        record: TaskRecord,
        state: TaskState,
        reason: Option<String>,
        exit_code: Option<i32>,
        at: Timestamp,
        node_failure: bool,
    ) -> Result<(), ServerError> {
        let task = record.id;
        inner.preempting.remove(&task);
        inner.finished_ranks.remove(&AttemptRef {
            task,
            attempt: record.attempt,
        });
        let spec = inner.specs.get(&task).cloned();
        let retry = spec.as_ref().is_some_and(|spec| {
            let wanted = match state {
                TaskState::Failed => spec.retry.on.contains(&RetryOn::Failed),
                TaskState::Lost => {
                    spec.retry.on.contains(&RetryOn::Lost)
                        || (node_failure && spec.retry.on.contains(&RetryOn::NodeFailure))
                }
                _ => false,
            };
            wanted && record.attempt.0 < spec.retry.max_attempts
        });
        let mut changes = vec![TaskChange::Transition(Transition {
            reason: reason.clone(),
            exit_code,
            ..Transition::new(task, record.state, state, record.attempt, at)
        })];
        if retry {
            changes.push(TaskChange::Transition(Transition {
                reason: Some(format!("retry after attempt {} {}", record.attempt, state)),
                ..Transition::new(task, state, TaskState::Queued, record.attempt.next(), at)
            }));
        }
        self.commit(&changes).await?;
        let attempt = AttemptRef {
            task,
            attempt: record.attempt,
        };
        for live in inner.nodes.values_mut() {
            // Wake the node's poll: its part of the attempt is withdrawn, so it stops it
            // now (a rank still running when another ended the attempt).
            if live.assignments.remove(&attempt).is_some() {
                live.version.send_modify(|v| *v += 1);
            }
            live.cancelling.remove(&attempt);
        }
        self.drive(inner, Event::TaskEnded(task)).await;
        match (retry, spec) {
            (true, Some(spec)) => {
                let group = inner.group_for(&self.config, &record.user);
                let request = request_of(&spec, &record, at, group);
                if inner.nodes.values().any(LiveNode::schedulable) {
                    self.drive(inner, Event::TaskSubmitted { task, request })
                        .await;
                } else {
                    inner.held.insert(task);
                }
            }
            _ => {
                inner.specs.remove(&task);
            }
        }
        self.logs.wake(task);
        Ok(())
    }

    /// Give the scheduler the tasks held while it knew no node, once it knows one.
    async fn release_held(&self, inner: &mut Inner) -> Result<(), ServerError> {
        if inner.held.is_empty() || !inner.nodes.values().any(LiveNode::schedulable) {
            return Ok(());
        }
        let held: Vec<TaskId> = std::mem::take(&mut inner.held).into_iter().collect();
        for task in held {
            let Some(record) = self.store.get_task(task).await? else {
                continue;
            };
            let Some(spec) = inner.specs.get(&task) else {
                continue;
            };
            let group = inner.group_for(&self.config, &record.user);
            let request = request_of(spec, &record, record.submitted_at, group);
            self.drive(inner, Event::TaskSubmitted { task, request })
                .await;
        }
        Ok(())
    }

    /// Tell the scheduler a node is up (and drained, if it is).
    async fn node_joins_scheduler(&self, inner: &mut Inner, node: NodeId) {
        let Some(live) = inner.nodes.get(&node) else {
            return;
        };
        let record = live.record.clone();
        self.drive(inner, Event::NodeUp(node_spec(&record))).await;
        if record.drained {
            self.drive(inner, Event::NodeDrained(record.id)).await;
        }
    }

    /// Mark silent nodes offline and their attempts lost, and hand flapping nodes that
    /// stayed up long enough back to the scheduler. Called periodically.
    pub async fn check_liveness(&self) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let timeout = self.config.heartbeat_timeout;
        // A server that was stalled (stopped, swapped out, a long lock) heard from nobody
        // meanwhile; that silence is its own, not the nodes': their clocks start again.
        let since_last_check = inner.last_liveness_check.elapsed();
        inner.last_liveness_check = Instant::now();
        if since_last_check > LIVENESS_CHECK_EVERY * 3 {
            tracing::warn!(
                "the server did not check node liveness for {}s (was it stopped?): giving \
                 every node a fresh heartbeat period",
                since_last_check.as_secs()
            );
            for live in inner.nodes.values_mut() {
                live.last_seen = Instant::now();
            }
        }
        let stable: Vec<NodeId> = inner
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.online
                    && n.held_back_until
                        .is_some_and(|until| Instant::now() >= until)
            })
            .map(|(id, _)| *id)
            .collect();
        for node in stable {
            if let Some(live) = inner.nodes.get_mut(&node) {
                live.held_back_until = None;
                tracing::info!(
                    "node {} has been stable: it gets work again",
                    live.record.name
                );
            }
            self.node_joins_scheduler(&mut inner, node).await;
            self.release_held(&mut inner).await?;
        }
        let silent: Vec<NodeId> = inner
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.last_seen.elapsed() > timeout && (n.online || !n.assignments.is_empty())
            })
            .map(|(id, _)| *id)
            .collect();
        for node in silent {
            let (name, attempts, was_online) = {
                let Inner {
                    nodes,
                    finished_ranks,
                    ..
                } = &mut *inner;
                let live = nodes.get_mut(&node).expect("listed above");
                let was_online = live.schedulable();
                if live.online {
                    live.losses.retain(|at| at.elapsed() < FLAP_WINDOW);
                    live.losses.push(Instant::now());
                }
                live.online = false;
                live.held_back_until = None;
                // A rank that already finished its part lost nothing with its node.
                let attempts: Vec<AttemptRef> = live
                    .assignments
                    .values()
                    .filter(|a| {
                        !finished_ranks
                            .get(&a.attempt)
                            .is_some_and(|done| done.contains(&a.node_rank))
                    })
                    .map(|a| a.attempt)
                    .collect();
                (live.record.name.clone(), attempts, was_online)
            };
            tracing::warn!("node {name} missed its heartbeat for {timeout:?}: marking it offline");
            self.node_attempts.forget_node(node, &[]);
            if was_online {
                self.drive(&mut inner, Event::NodeDown(node)).await;
            }
            for attempt in attempts {
                let outcome = AttemptOutcome::LaunchFailed {
                    reason: "node_lost".into(),
                    message: format!(
                        "node {name} stopped responding (no heartbeat for {}s)",
                        timeout.as_secs()
                    ),
                };
                self.lose_attempt(&mut inner, attempt, outcome).await?;
            }
        }
        Ok(())
    }

    pub async fn node_views(&self) -> Vec<tacc_proto::NodeView> {
        let inner = self.inner.lock().await;
        inner
            .nodes
            .values()
            .map(|live| {
                let allocated = live
                    .assignments
                    .values()
                    .filter_map(|a| {
                        inner
                            .specs
                            .get(&a.attempt.task)
                            .map(|s| s.resources.per_node())
                    })
                    .fold(Resources::ZERO, |acc, r| acc.add(&r));
                tacc_proto::NodeView {
                    id: live.record.id,
                    name: live.record.name.clone(),
                    capacity: live.record.capacity,
                    allocated,
                    gpu_type: live.record.gpu_type.clone(),
                    labels: live.record.labels.clone(),
                    state: match (live.online, live.record.drained) {
                        (false, _) => "down".into(),
                        (true, _) if live.held_back_until.is_some() => "flapping".into(),
                        (true, false) => "up".into(),
                        (true, true) if live.assignments.is_empty() => "drained".into(),
                        (true, true) => "draining".into(),
                    },
                    last_seen: Timestamp(
                        now()
                            .0
                            .saturating_sub(live.last_seen.elapsed().as_millis() as u64),
                    ),
                    running_tasks: live.assignments.keys().map(|a| a.task).collect(),
                    gpus: self.usage.node_gpus(live.record.id),
                }
            })
            .collect()
    }

    fn node_named(inner: &Inner, name: &str) -> Result<NodeId, ServerError> {
        inner
            .nodes
            .iter()
            .find(|(_, n)| n.record.name == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| {
                ServerError::NotFound(format!(
                    "no node is named `{name}` (list them with `tcloud nodes`)"
                ))
            })
    }

    /// Drain a node: what runs on it finishes, nothing new is placed there. The mark is
    /// durable, so a restarted server keeps the node drained until it is resumed.
    pub async fn drain_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.set_drained(name, true).await
    }

    /// Let a drained node take new tasks again.
    pub async fn resume_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.set_drained(name, false).await
    }

    async fn set_drained(
        &self,
        name: &str,
        drained: bool,
    ) -> Result<tacc_proto::NodeView, ServerError> {
        {
            let mut inner = self.inner.lock().await;
            let id = Self::node_named(&inner, name)?;
            self.store.set_node_drained(id, drained).await?;
            let live = inner.nodes.get_mut(&id).expect("found above");
            let changed = live.record.drained != drained;
            live.record.drained = drained;
            if changed && live.schedulable() {
                let event = if drained {
                    Event::NodeDrained(id)
                } else {
                    Event::NodeResumed(id)
                };
                self.drive(&mut inner, event).await;
            }
        }
        self.node_views()
            .await
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ServerError::NotFound(format!("node `{name}` vanished")))
    }

    /// Forget a node and revoke its credential: it must join again with a join token.
    /// A node that is up and still runs tasks is refused (drain it first); the attempts
    /// of a down node are lost.
    pub async fn remove_node(&self, name: &str) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let id = Self::node_named(&inner, name)?;
        let (online, scheduled, attempts) = {
            let live = &inner.nodes[&id];
            let attempts: Vec<AttemptRef> = live.assignments.keys().copied().collect();
            (live.online, live.schedulable(), attempts)
        };
        if online && !attempts.is_empty() {
            return Err(ServerError::Conflict(format!(
                "node `{name}` still runs {} task(s); drain it (`tcloud admin node drain {name}`) \
                 and wait until they end, or remove it once it is down",
                attempts.len()
            )));
        }
        if scheduled {
            self.drive(&mut inner, Event::NodeDown(id)).await;
        }
        for attempt in attempts {
            let outcome = AttemptOutcome::LaunchFailed {
                reason: "node_removed".into(),
                message: format!("node {name} was removed by an administrator"),
            };
            self.lose_attempt(&mut inner, attempt, outcome).await?;
        }
        self.node_attempts.forget_node(id, &[]);
        if let Some(live) = inner.nodes.remove(&id) {
            // Wake a waiting poll so the agent hears at once that its node is gone.
            live.version.send_modify(|v| *v += 1);
        }
        self.store.remove_node(id).await?;
        let at = now();
        for token in self.store.list_tokens(None).await? {
            if token.kind == tacc_store::TokenKind::Node
                && token.node == Some(id)
                && token.revoked_at.is_none()
            {
                self.store.revoke_token(token.id, at).await?;
            }
        }
        self.auth.forget();
        Ok(())
    }

    /// Why a task is where it is, in the scheduler's words and the store's.
    pub async fn explain(&self, task: TaskId) -> Result<tacc_proto::TaskExplanation, ServerError> {
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
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
        match inner.scheduler.explain(task) {
            Explanation::Queued {
                position: at,
                estimated_start: start,
                reason,
                ..
            } => {
                position = Some(at as u64);
                estimated_start = start;
                let waits_for_node = matches!(
                    reason,
                    Some(tacc_scheduler::PendingReason::NoMatchingNode { .. })
                );
                if waits_for_node && let Some(spec) = inner.specs.get(&task) {
                    details.push(crate::node_selector::advice(&crate::node_selector::of(
                        spec,
                    )));
                } else if start.is_none() {
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
            details.push(
                "no node is online yet; start an agent (`taccd agent`) or `tcloud up`".to_string(),
            );
        }
        Ok(tacc_proto::TaskExplanation {
            task_id: task,
            state: record.state,
            reason: record.reason,
            queue_position: position,
            estimated_start,
            policy: inner.scheduler.policy_name().to_string(),
            details,
        })
    }

    /// The scheduler's fair-share standing as of `at` (see `tacc_scheduler::Scheduler::standing`).
    pub(crate) async fn fairshare_standing(
        &self,
        at: Timestamp,
    ) -> tacc_scheduler::FairShareStanding {
        self.inner.lock().await.scheduler.standing(at)
    }

    /// The scheduler's start estimate for a queued task.
    pub async fn estimated_start(&self, task: TaskId) -> Option<Timestamp> {
        match self.inner.lock().await.scheduler.explain(task) {
            Explanation::Queued {
                estimated_start, ..
            } => estimated_start,
            _ => None,
        }
    }

    pub async fn node_names(&self) -> BTreeMap<NodeId, String> {
        self.inner
            .lock()
            .await
            .nodes
            .iter()
            .map(|(id, n)| (*id, n.record.name.clone()))
            .collect()
    }

    pub async fn record_output(&self, output: OutputRecord) -> Result<(), ServerError> {
        Ok(self.store.add_output(output).await?)
    }
}

fn node_spec(record: &NodeRecord) -> NodeSpec {
    NodeSpec {
        id: record.id,
        capacity: record.capacity,
        gpu_type: record.gpu_type.clone(),
        labels: record.labels.clone(),
    }
}

/// One assignment per node of a placed attempt, rank 0 being the master.
fn assignments_for(
    record: &TaskRecord,
    spec: &TaskSpec,
    nodes: &BTreeMap<NodeId, LiveNode>,
    unix_user: Option<&String>,
    secrets: &BTreeMap<String, String>,
) -> Vec<(NodeId, Assignment)> {
    let mut instruction: Instruction = tacc_compiler::compile(
        record.id,
        record.attempt,
        &record.user,
        spec,
        record.snapshot.clone(),
    );
    instruction.unix_user = unix_user.cloned();
    let instruction = serde_json::to_value(&instruction).expect("instructions serialise");
    let master = record.placements.first().map(|p| p.node);
    let master_addr = master
        .and_then(|node| nodes.get(&node))
        .map_or_else(|| "127.0.0.1".to_string(), |n| n.record.address.clone());
    let attempt = AttemptRef {
        task: record.id,
        attempt: record.attempt,
    };
    let master_port = free_master_port(nodes, master, attempt);
    record
        .placements
        .iter()
        .enumerate()
        .map(|(rank, placement)| {
            (
                placement.node,
                Assignment {
                    attempt,
                    instruction: instruction.clone(),
                    node_rank: rank as u32,
                    gpu_indices: placement.gpu_indices.clone(),
                    master_addr: master_addr.clone(),
                    master_port,
                    secrets: secrets.clone(),
                },
            )
        })
        .collect()
}

/// A rendezvous port for `attempt` on its rank 0's node that no other attempt whose rank
/// 0 runs there holds. The search starts at a point derived from the attempt, so the
/// same attempt gets the same port when a restarted server rebuilds its assignments.
fn free_master_port(
    nodes: &BTreeMap<NodeId, LiveNode>,
    master: Option<NodeId>,
    attempt: AttemptRef,
) -> u16 {
    let taken: BTreeSet<u16> = master
        .and_then(|node| nodes.get(&node))
        .map(|live| {
            live.assignments
                .values()
                .filter(|a| a.node_rank == 0 && a.attempt != attempt)
                .map(|a| a.master_port)
                .collect()
        })
        .unwrap_or_default();
    let span = u64::from(MASTER_PORTS.end - MASTER_PORTS.start);
    let start = attempt
        .task
        .0
        .wrapping_mul(31)
        .wrapping_add(u64::from(attempt.attempt.0))
        % span;
    (0..span)
        .map(|i| MASTER_PORTS.start + ((start + i) % span) as u16)
        .find(|port| !taken.contains(port))
        .unwrap_or(MASTER_PORTS.start)
}

fn report_kind(report: &AgentReport) -> &'static str {
    match report {
        AgentReport::Log { .. } => "log",
        AgentReport::Started { .. } => "started",
        AgentReport::Finished { .. } => "finished",
        AgentReport::RuntimeChosen { .. } => "runtime",
        AgentReport::Usage(_) => "usage",
    }
}
