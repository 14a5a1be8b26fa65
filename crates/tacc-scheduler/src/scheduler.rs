use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, Resources, TaskId, Timestamp};

use crate::{NodeSpec, PendingReason, Placement, SchedulerError, TaskRequest};

/// Something that happened, fed to [`Scheduler::handle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    NodeUp(NodeSpec),
    /// The node is gone; tasks placed on it are no longer counted against it.
    NodeDown(NodeId),
    TaskSubmitted {
        task: TaskId,
        request: TaskRequest,
    },
    /// A task already placed before the driver restarted: its resources are taken again.
    TaskRestored {
        task: TaskId,
        request: TaskRequest,
        placements: Vec<Placement>,
    },
    /// Cancelled while queued or running.
    TaskCancelled(TaskId),
    /// Finished in any way (success, failure, lost); its resources are free again.
    TaskEnded(TaskId),
    /// Nothing happened but time passed.
    Tick,
}

/// A decision of the scheduler, for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Start {
        task: TaskId,
        placements: Vec<Placement>,
    },
    /// The task stays queued, for this reason (only emitted when the reason changes).
    Pending { task: TaskId, reason: PendingReason },
    /// The task can never run on this cluster and leaves the queue.
    Reject { task: TaskId, reason: PendingReason },
}

/// The actions decided in answer to one event, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub at: Timestamp,
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone)]
struct NodeState {
    spec: NodeSpec,
    free: Resources,
    free_gpus: BTreeSet<u32>,
}

#[derive(Debug, Clone)]
struct QueuedTask {
    request: TaskRequest,
    last_reason: Option<PendingReason>,
}

/// Queue order key: higher priority first, then earlier submission, then lower id.
type QueueKey = (std::cmp::Reverse<tacc_core::Priority>, Timestamp, TaskId);

/// The scheduler's whole state. First-in first-out within a priority class, with
/// resource fit; a blocked head blocks everyone behind it, so no task starves.
#[derive(Debug, Clone, Default)]
pub struct Scheduler {
    nodes: BTreeMap<NodeId, NodeState>,
    queue: BTreeMap<QueueKey, TaskId>,
    queued: BTreeMap<TaskId, QueuedTask>,
    running: BTreeMap<TaskId, (TaskRequest, Vec<Placement>)>,
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of tasks waiting.
    pub fn queue_len(&self) -> usize {
        self.queued.len()
    }

    /// Apply one event and decide what to do now.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Result<Plan, SchedulerError> {
        let mut actions = Vec::new();
        match event {
            Event::NodeUp(spec) => {
                if self.nodes.contains_key(&spec.id) {
                    return Err(SchedulerError::DuplicateNode(spec.id));
                }
                let free_gpus = (0..spec.capacity.gpus).collect();
                self.nodes.insert(
                    spec.id,
                    NodeState {
                        free: spec.capacity,
                        free_gpus,
                        spec,
                    },
                );
            }
            Event::NodeDown(node) => {
                self.nodes.remove(&node);
            }
            Event::TaskSubmitted { task, request } => {
                if self.queued.contains_key(&task) || self.running.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                if let Some(detail) = self.never_fits(&request) {
                    actions.push(Action::Reject {
                        task,
                        reason: PendingReason::CannotFit { detail },
                    });
                } else {
                    self.enqueue(task, request);
                }
            }
            Event::TaskRestored {
                task,
                request,
                placements,
            } => {
                if self.queued.contains_key(&task) || self.running.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                for placement in &placements {
                    if !self.nodes.contains_key(&placement.node) {
                        return Err(SchedulerError::UnknownNode {
                            task,
                            node: placement.node,
                        });
                    }
                }
                self.take(&request, &placements);
                self.running.insert(task, (request, placements));
            }
            Event::TaskCancelled(task) | Event::TaskEnded(task) => {
                if let Some(queued) = self.queued.remove(&task) {
                    self.queue.remove(&queue_key(task, &queued.request));
                }
                if let Some((request, placements)) = self.running.remove(&task) {
                    self.give_back(&request, &placements);
                }
            }
            Event::Tick => {}
        }
        self.schedule(&mut actions);
        Ok(Plan { at: now, actions })
    }

    fn enqueue(&mut self, task: TaskId, request: TaskRequest) {
        self.queue.insert(queue_key(task, &request), task);
        self.queued.insert(
            task,
            QueuedTask {
                request,
                last_reason: None,
            },
        );
    }

    fn schedule(&mut self, actions: &mut Vec<Action>) {
        let order: Vec<TaskId> = self.queue.values().copied().collect();
        let mut blocked_by: Option<TaskId> = None;
        for task in order {
            let reason = match blocked_by {
                Some(head) => PendingReason::BehindOlderTask { blocked_by: head },
                None => {
                    let request = &self.queued[&task].request;
                    match self.place(request) {
                        Some(placements) => {
                            let queued = self.queued.remove(&task).expect("queued task");
                            self.queue.remove(&queue_key(task, &queued.request));
                            self.take(&queued.request, &placements);
                            self.running
                                .insert(task, (queued.request, placements.clone()));
                            actions.push(Action::Start { task, placements });
                            continue;
                        }
                        None => {
                            blocked_by = Some(task);
                            PendingReason::WaitingForResources
                        }
                    }
                }
            };
            let queued = self.queued.get_mut(&task).expect("queued task");
            if queued.last_reason.as_ref() != Some(&reason) {
                queued.last_reason = Some(reason.clone());
                actions.push(Action::Pending { task, reason });
            }
        }
    }

    /// Choose nodes for every member of the gang, or none at all. Prefers the nodes with
    /// the fewest free GPUs that still fit, so large holes stay open for large tasks.
    fn place(&self, request: &TaskRequest) -> Option<Vec<Placement>> {
        let mut candidates: Vec<&NodeState> = self
            .nodes
            .values()
            .filter(|node| node_matches(&node.spec, request) && node.free.covers(&request.per_node))
            .collect();
        if candidates.len() < request.nodes as usize {
            return None;
        }
        candidates.sort_by_key(|node| (node.free.gpus, node.free.cpu_millis, node.spec.id));
        Some(
            candidates
                .into_iter()
                .take(request.nodes as usize)
                .map(|node| Placement {
                    node: node.spec.id,
                    gpu_indices: node
                        .free_gpus
                        .iter()
                        .take(request.per_node.gpus as usize)
                        .copied()
                        .collect(),
                })
                .collect(),
        )
    }

    fn take(&mut self, request: &TaskRequest, placements: &[Placement]) {
        for placement in placements {
            if let Some(node) = self.nodes.get_mut(&placement.node) {
                node.free = node.free.saturating_sub(&request.per_node);
                for gpu in &placement.gpu_indices {
                    node.free_gpus.remove(gpu);
                }
            }
        }
    }

    fn give_back(&mut self, request: &TaskRequest, placements: &[Placement]) {
        for placement in placements {
            if let Some(node) = self.nodes.get_mut(&placement.node) {
                node.free = node.free.add(&request.per_node);
                node.free_gpus.extend(placement.gpu_indices.iter().copied());
            }
        }
    }

    /// Why the request could not fit even on an empty cluster, if it could not.
    fn never_fits(&self, request: &TaskRequest) -> Option<String> {
        let fitting = self
            .nodes
            .values()
            .filter(|node| {
                node_matches(&node.spec, request) && node.spec.capacity.covers(&request.per_node)
            })
            .count();
        if fitting >= request.nodes as usize {
            return None;
        }
        let largest = self
            .nodes
            .values()
            .map(|node| node.spec.capacity)
            .max_by_key(|cap| (cap.gpus, cap.cpu_millis, cap.memory_bytes));
        Some(match largest {
            None => "the cluster has no nodes".to_string(),
            Some(largest) => format!(
                "it asks for {} node(s) with {} each, but only {fitting} node(s) can hold that (largest node: {largest})",
                request.nodes, request.per_node
            ),
        })
    }
}

fn node_matches(node: &NodeSpec, request: &TaskRequest) -> bool {
    match &request.gpu_type {
        Some(wanted) => node.gpu_type.as_deref() == Some(wanted.as_str()),
        None => true,
    }
}

fn queue_key(task: TaskId, request: &TaskRequest) -> QueueKey {
    (
        std::cmp::Reverse(request.priority),
        request.submitted_at,
        task,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{Priority, UserName};

    fn node(id: u64, cpus: u64, gpus: u32) -> Event {
        Event::NodeUp(NodeSpec {
            id: NodeId(id),
            capacity: Resources::new(cpus * 1000, 64 << 30, gpus),
            gpu_type: None,
            labels: Default::default(),
        })
    }

    fn request(cpus: u64, gpus: u32, nodes: u32, at: u64) -> TaskRequest {
        TaskRequest {
            user: UserName::new("alice"),
            per_node: Resources::new(cpus * 1000, 1 << 30, gpus),
            nodes,
            gpu_type: None,
            priority: Priority::Normal,
            preemptible: false,
            time_limit_secs: None,
            submitted_at: Timestamp(at),
        }
    }

    fn submit(s: &mut Scheduler, id: u64, req: TaskRequest) -> Plan {
        s.handle(
            req.submitted_at,
            Event::TaskSubmitted {
                task: TaskId(id),
                request: req,
            },
        )
        .unwrap()
    }

    fn started(plan: &Plan) -> Vec<TaskId> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, .. } => Some(*task),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn fifo_starts_what_fits_and_blocks_behind_the_head() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 2)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(3, 1, 1, 1))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, request(2, 0, 1, 2));
        assert!(started(&plan).is_empty());
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::WaitingForResources
            }]
        );
        // Task 3 would fit, but FIFO keeps it behind task 2.
        let plan = submit(&mut s, 3, request(1, 0, 1, 3));
        assert!(started(&plan).is_empty());
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        assert_eq!(started(&plan), vec![TaskId(2), TaskId(3)]);
    }

    #[test]
    fn gangs_start_on_all_nodes_or_none() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 4)).unwrap();
        s.handle(Timestamp(0), node(2, 4, 4)).unwrap();
        submit(&mut s, 1, request(1, 2, 1, 1));
        let plan = submit(&mut s, 2, request(1, 4, 2, 2));
        assert!(started(&plan).is_empty(), "only one node has 4 free GPUs");
        let plan = s.handle(Timestamp(3), Event::TaskEnded(TaskId(1))).unwrap();
        match &plan.actions[..] {
            [Action::Start { task, placements }] => {
                assert_eq!(*task, TaskId(2));
                assert_eq!(placements.len(), 2);
                assert!(placements.iter().all(|p| p.gpu_indices == vec![0, 1, 2, 3]));
            }
            other => panic!("unexpected plan {other:?}"),
        }
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
    fn high_priority_goes_first_and_gpu_indices_are_distinct() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 2)).unwrap();
        submit(&mut s, 1, request(8, 0, 1, 1));
        submit(&mut s, 2, request(1, 1, 1, 2));
        let mut high = request(1, 1, 1, 3);
        high.priority = Priority::High;
        submit(&mut s, 3, high);
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        let starts: Vec<_> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, placements } => {
                    Some((*task, placements[0].gpu_indices.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(starts, vec![(TaskId(3), vec![0]), (TaskId(2), vec![1])]);
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
}
