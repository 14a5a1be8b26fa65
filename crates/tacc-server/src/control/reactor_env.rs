//! The synchronous test environment of the reactor, as HyperQueue's `tako` has its
//! `TestEnv`: a plain [`Core`], the handlers called directly, and the effects they ask
//! for read back — no tokio, store, lock or clock. What the shell does between handlers
//! it does here in a few plain lines: the changes of a step are applied to the task
//! records the environment keeps (by the store's own rule, `apply_transition`), the
//! scheduler events of the step are decided as one batch (`handlers::decide`) and the
//! plan applied (`handlers::plan`). A test drives events, then reads
//! [`ReactorEnv::take_changes`], [`ReactorEnv::woken`] and
//! [`ReactorEnv::emptiness_check`].
//!
//! The async [`TestEnv`](super::test_env::TestEnv) drives the same handlers through the
//! shell, the store and the commits; this one pins a handler's decisions down with
//! nothing else in the way (`reactor_tests.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tacc_core::{AttemptNo, NodeId, Resources, TaskId, TaskState, Timestamp};
use tacc_proto::{Assignment, AttemptOutcome, AttemptRef};
use tacc_scheduler::{Action, Event, Scheduler};
use tacc_store::{NodeRecord, TaskChange, TaskRecord};

use super::effects::Effects;
use super::handlers;
use super::{Core, DEFAULT_POLICY, ServerConfig, TaskAccount, request_of};

/// The heartbeat timeout of the environment.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(30);

pub(super) struct ReactorEnv {
    pub(super) core: Core,
    config: ServerConfig,
    now: Timestamp,
    instant: Instant,
    /// Every task's record as the store would hold it once the changes so far committed.
    records: BTreeMap<TaskId, TaskRecord>,
    /// Changes since the last [`ReactorEnv::take_changes`], in order.
    changes: Vec<TaskChange>,
    /// Nodes woken since the last [`ReactorEnv::woken`], in order, with repeats.
    woken: Vec<NodeId>,
    /// Lines the handlers wrote into task logs.
    log_lines: Vec<(TaskId, String)>,
    next_task: u64,
    next_node: u64,
}

impl ReactorEnv {
    pub(super) fn new() -> ReactorEnv {
        let mut config = ServerConfig::new(std::env::temp_dir());
        config.heartbeat_timeout = HEARTBEAT;
        config.retry.backoff = Duration::ZERO;
        let scheduler = Scheduler::by_name(DEFAULT_POLICY, config.scheduler.clone())
            .expect("the default policy exists");
        let instant = Instant::now();
        ReactorEnv {
            core: Core::new(scheduler, instant),
            config,
            now: Timestamp(1_700_000_000_000),
            instant,
            records: BTreeMap::new(),
            changes: Vec::new(),
            woken: Vec::new(),
            log_lines: Vec::new(),
            next_task: 1,
            next_node: 1,
        }
    }

    /// Time passes, `secs` seconds, with the liveness tick every second as the server
    /// runs it; the nodes in `polling` poll (running what they hold) each second.
    pub(super) fn pass_seconds(&mut self, secs: u64, polling: &[(NodeId, Vec<AttemptRef>)]) {
        for _ in 0..secs {
            let second = Duration::from_secs(1);
            self.now = Timestamp(self.now.0 + second.as_millis() as u64);
            self.instant += second;
            for (node, running) in polling {
                self.poll(*node, running);
            }
            self.tick();
        }
    }

    /// A node with `cpus` CPUs registers (its agent runs nothing yet).
    pub(super) fn register(&mut self, name: &str, cpus: u64) -> NodeId {
        let id = NodeId(self.next_node);
        self.next_node += 1;
        let capacity = Resources::new(cpus * 1000, 64 << 30, 0);
        let record = NodeRecord {
            id,
            name: name.to_string(),
            capacity,
            gpu_type: None,
            labels: BTreeMap::new(),
            address: format!("{name}.test:0"),
            registered_at: self.now,
            drained: false,
            enrolled_capacity: capacity,
            pending: false,
            last_seen: None,
        };
        let mut fx = Effects::default();
        let active = self.records.values().filter(|r| r.state.is_active());
        let lost = handlers::register::on_register(
            &mut self.core,
            &mut fx,
            handlers::register::Registration {
                record,
                claimed: BTreeSet::new(),
                active: active.cloned().collect(),
                seen: self.instant,
                config: &self.config,
            },
        );
        assert!(lost.is_empty(), "a new node lost attempts: {lost:?}");
        self.carry(fx);
        // Tasks held while no node was up go to the scheduler now.
        if handlers::submit::held_are_due(&self.core) {
            let held: Vec<TaskRecord> = self.core.held.iter().map(|t| self.record(*t)).collect();
            let mut fx = Effects::default();
            handlers::submit::on_release_held(&mut self.core, &mut fx, &self.config, &held);
            self.carry(fx);
        }
        let mut fx = Effects::default();
        handlers::register::on_claims_settled(&mut self.core, &mut fx, id, BTreeSet::new());
        self.carry(fx);
        id
    }

    /// `alice` submits a task file; its record is stored and the scheduler hears of it.
    pub(super) fn submit(&mut self, yaml: &str) -> TaskId {
        let (spec, _) = tacc_schema::parse_task("task.yaml", yaml).expect("a valid task file");
        let id = TaskId(self.next_task);
        self.next_task += 1;
        let record = TaskRecord {
            id,
            name: spec.name.clone(),
            user: "alice".into(),
            spec: serde_json::to_value(&spec).expect("a spec serialises"),
            snapshot: "ab".repeat(32).parse().expect("a snapshot id"),
            source: None,
            state: TaskState::Queued,
            reason: None,
            exit_code: None,
            attempt: AttemptNo(1),
            placements: Vec::new(),
            cancel_requested: false,
            submitted_at: self.now,
            started_at: None,
            finished_at: None,
            group: None,
            group_index: None,
            submission: serde_json::json!({}),
        };
        let group = self.core.group_for(&self.config, "alice");
        let request = request_of(&spec, &record, self.now, group);
        self.core.specs.insert(id, spec);
        self.records.insert(id, record);
        let mut fx = Effects::default();
        handlers::submit::on_submitted(&mut self.core, &mut fx, vec![(id, request)]);
        self.carry(fx);
        id
    }

    /// The node polls with what its agent runs; its desired work.
    pub(super) fn poll(&mut self, node: NodeId, running: &[AttemptRef]) -> Vec<Assignment> {
        let settled = handlers::poll::on_poll(&mut self.core, node, running, true, self.instant)
            .expect("the node is registered");
        let mut fx = Effects::default();
        for attempt in settled {
            let record = self.record(attempt.task);
            handlers::poll::on_cancel_settled(
                &mut self.core,
                &mut fx,
                &self.config,
                record,
                attempt,
                self.now,
            );
        }
        self.carry(fx);
        handlers::poll::on_work(&mut self.core, node, running)
            .expect("the node is registered")
            .assignments
    }

    /// The node's agent says the attempt started.
    pub(super) fn started(&mut self, attempt: AttemptRef) {
        let record = self.record(attempt.task);
        let mut fx = Effects::default();
        handlers::started::on_started(&mut self.core, &mut fx, &record, attempt, self.now);
        self.carry(fx);
    }

    /// `node`'s part of the attempt ended with `outcome`.
    pub(super) fn finished(&mut self, node: NodeId, attempt: AttemptRef, outcome: AttemptOutcome) {
        let record = self.record(attempt.task);
        let mut fx = Effects::default();
        handlers::rank_end::on_rank_finished(
            &mut self.core,
            &mut fx,
            handlers::rank_end::RankFinished {
                record,
                node,
                attempt,
                outcome,
                process_rank: None,
                at: self.now,
                config: &self.config,
            },
        );
        self.carry(fx);
    }

    /// The task's user cancels it.
    pub(super) fn cancel(&mut self, task: TaskId) {
        let record = self.record(task);
        let mut fx = Effects::default();
        handlers::cancel::on_cancel(
            &mut self.core,
            &mut fx,
            handlers::cancel::Cancel {
                record,
                reason: super::CANCELLED_BY_USER,
                now: self.now,
                config: &self.config,
            },
        );
        self.carry(fx);
    }

    /// An administrator drains the node (`drained`) or resumes it.
    pub(super) fn drain(&mut self, node: NodeId, drained: bool) {
        let mut fx = Effects::default();
        handlers::node_admin::on_drain(&mut self.core, &mut fx, node, drained);
        self.carry(fx);
    }

    /// An administrator removes the node; refused while it is up and runs something.
    pub(super) fn remove(&mut self, node: NodeId) -> Result<(), usize> {
        let mut fx = Effects::default();
        let lost = handlers::node_admin::on_remove(&mut self.core, &mut fx, node)
            .map_err(|still| still.tasks)?;
        self.carry(fx);
        for (attempt, outcome) in lost {
            self.lose(attempt, outcome);
        }
        handlers::node_admin::on_forget(&mut self.core, node);
        Ok(())
    }

    /// An attempt whose node went away is lost (and maybe retried).
    fn lose(&mut self, attempt: AttemptRef, outcome: AttemptOutcome) {
        let record = self.record(attempt.task);
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return;
        }
        let mut fx = Effects::default();
        handlers::ending::on_attempt_lost(
            &mut self.core,
            &mut fx,
            &self.config,
            record,
            &outcome,
            0,
            self.now,
        );
        self.carry(fx);
    }

    /// The liveness tick: silent nodes go down and their attempts are lost; retries due
    /// are released.
    pub(super) fn tick(&mut self) {
        let mut fx = Effects::default();
        let tick = handlers::liveness::on_liveness_tick(
            &mut self.core,
            &mut fx,
            self.instant,
            self.config.heartbeat_timeout,
        );
        self.carry(fx);
        for (attempt, outcome) in tick.lost_attempts {
            self.lose(attempt, outcome);
        }
        let mut fx = Effects::default();
        handlers::liveness::on_retries_due(&mut self.core, &mut fx, self.now);
        self.carry(fx);
    }

    /// A task's record as the store would hold it now.
    pub(super) fn record(&self, task: TaskId) -> TaskRecord {
        self.records.get(&task).cloned().expect("a known task")
    }

    pub(super) fn state(&self, task: TaskId) -> TaskState {
        self.record(task).state
    }

    /// The changes committed since the last call, in order.
    pub(super) fn take_changes(&mut self) -> Vec<TaskChange> {
        std::mem::take(&mut self.changes)
    }

    /// Only the state transitions of [`ReactorEnv::take_changes`], as (task, from, to).
    pub(super) fn take_transitions(&mut self) -> Vec<(TaskId, TaskState, TaskState)> {
        self.take_changes()
            .into_iter()
            .filter_map(|change| match change {
                TaskChange::Transition(t) => Some((t.task, t.from, t.to)),
                _ => None,
            })
            .collect()
    }

    /// The nodes woken since the last call, in order, with repeats.
    pub(super) fn woken(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.woken)
    }

    /// The lines written into `task`'s log.
    pub(super) fn log_lines(&self, task: TaskId) -> Vec<&str> {
        self.log_lines
            .iter()
            .filter(|(t, _)| *t == task)
            .map(|(_, line)| line.as_str())
            .collect()
    }

    /// Once every task has ended, the core holds nothing of any of them.
    pub(super) fn emptiness_check(&self) {
        let left = self.core.leftovers();
        assert!(left.is_empty(), "the core still holds: {}", left.join("; "));
    }

    /// What the shell does with a handler's effects, in plain lines: the changes are
    /// committed (applied to the records), the scheduler decides once on the step's
    /// events and its plan is applied, then nodes are woken.
    fn carry(&mut self, fx: Effects) {
        let Effects {
            changes,
            decide,
            woken,
            log_lines,
            follow_ups,
            ..
        } = fx;
        self.commit(changes);
        // A task that ended without succeeding stops the pipeline stages that need it;
        // no task of this environment is a stage, so that ends nothing (the shell finds
        // no stage for it in the store, `Facts::stage_of_task`).
        for step in follow_ups {
            let super::effects::FollowUp::StopDependents { record, .. } = step;
            assert!(
                record.group.is_none(),
                "the environment holds no groups or pipelines"
            );
        }
        self.log_lines.extend(log_lines);
        if !decide.is_empty() {
            self.decide(Event::Batch(decide));
        }
        self.woken.extend(woken);
    }

    fn commit(&mut self, changes: Vec<TaskChange>) {
        for change in &changes {
            if let Some(record) = change.task().and_then(|task| self.records.get_mut(&task)) {
                tacc_store::apply_transition(record, change)
                    .unwrap_or_else(|e| panic!("the store refuses {change:?}: {e}"));
            }
        }
        self.changes.extend(changes);
    }

    fn decide(&mut self, event: Event) {
        let plan = handlers::decide::on_decide(&mut self.core, self.now, event)
            .expect("the scheduler takes the events");
        let mut records = BTreeMap::new();
        for action in &plan.actions {
            if let Action::Start { task, .. } | Action::Reject { task, .. } = action {
                records.insert(*task, self.record(*task));
            }
        }
        let mut fx = Effects::default();
        let starts = handlers::plan::on_plan(&mut self.core, &mut fx, plan, &records);
        self.commit(std::mem::take(&mut fx.changes));
        let account = TaskAccount {
            unix_user: None,
            task_uid: Some(200_000),
        };
        for record in &starts {
            handlers::plan::on_placed(
                &mut self.core,
                &mut fx,
                handlers::plan::Placed {
                    record,
                    account: &account,
                    secrets: &BTreeMap::new(),
                    inputs: Vec::new(),
                },
            );
        }
        self.carry(fx);
    }
}
