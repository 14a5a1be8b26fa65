//! The control plane: durable task lifecycle, the scheduler driven with real time, node
//! liveness, and the desired work of every node, in the reactor shape of HyperQueue's
//! `tako` (docs/ARCHITECTURE.md, "One turn of the control plane"). This file holds
//! [`Control`], its construction and recovery, and its entry points, each of which reads
//! the facts its handler needs (`facts/`), runs one turn (`shell.rs`) and answers; the
//! decisions are the handlers' (`handlers/`, pure, over the plain [`Core`]). `impl Control`
//! lives here and in `shell.rs` only (`taccd/tests/architecture.rs`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rules::admission::Admission;
use tacc_compiler::DirChunkStore;
use tacc_core::{NodeId, SnapshotId, TaskId, TaskState, Timestamp};
use tacc_proto::{AgentReport, AttemptRef, DesiredWork, RegisterAgent};
use tacc_scheduler::{Plan, Scheduler, TaskRequest};
use tacc_schema::TaskSpec;
use tacc_store::TaskChange;
use tacc_store::{
    NewNode, NewTask, NodeEnrolment, NodeRecord, OutputRecord, Store, TaskFilter, TaskRecord,
};
use tokio::sync::Mutex;
use tokio::sync::watch;

use crate::ServerError;
use crate::clock::{Clock, SystemClock};
use comm::{Comm, WatchComm};
use effects::Effects;
use handlers::poll::PollRefused;

mod adaptive;
#[cfg(test)]
mod adaptive_lifecycle_tests;
mod core;
pub(crate) use self::core::{Core, LiveNode};
mod comm;
mod effects;
mod estimates;
mod explain;
mod facts;
pub(crate) use facts::{Facts, GroupShape};
mod config;
#[cfg(test)]
mod gpu_lifecycle_tests;
mod groups;
mod handlers;
#[cfg(test)]
mod lifecycle_tests;
mod nodes;
mod pipelines;
mod records;
mod requests;
use config::SIMULATOR_ONLY_POLICIES;
pub use config::{DEFAULT_POLICY, DEFAULT_TASK_UID_BASE, ServerConfig};
use requests::{placements_of, request_for, request_of, spec_of};
mod resume;
mod retry;
mod rules;
mod shell;
mod submission;
mod sweeps;
mod task_accounts;
mod workflow_parts;
pub(crate) use estimates::Estimates;
pub(crate) use submission::Submission;
pub use submission::SubmitOptions;
pub(crate) use task_accounts::TaskAccount;
#[cfg(test)]
mod reactor_env;
#[cfg(test)]
mod reactor_tests;
#[cfg(test)]
mod test_env;
#[cfg(test)]
mod workflow_tests;

use crate::logs::LogBook;
pub use adaptive::{AdaptiveConfig, AdaptiveMode, DefaultBounds};
pub(crate) use groups::Arrays;
pub use nodes::LIVENESS_CHECK_EVERY;
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
    /// Followers of groups, woken once a commit ending some of a group's elements is
    /// applied (`GET /v1/groups/{id}?wait_ms=…`).
    pub(crate) group_ends: crate::group_ends::GroupEnds,
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
    pub(crate) accounts: task_accounts::TaskAccounts,
    /// The control plane's time: the system's in a server, a manual one in lifecycle tests.
    pub(crate) clock: Arc<dyn Clock>,
    /// How decisions reach the nodes (see `comm.rs`).
    comm: Arc<dyn Comm>,
    pub(crate) inner: Mutex<Core>,
    /// Every change committed, in order, for the lifecycle tests' `take_changes`.
    #[cfg(test)]
    pub(crate) committed: std::sync::Mutex<Vec<tacc_store::TaskChange>>,
    /// Each wake of a task's log followers with how many changes were committed by then,
    /// for the lifecycle tests (followers must find what woke them committed).
    #[cfg(test)]
    pub(crate) followers_woken: std::sync::Mutex<Vec<(TaskId, usize)>>,
}

// ---- Construction, recovery, and the entry points for tasks ----

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
            group_ends: Default::default(),
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
            accounts: task_accounts::TaskAccounts::new(
                store.clone(),
                config.unix_users.clone(),
                config.task_uid_base,
            ),
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
            #[cfg(test)]
            followers_woken: Default::default(),
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
                        account: self.accounts.of(&record.user).await,
                        secrets: self
                            .secret_box
                            .task_secrets(&*self.store, &self.logs, &record, &spec)
                            .await,
                        inputs: self.facts.attempt_inputs(&record).await?,
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
            let mut fx = Effects::default();
            handlers::reload::on_expected_back(inner, &mut fx, &self.config, running);
            self.carry(inner, fx).await?;
            let kept = self.facts.fairshare_ledgers().await?;
            handlers::reload::on_fairshare_restored(inner, kept, self.clock.now());
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
            let mut fx = Effects::default();
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
            let mut fx = Effects::default();
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

    /// Why `task` is where it is, with its start estimate (from `estimates`' projection).
    pub(crate) async fn explain(
        &self,
        task: TaskId,
        estimates: &Estimates,
    ) -> Result<tacc_proto::TaskExplanation, ServerError> {
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
        let projection = estimates.projection().await;
        let now = self.clock.now();
        let core = self.inner.lock().await;
        let explained = explain::explain(
            &core,
            &record,
            &projection,
            now,
            self.config.node_stable_after,
        );
        drop(core);
        let explain::Explained {
            details,
            position,
            estimated_start,
            mut start_estimate,
            what_if,
            likely_copy,
            policy,
        } = explained;
        if let (Some(view), Some(copy)) = (start_estimate.as_mut(), likely_copy) {
            view.likely = estimates
                .likely_start(copy, task, &view.latest, now)
                .await?;
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
            adaptive: self.facts.adaptive_view(task, &self.adaptive).await.ok(),
        })
    }

    /// The scheduler's fair-share standing as of `at` (see `tacc_scheduler::Scheduler::standing`).
    pub(crate) async fn fairshare_standing(
        &self,
        at: Timestamp,
    ) -> tacc_scheduler::FairShareStanding {
        self.inner.lock().await.scheduler.standing(at)
    }

    pub async fn record_output(&self, output: OutputRecord) -> Result<(), ServerError> {
        Ok(self.store.add_output(output).await?)
    }
}

// ---- Entry points: nodes (registration, polls, liveness, administration, listing) ----

impl Control {
    /// An agent (re)registers. Attempts the server placed on this node that the agent does
    /// not report are lost: their processes are gone with the agent's previous life.
    /// `enrolment` is set when the node enrols with a join token (see `enrolment`).
    pub async fn register_agent(
        &self,
        registration: RegisterAgent,
        enrolment: Option<NodeEnrolment>,
    ) -> Result<NodeRecord, ServerError> {
        self.turn(async |inner: &mut Core| {
            let record = self
                .store
                .register_node(NewNode {
                    name: registration.name.clone(),
                    capacity: registration.capacity,
                    gpu_type: registration.gpu_type.clone(),
                    labels: registration.labels.clone(),
                    address: registration.address.clone(),
                    registered_at: self.clock.now(),
                    enrolment,
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
            let claimed: BTreeSet<AttemptRef> = registration.running.iter().copied().collect();
            self.node_attempts
                .forget_node(record.id, &registration.running);
            self.log_offsets.registered(record.id, registration.life);
            let mut fx = Effects::default();
            let lost = handlers::register::on_register(
                inner,
                &mut fx,
                handlers::register::Registration {
                    record: record.clone(),
                    claimed: claimed.clone(),
                    active,
                    seen: self.clock.instant(),
                    config: &self.config,
                },
            );
            self.carry(inner, fx).await?;
            for (attempt, outcome) in lost {
                self.lose_attempt(inner, attempt, outcome).await?;
            }
            self.release_held(inner).await?;
            let mut fx = Effects::default();
            handlers::register::on_claims_settled(inner, &mut fx, record.id, claimed);
            self.carry(inner, fx).await?;
            Ok(record)
        })
        .await
    }

    /// A node's poll for its work, answered now; it also counts as the node's heartbeat.
    /// `running` is what the agent ran when it had applied version `after` of its work: a
    /// cancelled attempt it does not run (it never received it, or already stopped it) is
    /// cancelled here, since no report about it will come — judged only when no newer
    /// version reached the node since (`NodeAttempts::knows_its_work`). The answer is its
    /// desired work, which attempts it was handed (so their reports and outputs are
    /// accepted), and the questions waiting for it.
    pub async fn poll_work(
        &self,
        node: NodeId,
        after: Option<u64>,
        running: &[AttemptRef],
    ) -> Result<(DesiredWork, watch::Receiver<u64>), ServerError> {
        let handed = self
            .turn_then(
                async |core: &mut Core| self.on_node_poll(core, node, after, running).await,
                |core, ()| core.map(|core| self.hand_work(core, node, after, running)),
            )
            .await?;
        let Some(handed) = handed else {
            return Err(ServerError::Unavailable(
                "the server is rebuilding its state after a failed commit; poll again".into(),
            ));
        };
        let (mut work, changes) = handed.map_err(|refusal| poll_refused(node, refusal))?;
        work.requests = self.node_requests.take(node);
        Ok((work, changes))
    }

    /// Whether a poll of `node` held open should stay open at version `version`: that
    /// version was already handed to the node with a report batch's answer. (Asked under
    /// the core's lock, so a turn that changes the node's work and hands it over in its
    /// answer is seen whole.)
    pub async fn already_handed(&self, node: NodeId, version: u64) -> bool {
        let _core = self.inner.lock().await;
        self.node_attempts.has_delivered(node, version)
    }

    /// The part of a poll (or of a report batch that asks for its work) that changes the
    /// core: the heartbeat, and the cancels the node's list shows settled.
    async fn on_node_poll(
        &self,
        core: &mut Core,
        node: NodeId,
        after: Option<u64>,
        running: &[AttemptRef],
    ) -> Result<(), ServerError> {
        let knows = self.node_attempts.knows_its_work(node, after);
        let Ok(settled) = handlers::poll::on_poll(core, node, running, knows, self.clock.instant())
        else {
            // Refused: `hand_work` says why.
            return Ok(());
        };
        let mut fx = Effects::default();
        for attempt in settled {
            if let Some(record) = self.facts.task_record(attempt.task).await? {
                handlers::poll::on_cancel_settled(
                    core,
                    &mut fx,
                    &self.config,
                    record,
                    attempt,
                    self.clock.now(),
                );
            }
        }
        self.carry(core, fx).await
    }

    /// The node's desired work as the turn left it, handed over: its version is taken
    /// with it under the core's lock (a version read later could name a change these
    /// assignments lack, and the agent would wait for it in vain), and recorded as the
    /// node's (`NodeAttempts::sync`).
    fn hand_work(
        &self,
        core: &mut Core,
        node: NodeId,
        after: Option<u64>,
        running: &[AttemptRef],
    ) -> Result<(DesiredWork, watch::Receiver<u64>), PollRefused> {
        let knows = self.node_attempts.knows_its_work(node, after);
        let desired = handlers::poll::on_work(core, node, running)?;
        if desired.released {
            // The work held back is due: a poll held open is answered too.
            self.comm.work_changed(node);
        }
        let changes = self.comm.work_version(node);
        let version = *changes.borrow();
        self.node_attempts.sync(
            node,
            knows.then_some(running),
            version,
            &desired.assignments,
        );
        Ok((
            DesiredWork {
                version,
                assignments: desired.assignments,
                requests: Vec::new(),
            },
            changes,
        ))
    }

    pub async fn touch(&self, node: NodeId) {
        if let Some(live) = self.inner.lock().await.nodes.get_mut(&node) {
            live.last_seen = self.clock.instant();
        }
    }

    /// Mark silent nodes offline and their attempts lost, and hand flapping nodes that
    /// stayed up long enough back to the scheduler. Called periodically.
    pub async fn check_liveness(&self) -> Result<(), ServerError> {
        self.turn(async |inner: &mut Core| {
            let mut fx = Effects::default();
            let tick = handlers::liveness::on_liveness_tick(
                inner,
                &mut fx,
                self.clock.instant(),
                self.config.heartbeat_timeout,
            );
            handlers::liveness::on_restart_facts_due(
                inner,
                &mut fx,
                self.clock.now(),
                self.clock.instant(),
            );
            self.carry(inner, fx).await?;
            for node in tick.lost_nodes {
                self.node_attempts.forget_node(node, &[]);
            }
            for (attempt, outcome) in tick.lost_attempts {
                self.lose_attempt(inner, attempt, outcome).await?;
            }
            self.release_held(inner).await?;
            self.end_hung_attempts(inner).await?;
            self.apply_idle_gpu_policy(inner).await?;
            let mut fx = Effects::default();
            handlers::liveness::on_retries_due(inner, &mut fx, self.clock.now());
            self.carry(inner, fx).await?;
            Ok(())
        })
        .await
    }

    pub async fn node_views(&self) -> Vec<tacc_proto::NodeView> {
        let core = self.inner.lock().await;
        nodes::node_views(&core, self.clock.now(), self.clock.instant(), |node| {
            self.usage.node_gpus(node)
        })
    }

    fn node_named(inner: &Core, name: &str) -> Result<NodeId, ServerError> {
        handlers::node_admin::node_named(inner, name).ok_or_else(|| {
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
        self.turn(async |core: &mut Core| {
            let id = Self::node_named(core, name)?;
            self.store.set_node_drained(id, drained).await?;
            let mut fx = Effects::default();
            handlers::node_admin::on_drain(core, &mut fx, id, drained);
            self.carry(core, fx).await
        })
        .await?;
        self.node_view(name).await
    }

    /// Approve a node that enrolled while approval is required: it gets work from now on
    /// (unless drained). Approving a node that waits for nothing changes nothing.
    pub async fn approve_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.turn(async |core: &mut Core| {
            let id = Self::node_named(core, name)?;
            self.store.approve_node(id).await?;
            let mut fx = Effects::default();
            let released = handlers::node_admin::on_approve(core, &mut fx, id);
            self.carry(core, fx).await?;
            if released {
                self.release_held(core).await?;
            }
            Ok(())
        })
        .await?;
        self.node_view(name).await
    }

    async fn node_view(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
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
        let id = self
            .turn(async |core: &mut Core| {
                let id = Self::node_named(core, name)?;
                let mut fx = Effects::default();
                let lost = handlers::node_admin::on_remove(core, &mut fx, id).map_err(|still| {
                    ServerError::Conflict(format!(
                        "node `{name}` still runs {} task(s); drain it (`tcloud admin node drain \
                         {name}`) and wait until they end, or remove it once it is down",
                        still.tasks
                    ))
                })?;
                self.carry(core, fx).await?;
                for (attempt, outcome) in lost {
                    self.lose_attempt(core, attempt, outcome).await?;
                }
                self.node_attempts.forget_node(id, &[]);
                handlers::node_admin::on_forget(core, id);
                Ok(id)
            })
            .await?;
        // Answers a waiting poll, so the agent hears at once that its node is gone.
        self.comm.node_removed(id);
        self.store.remove_node(id).await?;
        let at = self.clock.now();
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

    /// Every node's name, by id.
    pub async fn node_names(&self) -> BTreeMap<NodeId, String> {
        self.inner
            .lock()
            .await
            .nodes
            .iter()
            .map(|(id, n)| (*id, n.record.name.clone()))
            .collect()
    }
}

/// Why a node's poll (or its report batch's ask for work) gets no work, as the API says it.
fn poll_refused(node: NodeId, refusal: PollRefused) -> ServerError {
    match refusal {
        PollRefused::UnknownNode => ServerError::NodeNotFound(node),
        PollRefused::NotRegistered => ServerError::NodeNotRegistered(node),
    }
}

// ---- Entry points: agents' reports ----

impl Control {
    /// Apply an agent's report batch, in order, as one turn (`shell.rs`): one
    /// scheduling decision for everything the batch ended, not one per attempt (with a
    /// long queue each decision walks it, and a batch may end dozens), and one transaction
    /// for the batch's changes and that decision's plan.
    ///
    /// A batch that asks for the node's work (`since`) is answered with it when it is
    /// not the version the agent has: what the turn decided — the next task on the slot
    /// an ended one freed — reaches the node in this answer, without waking its poll.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: Vec<AgentReport>,
        since: Option<tacc_proto::WorkSince>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let since = since.as_ref();
        self.turn_then(
            async |core: &mut Core| {
                match core.nodes.get_mut(&node) {
                    Some(live) => live.last_seen = self.clock.instant(),
                    None => return Err(ServerError::NodeNotFound(node)),
                }
                let ack = self.apply_reports(core, node, reports).await?;
                if let Some(since) = since {
                    self.on_node_poll(core, node, since.after, &since.running)
                        .await?;
                }
                Ok(ack)
            },
            |core, mut ack| {
                if let (Some(core), Some(since)) = (core, since) {
                    // A node that must register first gets its work from its poll.
                    if let Ok((work, _)) = self.hand_work(core, node, since.after, &since.running)
                        && since.after != Some(work.version)
                    {
                        ack.work = Some(work);
                    }
                }
                ack
            },
        )
        .await
    }

    /// The body of a report batch's turn: each report checked against its attempt,
    /// then applied through its handler.
    async fn apply_reports(
        &self,
        inner: &mut Core,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let mut ack = tacc_proto::ReportsAck::default();
        for report in reports {
            if let AgentReport::Usage(sample) = report {
                let attempt = sample.attempt;
                let kept = sample.clone();
                let record = self.facts.task_record(sample.attempt.task).await?;
                let accepted = self.usage.accept(
                    &*self.store,
                    &self.metrics,
                    &*self.clock,
                    record.as_ref(),
                    node,
                    sample,
                );
                if accepted.await? {
                    self.adapt(inner, &kept).await;
                    ack.accepted += 1;
                } else {
                    ack.rejected += 1;
                    self.audit_rejected(
                        node,
                        attempt,
                        "usage report for a rank this node does not run".into(),
                    );
                }
                continue;
            }
            // Never trust the other side: a report counts only for an attempt of this
            // node's own, and an ending only while the attempt has not ended yet.
            let (attempt, ending) = rules::admission::subject(&report);
            let record = self.facts.task_record(attempt.task).await?;
            let current =
                crate::agent_access::attempt_is_on_node(record.as_ref(), node, attempt, !ending);
            // The node's own end of an attempt it held, and its last lines, count even
            // when the task has moved on (another rank ended it, a retry, a preemption).
            // (Its output record is kept past the end: a resent batch that carried the end
            // also carries lines already appended.)
            let held = if ending {
                self.node_attempts.finish(node, attempt)
            } else {
                self.node_attempts.rank_of(node, attempt).is_some()
            };
            let admission = rules::admission::admit(current, held);
            if admission == Admission::LastWord {
                ack.accepted += 1;
                if let AgentReport::Log {
                    attempt,
                    text,
                    offset,
                } = &report
                {
                    self.append_output(node, *attempt, text, *offset)?;
                }
                continue;
            }
            if admission == Admission::Reject {
                ack.rejected += 1;
                self.audit_rejected(node, attempt, rules::admission::rejection(&report));
                continue;
            }
            ack.accepted += 1;
            match report {
                AgentReport::Log {
                    attempt,
                    text,
                    offset,
                } => {
                    self.append_output(node, attempt, &text, offset)?;
                }
                AgentReport::Started { attempt, at } => {
                    let Some(record) = self.facts.task_record(attempt.task).await? else {
                        continue;
                    };
                    let mut fx = Effects::default();
                    handlers::started::on_started(inner, &mut fx, &record, attempt, at);
                    self.carry(inner, fx).await?;
                }
                AgentReport::Finished {
                    attempt,
                    at,
                    outcome,
                    rank,
                } => {
                    let record = self.facts.task_record(attempt.task).await?;
                    self.usage
                        .end_rank(&*self.store, record.as_ref(), node, attempt, &outcome, at)
                        .await?;
                    self.adaptive.end(attempt);
                    self.rank_finished(inner, node, attempt, outcome, rank, at)
                        .await?;
                }
                AgentReport::Usage(_) => {}
                AgentReport::Metrics { attempt, points } => {
                    let points = rules::sweeps::metric_points(attempt, points, self.clock.now());
                    self.store.append_metrics(points).await?;
                }
                AgentReport::Resized {
                    attempt,
                    cpu_millis,
                    memory_bytes,
                    error,
                } => {
                    let applied = self.adaptive.allocation(attempt).map_or(
                        tacc_core::Resources::new(cpu_millis, memory_bytes, 0),
                        |r| tacc_core::Resources::new(cpu_millis, memory_bytes, r.gpus),
                    );
                    self.resized_on_node(inner, node, attempt, applied, error)
                        .await;
                }
                AgentReport::RuntimeChosen {
                    attempt,
                    runtime,
                    why,
                } => {
                    let Some(record) = self.facts.task_record(attempt.task).await? else {
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

    /// A report refused (not this node's, or stale), in the audit trail.
    fn audit_rejected(&self, node: NodeId, attempt: AttemptRef, why: String) {
        self.audit.record_as(
            format!("node:{node}"),
            "report.rejected",
            format!("task:{}/{}", attempt.task, attempt.attempt),
            false,
            why,
        );
    }

    /// A node's output of an attempt into the task's log (once: see `log_offsets`).
    fn append_output(
        &self,
        node: NodeId,
        attempt: AttemptRef,
        text: &str,
        offset: Option<u64>,
    ) -> Result<(), ServerError> {
        self.log_offsets
            .append_once(&self.logs, node, attempt, text, offset)
            .map_err(|e| {
                ServerError::io(format!("cannot write the log of task {}", attempt.task), e)
            })
    }
}

// ---- Entry points: adaptive allocation and estimates ----

impl Control {
    /// A usage sample of a running attempt was accepted, in the reports' turn: the
    /// adaptive book judges rank 0's, keeps a signal point when one is due, and the
    /// policy may move the attempt (`handlers::resize`).
    pub(super) async fn adapt(&self, core: &mut Core, sample: &tacc_proto::UsageSample) {
        let task = sample.attempt.task;
        let requested = match core.specs.get(&task) {
            Some(spec) if sample.node_rank == 0 => spec.resources.per_node(),
            _ => return,
        };
        let now = self.clock.now();
        let mut observed = self.adaptive.observe(sample, now, requested);
        if let Some(point) = observed.point.take() {
            let kept = adaptive::POINTS_KEPT;
            if let Err(e) = self.store.record_signal_point(point, kept).await {
                tracing::warn!("cannot keep a signal point of task {task}: {e}");
            }
        }
        let Some(judged) = observed.judged(sample.attempt) else {
            return;
        };
        let mut fx = effects::Effects::default();
        let policy = self.adaptive.policy();
        let decided = handlers::resize::on_sample(core, &mut fx, now, policy, judged);
        if let Some(decided) = &decided {
            self.adaptive.changed(sample.attempt, decided, now);
        }
        self.carry_resize(core, fx, decided.map(|d| d.plan)).await;
    }

    /// An agent applied (or could not apply: `error`) a new allocation of `attempt`; one
    /// it could not is undone where it fits (`handlers::resize::on_resize_failed`).
    pub(super) async fn resized_on_node(
        &self,
        core: &mut Core,
        node: tacc_core::NodeId,
        attempt: AttemptRef,
        applied: tacc_core::Resources,
        error: Option<String>,
    ) {
        let Some(pending) = self.adaptive.confirmed(attempt, error.as_deref()) else {
            return;
        };
        let Some(error) = error else {
            return;
        };
        let failed = handlers::resize::ResizeFailed {
            node,
            attempt,
            applied,
            error,
            before: pending.map(|(before, _)| before),
            at: self.clock.now(),
        };
        let mut fx = effects::Effects::default();
        let undone = handlers::resize::on_resize_failed(core, &mut fx, failed);
        if let Some((back, _)) = &undone {
            self.adaptive.moved(attempt, *back);
        }
        self.carry_resize(core, fx, undone.map(|(_, plan)| plan))
            .await;
    }

    /// Carry out a resize's effects, then what the scheduler planned of it (a shrink may
    /// start queued tasks); a plan that cannot be recorded rebuilds the scheduler.
    async fn carry_resize(&self, core: &mut Core, fx: effects::Effects, plan: Option<Plan>) {
        let mut carried = self.carry(core, fx).await;
        if let (Ok(()), Some(plan)) = (&carried, plan) {
            carried = self.carry_out(core, plan).await;
        }
        if let Err(e) = carried {
            tracing::error!(
                "could not record a resize or its plan, rebuilding from the store: {e}"
            );
            self.resync(core).await;
        }
    }

    /// A copy of the scheduler as it stands, for projections off the control plane's
    /// lock (`estimates.rs`); `None` when its epoch is still `unless_epoch` (the caller's
    /// projection of it holds).
    pub(crate) async fn scheduler_copy(&self, unless_epoch: Option<u64>) -> Option<Scheduler> {
        let core = self.inner.lock().await;
        (unless_epoch != Some(core.scheduler.epoch())).then(|| core.scheduler.clone())
    }
}

// ---- Entry points: the workflows (pipelines, sweeps, arrays) ----

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
