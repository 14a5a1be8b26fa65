//! How scheduling decisions are made and carried out: events go to the scheduler (one at
//! a time, or deferred and decided as one batch), each plan is committed in one store
//! transaction before its started attempts are handed to their nodes' desired work, and a
//! plan that cannot be recorded rebuilds the scheduler from the store, which is the truth.

use super::effects::Effects;
use super::*;

impl Control {
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
            let inputs = self.attempt_inputs(record).await?;
            let account = self.task_account(&record.user).await;
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
