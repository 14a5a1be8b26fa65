//! The shell of the reactor: one turn of the control plane is **events in → handlers →
//! effects → one commit → wake and answer**. A turn holds the core's lock; the handlers
//! it runs (`handlers/`) change the core and collect [`Effects`]; the shell stages their
//! store changes for the turn's one transaction, decides the scheduler events of the
//! whole turn as one batch (whose plan commits in that same transaction), and only then
//! lets the turn's answer go — which the API holds until the store has synced
//! (`api/durable.rs`). A commit that fails fails the turn: nothing is acknowledged, the
//! copies of what it touched are dropped and the scheduler is rebuilt from the store.

//!
//! Its parts, in the order a turn meets them: the turn itself; carrying out what a
//! handler decided; the commits (what the turn staged, in one transaction, with the
//! placed tasks' copies kept in step: `records.rs`); and the scheduler's decisions, each
//! plan committed and handed to the nodes, a plan that cannot be recorded rebuilding the
//! scheduler from the store, which is the truth.

use std::collections::BTreeMap;
use std::time::Instant;

use tacc_core::{NodeId, TaskState, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::{Action, Event, Plan, Scheduler};
use tacc_store::{StoreError, TaskChange, TaskFilter, TaskRecord};

use super::core::node_spec;
use super::effects::{Effects, FollowUp, Metric};
use super::handlers::hangs;
use super::handlers::idle_gpus;
use super::handlers::liveness::RestartFacts;
use super::records::{FAILED, LOG_WAKES, STAGED, StagedGuard};
use super::{Control, Core, handlers, placements_of, request_of, retry, rules};
use crate::ServerError;

impl Control {
    /// Run one turn: `body` applies its events to the core through handlers and
    /// [`Control::carry`]; the scheduler then decides once for all of them, and what the
    /// turn staged is committed with that decision's plan, in one transaction.
    pub(crate) async fn turn<R>(
        &self,
        body: impl AsyncFnOnce(&mut Core) -> Result<R, ServerError>,
    ) -> Result<R, ServerError> {
        self.turn_then(body, |_, result| result).await
    }

    /// A turn, and then — its decision made and committed, the lock still held — `then`
    /// reads the core as the turn left it: what a node is handed in the answer to the
    /// events it sent is what the turn decided, and no other turn comes in between.
    /// (`then` gets no core when a commit of the turn failed: the core is rebuilt from the
    /// store next, and every node's poll answered.)
    pub(crate) async fn turn_then<R, T>(
        &self,
        body: impl AsyncFnOnce(&mut Core) -> Result<R, ServerError>,
        then: impl FnOnce(Option<&mut Core>, R) -> T,
    ) -> Result<T, ServerError> {
        let mut guard = self.inner.lock().await;
        let core = &mut *guard;
        if core.torn {
            self.rebuild(
                core,
                "a turn of the control plane was dropped half-way (its caller went away)",
            )
            .await;
        }
        // Cleared only when this turn has run to its end: a turn dropped at an await (a
        // request whose client went away, a loop stopped) leaves the mark, and the next
        // turn reads the core again from the store, which is the truth.
        core.torn = true;
        core.deferred = Some(Vec::new());
        let mut failed = false;
        let result = self
            .staging_starts(async {
                let failed = &mut failed;
                let mut result = body(core).await;
                let events = core.deferred.take().unwrap_or_default();
                if !events.is_empty() {
                    self.drive(core, Event::Batch(events)).await;
                }
                if result.is_ok()
                    && let Err(e) = self.flush_staged().await
                {
                    result = Err(e.into());
                }
                *failed = self.discard_if_failed();
                let result = result.map(|done| then((!*failed).then_some(&mut *core), done));
                // Committed (or failed, and the followers find out): wake them now.
                for task in LOG_WAKES
                    .try_with(|wakes| std::mem::take(&mut *wakes.borrow_mut()))
                    .unwrap_or_default()
                {
                    self.wake_followers(task);
                }
                result
            })
            .await;
        if failed {
            self.rebuild(core, "a turn of the control plane could not be committed")
                .await;
        }
        core.torn = false;
        result
    }

    /// After a turn whose commit failed, or that was dropped half-way, the handlers'
    /// changes to the core are not what the store holds: the open tasks' part of the core is read again from the store and
    /// the scheduler rebuilt from it (nodes keep their liveness; their work is rebuilt and
    /// every poll answered). Nothing of the turn was acknowledged: its request failed.
    pub(crate) async fn rebuild(&self, core: &mut Core, why: &str) {
        tracing::error!("{why}: rebuilding its state from the store");
        core.clear_open_tasks();
        self.placed.clear();
        if let Err(e) = Box::pin(self.reload(core, false)).await {
            tracing::error!("rebuilding from the store failed: {e}; the next failed turn retries");
        }
        let nodes: Vec<_> = core.nodes.keys().copied().collect();
        for node in nodes {
            self.comm.work_changed(node);
        }
    }

    /// Carry out what a handler decided. Inside a turn its changes are staged for the
    /// turn's transaction (and seen at once by the placed tasks' copies); outside one
    /// they are committed now, together.
    pub(crate) async fn carry(&self, core: &mut Core, fx: Effects) -> Result<(), ServerError> {
        let Effects {
            changes,
            decide,
            woken,
            log_wakes,
            log_lines,
            metrics,
            warnings,
            news,
            idle_warnings,
            keep_for_restart,
            follow_ups,
        } = fx;
        if let Some(facts) = keep_for_restart {
            self.keep_for_restart(core, facts).await;
        }
        for change in idle_warnings {
            self.usage.set_idle_warning(change.attempt, change.warning);
        }
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        for news in news {
            tracing::info!("{news}");
        }
        self.stage_all(changes).await?;
        for (task, line) in log_lines {
            // A log that cannot be written costs the line, never the decision.
            if let Err(e) = self.logs.append_line(task, &line) {
                tracing::warn!("cannot write to the log of task {task}: {e}");
            }
        }
        let now = self.clock.now();
        for metric in metrics {
            match metric {
                Metric::Started {
                    submitted_at,
                    attempt,
                } => self.metrics.started(submitted_at, attempt, now),
            }
        }
        for step in follow_ups {
            // The async paths read the store: what the turn staged is made durable first.
            self.flush_staged().await?;
            match step {
                FollowUp::StopDependents { record, state } => {
                    self.stop_dependents(core, &record, state).await?;
                }
            }
        }
        match decide.len() {
            0 => {}
            1 => {
                let event = decide.into_iter().next().expect("one event");
                self.drive(core, event).await;
            }
            _ => self.drive(core, Event::Batch(decide)).await,
        }
        for node in woken {
            self.comm.work_changed(node);
        }
        for task in log_wakes {
            // Within a turn, once its changes are committed (see `LOG_WAKES`).
            let deferred = LOG_WAKES.try_with(|wakes| wakes.borrow_mut().insert(task));
            if deferred.is_err() {
                self.wake_followers(task);
            }
        }
        Ok(())
    }

    /// Wake the followers of `task`'s log (new output, or its end).
    fn wake_followers(&self, task: tacc_core::TaskId) {
        #[cfg(test)]
        {
            let committed = self.committed.lock().unwrap().len();
            self.followers_woken.lock().unwrap().push((task, committed));
        }
        self.logs.wake(task);
    }

    /// Keep what a restarted server needs (`RestartFacts`). Outside the turn's
    /// transaction on purpose: a store that cannot take them now gets them next time.
    async fn keep_for_restart(&self, core: &mut Core, facts: RestartFacts) {
        let changed = facts.changed_ledgers(core);
        let mut ledgers = None;
        if !changed.is_empty() {
            match self.store.save_fairshare(&changed).await {
                Ok(()) => ledgers = facts.ledgers,
                Err(e) => tracing::warn!("cannot keep the fair-share ledgers: {e}"),
            }
        }
        let mut seen = Vec::new();
        if !facts.seen.is_empty() {
            match self.store.save_nodes_seen(&facts.seen).await {
                Ok(()) => seen = facts.seen,
                Err(e) => tracing::warn!("cannot keep the nodes' last-seen times: {e}"),
            }
        }
        handlers::liveness::on_restart_facts_kept(core, ledgers, seen);
    }

    // ---- Steps that read facts, then run a handler (shared by several entry points) ----

    /// Give the scheduler the tasks held while it knew no node, once it knows one (see
    /// `handlers::submit`).
    pub(super) async fn release_held(&self, inner: &mut Core) -> Result<(), ServerError> {
        if !handlers::submit::held_are_due(inner) {
            return Ok(());
        }
        let mut records = Vec::with_capacity(inner.held.len());
        for task in inner.held.clone() {
            match self.facts.task_record(task).await? {
                Some(record) => records.push(record),
                // Gone from the store: nothing to schedule.
                None => {
                    inner.held.remove(&task);
                }
            }
        }
        let mut fx = Effects::default();
        handlers::submit::on_release_held(inner, &mut fx, &self.config, &records);
        self.carry(inner, fx).await
    }

    /// End the attempts found hung now.
    pub(super) async fn end_hung_attempts(&self, inner: &mut Core) -> Result<(), ServerError> {
        let mut watched = Vec::new();
        for attempt in hangs::watched(inner, &self.config) {
            if let Some(record) = self.facts.task_record(attempt.task).await? {
                watched.push(hangs::Watched {
                    attempt,
                    record,
                    alive_at: self.usage.alive_ranks(attempt),
                });
            }
        }
        if watched.is_empty() {
            return Ok(());
        }
        let mut fx = Effects::default();
        hangs::on_hang_check(inner, &mut fx, &self.config, self.clock.now(), watched);
        self.carry(inner, fx).await
    }

    /// Apply the idle-GPU policy now (nothing without one).
    pub(super) async fn apply_idle_gpu_policy(&self, inner: &mut Core) -> Result<(), ServerError> {
        let Some(policy) = self.config.idle_gpu.clone() else {
            return Ok(());
        };
        let mut watched = Vec::new();
        for attempt in idle_gpus::watched(inner) {
            if let Some(record) = self.facts.task_record(attempt.task).await? {
                watched.push(idle_gpus::Watched {
                    attempt,
                    record,
                    busy_at: self.usage.gpu_busy_ranks(attempt),
                });
            }
        }
        if watched.is_empty() {
            return Ok(());
        }
        let mut fx = Effects::default();
        idle_gpus::on_idle_gpu_check(
            inner,
            &mut fx,
            &self.config,
            &policy,
            self.clock.now(),
            watched,
        );
        self.carry(inner, fx).await
    }

    /// An attempt's node vanished: the attempt is lost (and maybe retried; see
    /// `handlers::ending::on_attempt_lost`).
    pub(super) async fn lose_attempt(
        &self,
        inner: &mut Core,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
    ) -> Result<(), ServerError> {
        let Some(record) = self.facts.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let reason = handlers::ending::lost_reason(&outcome);
        let counts = !record.cancel_requested
            && rules::ending::counts_node_losses(TaskState::Lost, Some(&reason));
        let earlier_node_losses = if counts {
            retry::node_losses(&self.store.task_events(record.id).await?)
        } else {
            0
        };
        let mut fx = Effects::default();
        handlers::ending::on_attempt_lost(
            inner,
            &mut fx,
            &self.config,
            record,
            &outcome,
            earlier_node_losses,
            self.clock.now(),
        );
        self.carry(inner, fx).await
    }

    /// One node's part of an attempt ended (see `handlers::rank_end`). A node that
    /// stopped an attempt because it lost contact with the server failed as a node, not
    /// the task: the attempt is lost and follows the retry policy.
    pub(super) async fn rank_finished(
        &self,
        inner: &mut Core,
        node: NodeId,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        process_rank: Option<u32>,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        if matches!(&outcome, AttemptOutcome::LaunchFailed { reason, .. } if reason == "node_fenced")
        {
            return self.lose_attempt(inner, attempt, outcome).await;
        }
        let Some(record) = self.facts.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt == attempt.attempt && record.state.is_active() {
            let name = inner.node_name(node);
            let preempting = inner.preempting.contains(&record.id);
            if let Some(lost) =
                rules::ending::stopped_by_its_agent(&outcome, &record, preempting, &name)
            {
                return self.lose_attempt(inner, attempt, lost).await;
            }
        }
        let mut fx = Effects::default();
        handlers::rank_end::on_rank_finished(
            inner,
            &mut fx,
            handlers::rank_end::RankFinished {
                record,
                node,
                attempt,
                outcome,
                process_rank,
                at,
                config: &self.config,
            },
        );
        self.carry(inner, fx).await
    }

    // ---- Commits: what a turn staged, in one transaction (see `records.rs`) ----

    /// Apply one agent report batch with its `starting → running` transitions staged:
    /// each is applied to the placed copy at once and committed, in order, with the
    /// batch's next commit — typically the same attempt's end, so a short task's start
    /// and end cost one transaction — or by `batch`'s own [`Control::flush_staged`]
    /// before it is acknowledged. Nothing is acknowledged before it is durable; a failed
    /// commit fails the batch (the agent sends it again).
    pub(crate) async fn staging_starts<T>(
        &self,
        batch: impl std::future::Future<Output = Result<T, crate::ServerError>>,
    ) -> Result<T, crate::ServerError> {
        STAGED
            .scope(
                std::cell::RefCell::new(Vec::new()),
                FAILED.scope(
                    std::cell::Cell::new(false),
                    LOG_WAKES.scope(std::cell::RefCell::new(Default::default()), async {
                        let _guard = StagedGuard(&self.placed);
                        batch.await
                    }),
                ),
            )
            .await
    }

    /// Commit what the report batch being applied staged and no commit took yet.
    pub(crate) async fn flush_staged(&self) -> Result<(), StoreError> {
        self.commit(&[]).await
    }

    /// Commit `changes` with the turn's (or report batch's) next commit, or its last, when
    /// one is under way ([`Control::staging_starts`]), applied to the placed copies at
    /// once; together at once otherwise.
    pub(crate) async fn stage_all(&self, changes: Vec<TaskChange>) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let staged = STAGED.try_with(|staged| {
            self.placed.staged(&changes);
            staged.borrow_mut().extend(changes.iter().cloned());
        });
        match staged {
            Ok(()) => Ok(()),
            Err(_) => self.commit(&changes).await,
        }
    }

    /// Commit `changes` in one store transaction, timing it, then bring the placed
    /// tasks' copies up to date.
    pub(crate) async fn commit(&self, changes: &[TaskChange]) -> Result<(), StoreError> {
        self.commit_placing(changes, &[]).await
    }

    /// [`Control::commit`], keeping the records of the tasks `changes` place (each as the
    /// store holds it once `changes` are applied).
    pub(crate) async fn commit_placing(
        &self,
        changes: &[TaskChange],
        placed: &[TaskRecord],
    ) -> Result<(), StoreError> {
        // What the report batch being applied staged goes first, in order, in this
        // transaction; if it fails they are staged again, for the batch's last commit to
        // try (and fail the batch with) — a caller that swallows its own failure cannot
        // lose them.
        let staged = STAGED
            .try_with(|staged| std::mem::take(&mut *staged.borrow_mut()))
            .unwrap_or_default();
        let with_staged;
        let changes = if staged.is_empty() {
            changes
        } else {
            with_staged = [&staged[..], changes].concat();
            &with_staged[..]
        };
        if changes.is_empty() {
            return Ok(());
        }
        let result = self.commit_now(changes, placed, staged.len()).await;
        if result.is_err() && !staged.is_empty() {
            let _ = STAGED.try_with(|left| {
                let mut left = left.borrow_mut();
                let later = std::mem::take(&mut *left);
                *left = staged;
                left.extend(later);
            });
        }
        result
    }

    /// Commit `changes`, whose first `staged` the copies of placed tasks already follow.
    async fn commit_now(
        &self,
        changes: &[TaskChange],
        placed: &[TaskRecord],
        staged: usize,
    ) -> Result<(), StoreError> {
        // The notifications that ended tasks and groups call for go in the same transaction.
        let (notifications, ended_groups) =
            match crate::notify::notifications_for(self, changes).await {
                Ok(ends) => (ends.notifications, Some(ends.groups)),
                Err(crate::ServerError::Store(e)) => return Err(e),
                Err(e) => {
                    tracing::error!("cannot work out the notifications of a change: {e}");
                    (Vec::new(), None)
                }
            };
        let with_notifications;
        let changes = if notifications.is_empty() {
            changes
        } else {
            with_notifications = [changes, &notifications[..]].concat();
            &with_notifications[..]
        };
        let _order = self.placed.order.lock().await;
        let started = Instant::now();
        let result = self.store.apply(changes).await;
        self.metrics.committed("apply", started.elapsed());
        match &result {
            Ok(()) => {
                #[cfg(test)]
                self.committed
                    .lock()
                    .unwrap()
                    .extend(changes.iter().cloned());
                let (already, fresh) = changes.split_at(staged.min(changes.len()));
                self.placed.settled(already);
                self.placed.applied(fresh);
                for record in placed {
                    self.placed.admit(record);
                }
                match ended_groups {
                    Some(groups) => self.group_ends.ended(groups),
                    // Which groups it ended is not known: every follower looks again.
                    None => self.group_ends.ended_all(),
                }
            }
            Err(_) => {
                self.placed.forget(changes);
                let _ = FAILED.try_with(|failed| failed.set(true));
            }
        }
        result
    }

    /// Whether a commit of the turn being applied failed; if so, what it staged is dropped
    /// (never to be committed: the turn failed and the core is rebuilt from the store).
    pub(crate) fn discard_if_failed(&self) -> bool {
        let failed = FAILED.try_with(std::cell::Cell::get).unwrap_or(false);
        if failed {
            let left = STAGED
                .try_with(|staged| std::mem::take(&mut *staged.borrow_mut()))
                .unwrap_or_default();
            self.placed.forget(&left);
        }
        failed
    }

    // ---- Decisions: the scheduler's plans, committed and handed to the nodes ----

    /// Feed one event to the scheduler and carry out its plan in one store transaction.
    /// A failure here never loses a task: the task stays durable in its last state and
    /// the scheduler is rebuilt from the store.
    pub(super) async fn drive(&self, inner: &mut Core, mut event: Event) {
        if let Some(deferred) = inner.deferred.as_mut() {
            deferred.push(event);
            return;
        }
        self.adaptive.patch_restored(&mut event);
        let batch = matches!(event, Event::Batch(_));
        let deciding = Instant::now();
        let decided = handlers::decide::on_decide(inner, self.clock.now(), event);
        self.metrics.decided(deciding.elapsed());
        let plan = match decided {
            Ok(plan) => plan,
            Err(e) if batch => {
                // Part of the batch may have been applied: the store is the truth.
                tracing::error!("scheduler refused an event of a batch, rebuilding: {e}");
                self.resync(inner).await;
                return;
            }
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

    /// Apply a plan (`handlers::plan`): read the records it is about, let the handler
    /// decide, commit its changes in one transaction (with whatever the turn staged),
    /// then hand each started attempt to its nodes with what they need.
    pub(super) async fn carry_out(&self, inner: &mut Core, plan: Plan) -> Result<(), ServerError> {
        if plan.actions.is_empty() {
            return Ok(());
        }
        let mut records = BTreeMap::new();
        for action in &plan.actions {
            if let Action::Start { task, .. } | Action::Reject { task, .. } = action
                && let Some(record) = self.facts.task_record(*task).await?
            {
                records.insert(*task, record);
            }
        }
        let mut fx = Effects::default();
        let starts = handlers::plan::on_plan(inner, &mut fx, plan, &records);
        let changes = std::mem::take(&mut fx.changes);
        self.commit_placing(&changes, &starts).await?;
        for record in &starts {
            let Some(spec) = inner.specs.get(&record.id) else {
                continue;
            };
            let secrets = self
                .secret_box
                .task_secrets(&*self.store, &self.logs, record, spec)
                .await;
            let inputs = self.facts.attempt_inputs(record).await?;
            let account = self.accounts.of(&record.user).await;
            handlers::plan::on_placed(
                inner,
                &mut fx,
                handlers::plan::Placed {
                    record,
                    account: &account,
                    secrets: &secrets,
                    inputs,
                },
            );
        }
        Box::pin(self.carry(inner, fx)).await
    }

    /// Throw the scheduler's state away, rebuild it from the store in one batch, and carry
    /// out what it decides.
    pub(super) async fn resync(&self, inner: &mut Core) {
        let mut scheduler = Scheduler::by_name(&self.config.policy, self.config.scheduler.clone())
            .expect("the policy was checked at start");
        let mut events: Vec<Event> = inner
            .nodes
            .values()
            .filter(|n| n.schedulable() || n.expected)
            .flat_map(|live| {
                let up = Event::NodeUp(node_spec(&live.record));
                if live.record.drained || live.record.pending || live.expected {
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
        let mut batch = Event::Batch(events);
        self.adaptive.patch_restored(&mut batch);
        handlers::decide::patch(inner, &mut batch);
        let plan = scheduler.handle(self.clock.now(), batch);
        // Epochs stay unique across the replacement: a cached projection of the old
        // scheduler is never taken for the new one's.
        scheduler.continue_epochs_after(inner.scheduler.epoch());
        // Fair-share usage is history the store does not replay: carried over as it is.
        let ledgers = inner.scheduler.fairshare_ledgers();
        scheduler.restore_fairshare(&ledgers, self.clock.now());
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
}
