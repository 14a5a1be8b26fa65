//! How scheduling decisions are made and carried out: events go to the scheduler (one at
//! a time, or deferred and decided as one batch), each plan is committed in one store
//! transaction before its started attempts are handed to their nodes' desired work, and a
//! plan that cannot be recorded rebuilds the scheduler from the store, which is the truth.

use super::*;

impl Control {
    /// Give newly stored tasks to the scheduler in one batch (one decision), or hold them
    /// with the no-node reason while no node takes work (the scheduler would reject
    /// them as never fitting an empty cluster).
    pub(super) async fn queue_new(
        &self,
        inner: &mut Inner,
        submitted: Vec<(TaskId, TaskRequest)>,
    ) -> Result<(), ServerError> {
        if inner.nodes.values().any(LiveNode::schedulable) {
            let events = submitted
                .into_iter()
                .map(|(task, request)| Event::TaskSubmitted { task, request })
                .collect();
            self.drive(inner, Event::Batch(events)).await;
            return Ok(());
        }
        let reasons: Vec<TaskChange> = submitted
            .iter()
            .map(|(task, _)| TaskChange::Reason {
                task: *task,
                reason: Some(NO_NODE_REASON.into()),
            })
            .collect();
        inner.held.extend(submitted.iter().map(|(task, _)| *task));
        self.commit(&reasons).await?;
        Ok(())
    }

    /// Feed one event to the scheduler and carry out its plan in one store transaction.
    /// A failure here never loses a task: the task stays durable in its last state and
    /// the scheduler is rebuilt from the store.
    pub(super) async fn drive(&self, inner: &mut Inner, mut event: Event) {
        if let Some(deferred) = inner.deferred.as_mut() {
            deferred.push(event);
            return;
        }
        self.adaptive.patch_restored(&mut event);
        let batch = matches!(event, Event::Batch(_));
        patch_dependencies(&inner.stage_deps, &mut event);
        patch_not_before(&inner.retry_at, &mut event);
        let deciding = Instant::now();
        let decided = inner.scheduler.handle(self.clock.now(), event);
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

    /// Record a plan in one transaction, then hand the started attempts to their nodes and
    /// withdraw the preempted ones.
    pub(super) async fn carry_out(&self, inner: &mut Inner, plan: Plan) -> Result<(), ServerError> {
        if plan.actions.is_empty() {
            return Ok(());
        }
        let mut changes = Vec::new();
        let mut starts = Vec::new();
        let mut preempted = Vec::new();
        // A stage task whose needed stage is rejected in this very plan must not start:
        // the scheduler saw the need leave and placed it; it ends as a dependency failure.
        let rejected: BTreeSet<TaskId> = plan
            .actions
            .iter()
            .filter_map(|action| match action {
                Action::Reject { task, .. } => Some(*task),
                _ => None,
            })
            .collect();
        let mut rejected_records = Vec::new();
        for action in plan.actions {
            match action {
                Action::Start { task, .. }
                    if !rejected.is_empty()
                        && inner
                            .stage_deps
                            .get(&task)
                            .is_some_and(|needed| needed.iter().any(|t| rejected.contains(t))) =>
                {
                    continue;
                }
                Action::Start { task, placements } => {
                    let Some(record) = self.task_record(task).await? else {
                        continue;
                    };
                    let stored: Vec<StoredPlacement> = placements
                        .iter()
                        .map(|p| StoredPlacement {
                            node: p.node,
                            gpu_indices: p.gpu_indices.clone(),
                        })
                        .collect();
                    let change = TaskChange::Transition(Transition {
                        placements: stored,
                        ..Transition::new(
                            task,
                            TaskState::Queued,
                            TaskState::Starting,
                            record.attempt,
                            plan.at,
                        )
                    });
                    // A task that is not queued any more makes the commit fail, and the
                    // scheduler is rebuilt from the store.
                    let mut started = record;
                    if tacc_store::apply_transition(&mut started, &change).is_ok() {
                        starts.push(started);
                    }
                    changes.push(change);
                }
                // The task keeps the reason its retry was queued with (`retrying in …`).
                Action::Pending {
                    reason: tacc_scheduler::PendingReason::Backoff { .. },
                    ..
                } => {}
                Action::Pending { task, reason } => changes.push(TaskChange::Reason {
                    task,
                    reason: Some(reason.to_string()),
                }),
                Action::Reject { task, reason } => {
                    let Some(record) = self.task_record(task).await? else {
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
                    inner.stage_deps.remove(&task);
                    self.logs.wake(task);
                    rejected_records.push(record);
                }
                Action::Preempt { task, .. } => preempted.push(task),
            }
        }
        self.commit_placing(&changes, &starts).await?;
        for record in starts {
            let Some(spec) = inner.specs.get(&record.id) else {
                continue;
            };
            let secrets = self
                .secret_box
                .task_secrets(&*self.store, &self.logs, &record, spec)
                .await;
            let inputs = self.attempt_inputs(&record).await?;
            let account = self.task_account(&record.user).await;
            for (node, mut assignment) in
                assignments_for(&record, spec, &inner.nodes, &account, &secrets)
            {
                assignment.inputs = inputs.clone();
                if let Some(live) = inner.nodes.get_mut(&node) {
                    live.assignments.insert(assignment.attempt, assignment);
                    self.comm.work_changed(node);
                }
            }
        }
        for record in &rejected_records {
            Box::pin(self.stop_dependents(inner, record, TaskState::Failed)).await?;
        }
        // The agent stops a withdrawn attempt with SIGTERM, then SIGKILL after the task's
        // grace period; its end comes back as a cancelled attempt and is requeued.
        for task in preempted {
            self.stop_to_requeue(inner, task);
        }
        Ok(())
    }

    /// Withdraw `task`'s running attempt from its nodes so that it is requeued once its
    /// agents have stopped it (with its checkpoint signal and grace, as a preemption).
    pub(super) fn stop_to_requeue(&self, inner: &mut Inner, task: TaskId) {
        inner.preempting.insert(task);
        for (node, live) in inner.nodes.iter_mut() {
            let withdrawn: Vec<AttemptRef> = live
                .assignments
                .keys()
                .filter(|a| a.task == task)
                .copied()
                .collect();
            for attempt in withdrawn {
                live.assignments.remove(&attempt);
                live.cancelling.insert(attempt);
                self.comm.work_changed(*node);
            }
        }
    }

    /// Throw the scheduler's state away, rebuild it from the store in one batch, and carry
    /// out what it decides.
    pub(super) async fn resync(&self, inner: &mut Inner) {
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
        patch_dependencies(&inner.stage_deps, &mut batch);
        patch_not_before(&inner.retry_at, &mut batch);
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

/// Give each submitted pipeline stage task the tasks it waits for (kept beside the
/// scheduler, so every way a task reaches it — submit, a retry, a held task released, a
/// rebuild — carries them).
fn patch_dependencies(deps: &BTreeMap<TaskId, Vec<TaskId>>, event: &mut Event) {
    if deps.is_empty() {
        return;
    }
    match event {
        Event::TaskSubmitted { task, request } => {
            if let Some(needed) = deps.get(task) {
                request.depends_on = needed.clone();
            }
        }
        Event::Batch(events) => {
            for event in events {
                patch_dependencies(deps, event);
            }
        }
        _ => {}
    }
}

/// Give each submitted retry that is waiting out its backoff its not-before time (every
/// way it reaches the scheduler: the retry, a held task released, a rebuild).
fn patch_not_before(waits: &BTreeMap<TaskId, Timestamp>, event: &mut Event) {
    if waits.is_empty() {
        return;
    }
    match event {
        Event::TaskSubmitted { task, request } => {
            request.not_before = waits.get(task).copied();
        }
        Event::Batch(events) => {
            for event in events {
                patch_not_before(waits, event);
            }
        }
        _ => {}
    }
}

/// One assignment per node of a placed attempt, rank 0 being the master.
pub(super) fn assignments_for(
    record: &TaskRecord,
    spec: &TaskSpec,
    nodes: &BTreeMap<NodeId, LiveNode>,
    account: &super::TaskAccount,
    secrets: &BTreeMap<String, String>,
) -> Vec<(NodeId, Assignment)> {
    let mut instruction: Instruction = tacc_compiler::compile(
        record.id,
        record.attempt,
        &record.user,
        spec,
        record.snapshot.clone(),
    );
    instruction.unix_user = account.unix_user.clone();
    super::Submission::of(record).apply_to(&mut instruction);
    if let (Some(group), Some(index)) = (record.group, record.group_index) {
        instruction.set_array_element(tacc_compiler::ArrayElement {
            group: group.0,
            index,
        });
    }
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
                    allocation: None,
                    inputs: Vec::new(),
                    task_uid: account.task_uid,
                },
            )
        })
        .collect()
}

/// A rendezvous port for `attempt` on its rank 0's node that no other attempt whose rank
/// 0 runs there holds. The search starts at a point derived from the attempt, so the
/// same attempt gets the same port when a restarted server rebuilds its assignments.
pub(super) fn free_master_port(
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
