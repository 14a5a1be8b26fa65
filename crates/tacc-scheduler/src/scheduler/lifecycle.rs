//! How each event changes the scheduler's state: nodes come, go, drain and resume; tasks
//! are submitted (or rejected at once), restored after a restart, start, stop for a
//! preemption and go back to the queue, or leave (ended, failed, cancelled). Starting and
//! stopping keep the cluster, the accounts, the queue and the end times in step.

use tacc_core::{TaskId, Timestamp};

use super::task::{Phase, TaskEntry};
use super::{Action, Event, Refusal, Scheduler};
use crate::{PendingReason, Placement, SchedulerError, TaskRequest};

impl Scheduler {
    pub(super) fn apply(
        &mut self,
        now: Timestamp,
        event: Event,
        actions: &mut Vec<Action>,
    ) -> Result<(), SchedulerError> {
        match event {
            Event::NodeUp(spec) => self.cluster.add(spec)?,
            Event::TaskResized { task, per_node } => self.resize(now, task, per_node)?,
            Event::NodeDown(node) => self.cluster.remove(node),
            Event::NodeDrained(node) => self.cluster.drain(node),
            Event::NodeResumed(node) => self.cluster.resume(node),
            Event::TaskSubmitted { task, request } => {
                if self.tasks.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                self.submit(now, task, request, actions);
            }
            Event::TaskRestored {
                task,
                request,
                placements,
            } => {
                if self.tasks.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                if let Some(missing) = placements.iter().find(|p| !self.cluster.contains(p.node)) {
                    return Err(SchedulerError::UnknownNode {
                        task,
                        node: missing.node,
                    });
                }
                self.insert_queued(now, task, request);
                self.start(now, task, placements, None);
            }
            Event::TaskCancelled(task) | Event::TaskEnded(task) | Event::TaskFailed(task) => {
                self.forget(now, task);
            }
            Event::TaskPreempted(task) => self.requeue(now, task),
            Event::Tick => {}
            Event::Batch(events) => {
                for event in events {
                    self.apply(now, event, actions)?;
                }
            }
        }
        Ok(())
    }

    fn submit(
        &mut self,
        now: Timestamp,
        task: TaskId,
        request: TaskRequest,
        actions: &mut Vec<Action>,
    ) {
        if let Some(refusal) = self.refusal(&request) {
            actions.push(Action::Reject {
                task,
                reason: refusal.reason,
            });
            return;
        }
        self.insert_queued(now, task, request);
    }

    /// Why `request` would be refused at submit, if it would: what a submission event
    /// rejects, asked before the task exists so that a server can refuse the submission
    /// itself (one decision for both). A request no node's labels match yet waits for
    /// such a node (see `consider`); one that the matching nodes could never hold is
    /// refused, unless it asks to wait for capacity; one above a hard limit of its user
    /// or group (with nothing else running) is refused always.
    pub fn refusal(&self, request: &TaskRequest) -> Option<Refusal> {
        if !request.wait_for_capacity
            && self.cluster.selector_unmet(request).is_none()
            && let Some(misfit) = self.cluster.misfit(request)
        {
            return Some(Refusal {
                reason: PendingReason::CannotFit {
                    detail: misfit.detail,
                },
                misfit: Some(misfit.part),
            });
        }
        let (user, group) = self.accounts_view(request);
        self.over_limits_forever(&user, &group, request)
            .map(|reason| Refusal {
                reason,
                misfit: None,
            })
    }

    fn insert_queued(&mut self, now: Timestamp, task: TaskId, mut request: TaskRequest) {
        let (user, group) = self.accounts_of(&request);
        // The tenant is the scheduler's to decide, never the caller's: shares of one GPU
        // meet only within it.
        request.gpu_tenant = request.gpu_share.map(|_| {
            self.config
                .share_gpus_within
                .tenant(request.user.as_str(), &self.groups[group].account.name)
        });
        let priority = request
            .priority
            .min(self.config.priority_cap(request.user.as_str()));
        let entry = TaskEntry {
            request: std::sync::Arc::new(request),
            user,
            group,
            priority,
            attempt: 1,
            attained_gpu_ms: 0,
            rank: 0,
            end_key: u64::MAX,
            phase: Phase::Queued { reason: None },
            shape: Default::default(),
        };
        self.tasks.insert(task, entry);
        self.count_queued(user, group, true);
        self.enqueue(now, task);
    }

    /// When the task is expected to end if it starts at `started_at` (its time limit), in
    /// ms; `u64::MAX` when it has none.
    fn end_key(&self, started_at: Timestamp, request: &TaskRequest) -> u64 {
        request
            .time_limit_secs
            .or(self.config.default_time_limit_secs)
            .map_or(u64::MAX, |limit| started_at.plus_secs(limit).as_millis())
    }

    /// The queued task takes `placements` now; `actions` gets its start (none for a task
    /// restored after a restart, which runs already).
    pub(super) fn start(
        &mut self,
        now: Timestamp,
        task: TaskId,
        placements: Vec<Placement>,
        actions: Option<&mut Vec<Action>>,
    ) {
        let (request, key, user, group) = {
            let entry = &self.tasks[&task];
            (
                entry.request.clone(),
                entry.queue_key(task),
                entry.user,
                entry.group,
            )
        };
        self.runs.cut(&self.queue, &key);
        self.queue.remove(&key);
        self.cluster.take(task, &request, &placements);
        self.charge(now, user, group, &request);
        if !self.claims.is_empty() {
            self.claims.retain(|c| c.task != task);
        }
        let end_key = self.end_key(now, &request);
        self.ends.insert((end_key, task));
        self.running.insert(task);
        if request.preemptible {
            self.preemptible_running += 1;
        }
        let entry = self.tasks.get_mut(&task).expect("known task");
        entry.end_key = end_key;
        entry.phase = Phase::Running {
            placements: placements.clone(),
            started_at: now,
        };
        if let Some(actions) = actions {
            actions.push(Action::Start { task, placements });
        }
    }

    /// Free what the task holds; it stays known (as queued) for the caller to drop or requeue.
    fn release(&mut self, now: Timestamp, task: TaskId) {
        let Some(entry) = self.tasks.get(&task) else {
            return;
        };
        let Some((placements, started_at)) = entry.phase.holding() else {
            return;
        };
        let placements = placements.to_vec();
        let request = entry.request.clone();
        let (user, group, end_key) = (entry.user, entry.group, entry.end_key);
        self.cluster.give_back(task, &request, &placements);
        self.refund(now, user, group, &request);
        self.ends.remove(&(end_key, task));
        self.running.remove(&task);
        let entry = self.tasks.get_mut(&task).expect("known task");
        // Tasks being preempted were already taken off the preemptible count.
        if request.preemptible && matches!(entry.phase, Phase::Running { .. }) {
            self.preemptible_running -= 1;
        }
        // Shares count as such: half a GPU for an hour is half a GPU-hour.
        entry.attained_gpu_ms += now.millis_since(started_at) * request.gpu_hundredths()
            / u64::from(tacc_core::GPU_HUNDREDTHS);
        entry.end_key = u64::MAX;
        entry.phase = Phase::Queued { reason: None };
    }

    /// The task leaves the scheduler (ended, failed or cancelled).
    fn forget(&mut self, now: Timestamp, task: TaskId) {
        self.release(now, task);
        if let Some(entry) = self.tasks.remove(&task) {
            let key = entry.queue_key(task);
            self.runs.cut(&self.queue, &key);
            self.queue.remove(&key);
            self.count_queued(entry.user, entry.group, false);
        }
    }

    /// A preempted task has stopped: it waits again, as its next attempt.
    fn requeue(&mut self, now: Timestamp, task: TaskId) {
        let holds = self.tasks.get(&task).is_some_and(|e| !e.phase.is_queued());
        if !holds {
            return;
        }
        self.release(now, task);
        self.tasks.get_mut(&task).expect("known task").attempt += 1;
        self.enqueue(now, task);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn a_drained_node_takes_nothing_new_until_resumed() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(1, 0, 1, 1))),
            vec![TaskId(1)]
        );
        s.handle(Timestamp(2), Event::NodeDrained(NodeId(1)))
            .unwrap();
        assert!(started(&submit(&mut s, 2, request(1, 0, 1, 3))).is_empty());
        let plan = s
            .handle(Timestamp(4), Event::NodeResumed(NodeId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    #[test]
    fn a_selector_is_rejected_only_when_its_nodes_are_too_small() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 2, &[("kind", "slurm")]))
            .unwrap();
        s.handle(Timestamp(0), node(2, 64, 0)).unwrap();
        // Nodes carry the label, but none of them could ever hold 8 CPUs.
        let plan = submit(&mut s, 1, selecting(8, 1, &[("kind", "slurm")]));
        match &plan.actions[..] {
            [
                Action::Reject {
                    reason: PendingReason::CannotFit { detail },
                    ..
                },
            ] => assert!(detail.contains("labels"), "{detail}"),
            other => panic!("{other:?}"),
        }
        // A gang of two waits while only one node carries the label.
        let mut gang = selecting(1, 2, &[("kind", "slurm")]);
        gang.nodes = 2;
        let plan = submit(&mut s, 2, gang);
        let Some(PendingReason::NoMatchingNode { detail }) = pending_reason(&plan, 2) else {
            panic!("{plan:?}");
        };
        assert!(
            detail.contains("2 node(s) labelled kind=slurm, and only 1 of the 2 node(s) up is"),
            "{detail}"
        );
    }

    #[test]
    fn impossible_requests_are_rejected_at_submit() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        let plan = submit(&mut s, 1, request(8, 0, 1, 1));
        match &plan.actions[..] {
            [Action::Reject { task, reason }] => {
                assert_eq!(*task, TaskId(1));
                assert!(
                    reason.to_string().contains("largest node: 4 cpu"),
                    "{reason}"
                );
            }
            other => panic!("unexpected plan {other:?}"),
        }
        assert_eq!(s.queue_len(), 0);
    }

    #[test]
    fn a_refusal_is_the_submit_decision_asked_in_advance_and_names_the_part_at_fault() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 2)).unwrap();
        let too_many_cpus = request(8, 0, 1, 1);
        let refusal = s.refusal(&too_many_cpus).expect("refused");
        assert_eq!(refusal.misfit, Some(crate::MisfitPart::Cpus));
        // The event rejects with the very same reason.
        let plan = submit(&mut s, 1, too_many_cpus);
        assert_eq!(
            plan.actions,
            vec![Action::Reject {
                task: TaskId(1),
                reason: refusal.reason.clone()
            }]
        );
        let mut h100 = request(1, 1, 1, 2);
        h100.gpu_type = Some("H100".into());
        let refusal = s.refusal(&h100).expect("refused");
        assert_eq!(refusal.misfit, Some(crate::MisfitPart::GpuType));
        assert!(
            refusal.reason.to_string().contains("GPU types: none"),
            "{}",
            refusal.reason
        );
        assert_eq!(
            s.refusal(&request(1, 3, 1, 3)).unwrap().misfit,
            Some(crate::MisfitPart::Gpus)
        );
        assert_eq!(s.refusal(&request(2, 1, 1, 3)), None);
        // Asking nothing of the scheduler's state: no account was opened.
        assert_eq!(s.queue_len(), 0);
    }

    #[test]
    fn a_request_waiting_for_capacity_waits_aside_and_starts_when_a_node_can_hold_it() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        let mut big = request(8, 0, 1, 1);
        big.wait_for_capacity = true;
        assert_eq!(s.refusal(&big), None);
        let plan = submit(&mut s, 1, big);
        match pending_reason(&plan, 1) {
            Some(PendingReason::WaitingForCapacity { detail }) => {
                assert!(detail.contains("largest node: 4 cpu"), "{detail}")
            }
            other => panic!("{other:?} in {plan:?}"),
        }
        // No estimate: it waits for a node, not for the timeline.
        match s.explain(TaskId(1)) {
            crate::Explanation::Queued {
                estimated_start, ..
            } => assert_eq!(estimated_start, None),
            other => panic!("{other:?}"),
        }
        // It holds up nothing behind it, even first-in first-out.
        assert_eq!(
            started(&submit(&mut s, 2, request(1, 0, 1, 2))),
            vec![TaskId(2)]
        );
        let plan = s.handle(Timestamp(3), node(2, 16, 0)).unwrap();
        assert_eq!(started(&plan), vec![TaskId(1)]);
    }

    #[test]
    fn restored_tasks_hold_their_resources() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 2, 0)).unwrap();
        s.handle(
            Timestamp(0),
            Event::TaskRestored {
                task: TaskId(1),
                request: request(2, 0, 1, 0),
                placements: vec![Placement {
                    node: NodeId(1),
                    gpu_indices: vec![],
                }],
            },
        )
        .unwrap();
        assert!(started(&submit(&mut s, 2, request(1, 0, 1, 1))).is_empty());
        let plan = s
            .handle(Timestamp(2), Event::TaskCancelled(TaskId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    #[test]
    fn priority_is_capped_per_user_and_gpu_type_is_honoured() {
        let config = SchedulerConfig {
            default_max_priority: Some(Priority::Normal),
            ..Default::default()
        };
        let mut s = Scheduler::by_name("fifo", config).unwrap();
        s.handle(
            Timestamp(0),
            Event::NodeUp(NodeSpec {
                id: NodeId(1),
                capacity: Resources::new(8000, 1 << 34, 2),
                gpu_type: Some("V100".into()),
                labels: Default::default(),
            }),
        )
        .unwrap();
        s.handle(Timestamp(0), node(2, 8, 2)).unwrap();
        let mut typed = request(1, 1, 1, 0);
        typed.gpu_type = Some("V100".into());
        typed.priority = Priority::High;
        let plan = submit(&mut s, 1, typed);
        match &plan.actions[..] {
            [Action::Start { placements, .. }] => assert_eq!(placements[0].node, NodeId(1)),
            other => panic!("{other:?}"),
        }
        let mut a100 = request(1, 1, 1, 0);
        a100.gpu_type = Some("A100".into());
        assert!(matches!(
            submit(&mut s, 2, a100).actions[..],
            [Action::Reject { .. }]
        ));
    }
}
