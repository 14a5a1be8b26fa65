//! The lifecycle test environment: the control plane over a `MemoryStore`, on a manual
//! clock, with fake agents that register, poll and report through the same calls the
//! HTTP handlers make — no process, socket or sleep. A heartbeat timeout, a stalled
//! server, a retry backoff or a server restart is one step of a test, so each lifecycle
//! case runs deterministically in milliseconds (`lifecycle_tests.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tacc_core::{NodeId, Resources, SnapshotId, TaskId, TaskState, Timestamp};
use tacc_proto::{AgentReport, Assignment, AttemptOutcome, AttemptRef, RegisterAgent};
use tacc_store::{MemoryStore, Store, TaskChange, TaskEvent, TaskRecord};

use super::comm::{Comm, WatchComm};
use super::{Control, ServerConfig};
use crate::clock::{Clock, ManualClock};

/// The heartbeat timeout of the environment's server.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(30);

pub(super) struct TestEnv {
    pub(super) control: Arc<Control>,
    pub(super) clock: Arc<ManualClock>,
    comm: Arc<RecordingComm>,
    store: Arc<MemoryStore>,
    config: ServerConfig,
    snapshot: SnapshotId,
    _data: tempfile::TempDir,
}

/// The server's [`WatchComm`], and a record of every node it woke.
#[derive(Debug, Default)]
struct RecordingComm {
    watches: WatchComm,
    woken: std::sync::Mutex<Vec<NodeId>>,
}

impl Comm for RecordingComm {
    fn work_changed(&self, node: NodeId) {
        self.woken.lock().unwrap().push(node);
        self.watches.work_changed(node);
    }

    fn work_version(&self, node: NodeId) -> tokio::sync::watch::Receiver<u64> {
        self.watches.work_version(node)
    }

    fn node_removed(&self, node: NodeId) {
        self.woken.lock().unwrap().push(node);
        self.watches.node_removed(node);
    }
}

/// What an agent process would hold: its node, and the attempts it runs or ran.
#[derive(Debug)]
pub(super) struct FakeAgent {
    pub(super) node: NodeId,
    pub(super) name: String,
    /// Attempts it runs, or that ended and whose end it has not delivered yet.
    pub(super) running: BTreeSet<AttemptRef>,
    log_written: u64,
    /// This agent process's life (`RegisterAgent::life`).
    pub(super) life: u64,
    /// The GPUs it offers.
    pub(super) gpus: u32,
    /// The version of its desired work it got last (none since it registered).
    pub(super) work_version: std::cell::Cell<Option<u64>>,
}

impl TestEnv {
    pub(super) async fn new() -> TestEnv {
        TestEnv::configured(|_| {}).await
    }

    /// A TestEnv whose server runs with `configure`'s changes to the test configuration.
    pub(super) async fn configured(configure: impl FnOnce(&mut ServerConfig)) -> TestEnv {
        let data = tempfile::tempdir().expect("a temporary data directory");
        let mut config = ServerConfig::new(data.path().to_path_buf());
        config.heartbeat_timeout = HEARTBEAT;
        configure(&mut config);
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
        let snapshot = SnapshotId::try_from("ab".repeat(32)).expect("a snapshot id");
        store
            .put_snapshot(&snapshot, &serde_json::json!({"files": []}), 0, clock.now())
            .await
            .expect("the snapshot is stored");
        let comm = Arc::new(RecordingComm::default());
        let control =
            Control::open_with(store.clone(), config.clone(), clock.clone(), comm.clone())
                .await
                .expect("the control plane opens");
        TestEnv {
            control,
            clock,
            comm,
            store,
            config,
            snapshot,
            _data: data,
        }
    }

    /// The server process dies and a new one opens the same store (and data directory):
    /// everything it held only in memory is gone.
    pub(super) async fn restart_server(&mut self) {
        self.comm = Arc::new(RecordingComm::default());
        self.control = Control::open_with(
            self.store.clone(),
            self.config.clone(),
            self.clock.clone(),
            self.comm.clone(),
        )
        .await
        .expect("the control plane reopens");
    }

    /// The nodes told their work changed since the last call, in order, with repeats.
    pub(super) fn woken(&self) -> Vec<NodeId> {
        std::mem::take(&mut *self.comm.woken.lock().unwrap())
    }

    /// The next `count` commits fail, as with a database that cannot be reached.
    pub(super) fn fail_next_commits(&self, count: u32) {
        self.store.fail_next_applies(count);
    }

    /// The store changes committed since the last call, in order (tako's `take_changes`).
    pub(super) fn take_changes(&self) -> Vec<TaskChange> {
        std::mem::take(&mut *self.control.committed.lock().unwrap())
    }

    /// The transitions among [`TestEnv::take_changes`], as `(task, from, to)`.
    pub(super) fn take_transitions(&self) -> Vec<(TaskId, TaskState, TaskState)> {
        self.take_changes()
            .into_iter()
            .filter_map(|change| match change {
                TaskChange::Transition(t) => Some((t.task, t.from, t.to)),
                _ => None,
            })
            .collect()
    }

    /// Once every task has ended, the core holds nothing about any of them: no spec,
    /// wait, reason, assignment or deferred event, and no placed task's copy.
    pub(super) async fn emptiness_check(&self) {
        let core = self.control.inner.lock().await;
        let left = core.leftovers();
        assert!(left.is_empty(), "the core still holds: {}", left.join("; "));
        assert!(
            self.control.placed.is_empty(),
            "placed copies are left of ended tasks"
        );
    }

    /// What a poll of `agent` held open waits on (see [`Comm::work_version`]).
    pub(super) fn held_poll(&self, agent: &FakeAgent) -> tokio::sync::watch::Receiver<u64> {
        self.comm.work_version(agent.node)
    }

    pub(super) fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// `seconds` pass as in a server: every second the liveness check runs, after the
    /// agents in `polling` polled (the others are silent).
    pub(super) async fn pass_seconds(&self, seconds: u64, polling: &mut [&mut FakeAgent]) {
        for _ in 0..seconds {
            self.advance(Duration::from_secs(1));
            for agent in polling.iter_mut() {
                self.poll(agent).await;
            }
            self.check_liveness().await;
        }
    }

    /// A whole heartbeat term and a second more pass: an agent not polling is lost.
    pub(super) async fn pass_a_term(&self, polling: &mut [&mut FakeAgent]) {
        self.pass_seconds(HEARTBEAT.as_secs() + 1, polling).await;
    }

    /// Submit `yaml` and have `agent` take and start its attempt.
    pub(super) async fn running(&self, agent: &mut FakeAgent, yaml: &str) -> (TaskId, AttemptRef) {
        let task = self.submit(yaml).await;
        let attempt = only(&self.poll(agent).await);
        assert_eq!(attempt.task, task);
        self.report(agent, vec![self.started(attempt)]).await;
        (task, attempt)
    }

    /// The server's periodic liveness check (every second in a server).
    pub(super) async fn check_liveness(&self) {
        self.control
            .check_liveness()
            .await
            .expect("the liveness check");
    }

    /// Submit a task file as `alice`.
    pub(super) async fn submit(&self, yaml: &str) -> TaskId {
        let (spec, _) = tacc_schema::parse_task("task.yaml", yaml).expect("a valid task file");
        self.control
            .submit(
                "alice",
                spec,
                self.snapshot.clone(),
                Default::default(),
                None,
            )
            .await
            .expect("the submit is accepted")
            .id
    }

    /// The array workflow of this control plane, as the API holds it.
    pub(super) fn arrays(&self) -> super::Arrays {
        super::Arrays::of(&self.control)
    }

    /// Submit an array task file as `alice`: its group and elements, by index.
    pub(super) async fn submit_array(&self, yaml: &str) -> (tacc_core::GroupId, Vec<TaskId>) {
        let (spec, _) = tacc_schema::parse_task("task.yaml", yaml).expect("a valid task file");
        let (group, records) = self
            .arrays()
            .submit(
                "alice",
                spec,
                self.snapshot.clone(),
                Default::default(),
                None,
                None,
            )
            .await
            .expect("the array is accepted");
        (group.id, records.iter().map(|r| r.id).collect())
    }

    /// Submit a task file as `alice` with `options`; the refusal, if refused.
    pub(super) async fn submit_with(
        &self,
        yaml: &str,
        options: super::SubmitOptions,
    ) -> Result<TaskId, crate::ServerError> {
        let (spec, _) = tacc_schema::parse_task("task.yaml", yaml).expect("a valid task file");
        self.control
            .submit("alice", spec, self.snapshot.clone(), options, None)
            .await
            .map(|record| record.id)
    }

    /// Submit a task file as `alice` with an `Idempotency-Key`, as the submit route
    /// does: the key and the reply (here, the task id) are committed with the task.
    pub(super) async fn submit_keyed(
        &self,
        yaml: &str,
        key: &str,
    ) -> Result<TaskId, crate::ServerError> {
        let (spec, _) = tacc_schema::parse_task("task.yaml", yaml).expect("a valid task file");
        let keyed = tacc_store::Keyed {
            key: tacc_store::IdempotencyKey {
                user: "alice".into(),
                key: key.into(),
                route: "POST /v1/tasks".into(),
                request_hash: yaml.into(),
                created_at: self.clock.now(),
            },
            render: Box::new(|created| {
                let tacc_store::Created::Task(task) = created else {
                    unreachable!("a task was created")
                };
                tacc_store::StoredReply {
                    status: 201,
                    body: serde_json::json!({ "task_id": task.id }),
                }
            }),
        };
        let record = self
            .control
            .submit(
                "alice",
                spec,
                self.snapshot.clone(),
                Default::default(),
                Some(keyed),
            )
            .await?;
        Ok(record.id)
    }

    /// The reply kept for `alice`'s key.
    pub(super) async fn kept_reply(&self, key: &str) -> Option<serde_json::Value> {
        self.store
            .kept_reply("alice", key, self.clock.now())
            .await
            .expect("the store answers")
            .map(|kept| kept.reply.body)
    }

    /// Every task stored.
    pub(super) async fn all_tasks(&self) -> Vec<TaskRecord> {
        self.store
            .list_tasks(&Default::default())
            .await
            .expect("the store answers")
    }

    /// A new agent with `cpus` CPUs registers.
    pub(super) async fn join(&self, name: &str, cpus: u64) -> FakeAgent {
        let mut agent = FakeAgent {
            node: NodeId(0),
            name: name.to_string(),
            running: BTreeSet::new(),
            log_written: 0,
            life: 1,
            gpus: 0,
            work_version: Default::default(),
        };
        agent.node = self.register(&agent, cpus).await;
        agent
    }

    /// A new agent offering `gpus` GPUs registers.
    pub(super) async fn join_gpus(&self, name: &str, cpus: u64, gpus: u32) -> FakeAgent {
        let mut agent = FakeAgent {
            node: NodeId(0),
            name: name.to_string(),
            running: BTreeSet::new(),
            log_written: 0,
            life: 1,
            gpus,
            work_version: Default::default(),
        };
        agent.node = self.register(&agent, cpus).await;
        agent
    }

    /// A usage sample of rank 0 of `attempt` whose one GPU is `utilization` percent busy
    /// (and whose CPU is busy, so it is alive).
    pub(super) fn gpu_sampled(
        &self,
        attempt: AttemptRef,
        started_at: tacc_core::Timestamp,
        utilization: u32,
    ) -> AgentReport {
        AgentReport::Usage(
            serde_json::from_value(serde_json::json!({
                "attempt": attempt,
                "node_rank": 0,
                "at": self.clock.now(),
                "started_at": started_at,
                "cpu_millis_used": 900,
                "gpus": [{"index": 0, "utilization_percent": utilization,
                          "memory_used_bytes": 0, "memory_total_bytes": 0}],
            }))
            .expect("a usage sample"),
        )
    }

    /// A new agent enrols (as with a join token): pending when the server requires
    /// approval.
    pub(super) async fn enrol(&self, name: &str, cpus: u64) -> FakeAgent {
        let mut agent = FakeAgent {
            node: NodeId(0),
            name: name.to_string(),
            running: BTreeSet::new(),
            log_written: 0,
            life: 1,
            gpus: 0,
            work_version: Default::default(),
        };
        let enrolment = tacc_store::NodeEnrolment {
            pending: self.control.config.require_node_approval,
        };
        agent.node = self.registered(&agent, cpus, Some(enrolment)).await;
        agent
    }

    /// The agent registers (again), claiming what it runs or has not delivered the end of.
    pub(super) async fn register(&self, agent: &FakeAgent, cpus: u64) -> NodeId {
        self.registered(agent, cpus, None).await
    }

    async fn registered(
        &self,
        agent: &FakeAgent,
        cpus: u64,
        enrolment: Option<tacc_store::NodeEnrolment>,
    ) -> NodeId {
        agent.work_version.set(None);
        self.control
            .register_agent(
                RegisterAgent {
                    name: agent.name.clone(),
                    capacity: Resources::new(cpus * 1000, 64 << 30, agent.gpus),
                    gpu_type: None,
                    labels: Default::default(),
                    running: agent.running.iter().copied().collect(),
                    address: format!("{}.test:0", agent.name),
                    gpus: Vec::new(),
                    life: agent.life,
                },
                enrolment,
            )
            .await
            .expect("the registration is accepted")
            .id
    }

    /// The agent polls for its work and starts what is new to it; what it runs that is
    /// no longer assigned, it stops. Returns the assignments it got.
    pub(super) async fn poll(&self, agent: &mut FakeAgent) -> Vec<Assignment> {
        let running: Vec<AttemptRef> = agent.running.iter().copied().collect();
        let (work, _) = self
            .control
            .poll_work(agent.node, agent.work_version.get(), &running)
            .await
            .expect("the poll is answered");
        agent.work_version.set(Some(work.version));
        let assigned: BTreeSet<AttemptRef> = work.assignments.iter().map(|a| a.attempt).collect();
        agent.running.retain(|a| assigned.contains(a));
        agent.running.extend(assigned);
        work.assignments
    }

    /// Like [`TestEnv::poll`], but an error (the node is unknown or offline) is returned.
    pub(super) async fn try_poll(
        &self,
        agent: &FakeAgent,
    ) -> Result<Vec<Assignment>, crate::ServerError> {
        let running: Vec<AttemptRef> = agent.running.iter().copied().collect();
        Ok(self
            .control
            .poll_work(agent.node, agent.work_version.get(), &running)
            .await?
            .0
            .assignments)
    }

    pub(super) async fn report(&self, agent: &FakeAgent, reports: Vec<AgentReport>) -> (u32, u32) {
        let ack = self
            .control
            .agent_reports(agent.node, reports, None)
            .await
            .expect("the reports are answered");
        (ack.accepted, ack.rejected)
    }

    /// The agent reports, asking for its newer work as the real agent does (the version
    /// it has and what it runs); work in the answer it applies as a poll's. Returns the
    /// assignments the answer handed it, if any.
    pub(super) async fn report_asking_work(
        &self,
        agent: &mut FakeAgent,
        reports: Vec<AgentReport>,
    ) -> Option<Vec<Assignment>> {
        let since = tacc_proto::WorkSince {
            after: agent.work_version.get(),
            running: agent.running.iter().copied().collect(),
        };
        let ack = self
            .control
            .agent_reports(agent.node, reports, Some(since))
            .await
            .expect("the reports are answered");
        let work = ack.work?;
        agent.work_version.set(Some(work.version));
        let assigned: BTreeSet<AttemptRef> = work.assignments.iter().map(|a| a.attempt).collect();
        agent.running.retain(|a| assigned.contains(a));
        agent.running.extend(assigned);
        Some(work.assignments)
    }

    pub(super) fn started(&self, attempt: AttemptRef) -> AgentReport {
        AgentReport::Started {
            attempt,
            at: self.clock.now(),
        }
    }

    /// A usage sample of rank `node_rank` of `attempt`, started `started` ago: busy (CPU
    /// use) or silent (no output, no CPU).
    pub(super) fn sampled(
        &self,
        attempt: AttemptRef,
        node_rank: u32,
        started_at: tacc_core::Timestamp,
        busy: bool,
    ) -> AgentReport {
        AgentReport::Usage(
            serde_json::from_value(serde_json::json!({
                "attempt": attempt,
                "node_rank": node_rank,
                "at": self.clock.now(),
                "started_at": started_at,
                "cpu_millis_used": if busy { 900 } else { 0 },
            }))
            .expect("a usage sample"),
        )
    }

    pub(super) fn exited(&self, attempt: AttemptRef, code: i32) -> AgentReport {
        AgentReport::Finished {
            attempt,
            at: self.clock.now(),
            outcome: AttemptOutcome::Exited { code },
            rank: None,
        }
    }

    pub(super) fn output(
        &self,
        agent: &mut FakeAgent,
        attempt: AttemptRef,
        text: &str,
    ) -> AgentReport {
        let offset = agent.log_written;
        agent.log_written += text.len() as u64;
        AgentReport::Log {
            attempt,
            text: text.to_string(),
            offset: Some(offset),
        }
    }

    /// The agent's process of `attempt` exits with `code` and the agent reports it.
    pub(super) async fn finish(
        &self,
        agent: &mut FakeAgent,
        attempt: AttemptRef,
        code: i32,
    ) -> (u32, u32) {
        let reports = vec![self.exited(attempt, code)];
        let ack = self.report(agent, reports).await;
        agent.running.remove(&attempt);
        ack
    }

    pub(super) async fn task(&self, task: TaskId) -> TaskRecord {
        self.store
            .get_task(task)
            .await
            .expect("the store answers")
            .expect("the task exists")
    }

    pub(super) async fn state(&self, task: TaskId) -> TaskState {
        self.task(task).await.state
    }

    pub(super) async fn events(&self, task: TaskId) -> Vec<TaskEvent> {
        self.store
            .task_events(task)
            .await
            .expect("the store answers")
    }

    /// The states a task went through, in order, with the attempt of each.
    pub(super) async fn history(&self, task: TaskId) -> Vec<(u32, TaskState)> {
        self.events(task)
            .await
            .iter()
            .map(|e| (e.attempt.0, e.state))
            .collect()
    }

    pub(super) fn log(&self, task: TaskId) -> String {
        let bytes = self
            .control
            .logs
            .read(task, 0, usize::MAX)
            .expect("the log is readable");
        String::from_utf8(bytes).expect("the log is text")
    }

    /// The node's state as `tcloud nodes` shows it.
    pub(super) async fn node_state(&self, agent: &FakeAgent) -> String {
        self.control
            .node_views()
            .await
            .into_iter()
            .find(|n| n.id == agent.node)
            .map(|n| n.state)
            .expect("the node is listed")
    }
}

/// The one attempt an assignment list holds.
pub(super) fn only(assignments: &[Assignment]) -> AttemptRef {
    assert_eq!(assignments.len(), 1, "{assignments:?}");
    assignments[0].attempt
}
