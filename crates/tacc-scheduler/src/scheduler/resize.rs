//! Adaptive re-allocation as the scheduler sees it: a running task's per-node CPU and
//! memory change in place (its GPUs and nodes stay), and every account that counts what
//! it holds — the nodes' free capacity, its user's and group's usage against their
//! limits, the group's fair-share rate — moves with it, so placement, quotas and fair
//! share always use the allocation in force. [`Scheduler::resize_room`] tells the
//! re-allocation policy how far a task may grow.

use tacc_core::{Resources, TaskId, Timestamp};

use super::Scheduler;
use super::task::Phase;
use crate::SchedulerError;
use crate::config::Limits;
use crate::policy::Usage;

impl Scheduler {
    pub(super) fn resize(
        &mut self,
        now: Timestamp,
        task: TaskId,
        per_node: Resources,
    ) -> Result<(), SchedulerError> {
        let reject = |why: &str| SchedulerError::ResizeRejected {
            task,
            why: why.to_string(),
        };
        let entry = self
            .tasks
            .get(&task)
            .ok_or_else(|| reject("the scheduler does not know it"))?;
        let Phase::Running { placements, .. } = &entry.phase else {
            return Err(reject("it is not running"));
        };
        let old = entry.request.per_node;
        if per_node.gpus != old.gpus {
            return Err(reject("a running task keeps its GPUs"));
        }
        if !self.cluster.can_resize(&old, &per_node, placements) {
            return Err(reject("its nodes lack the free CPU or memory"));
        }
        let nodes = u64::from(entry.request.nodes.max(1));
        let (user, group) = (entry.user, entry.group);
        let grow_cpu = per_node.cpu_millis.saturating_sub(old.cpu_millis) * nodes;
        if grow_cpu > cpu_headroom(&self.users[user].limits, &self.users[user].usage)
            || grow_cpu
                > cpu_headroom(
                    &self.groups[group].account.limits,
                    &self.groups[group].account.usage,
                )
        {
            return Err(reject("its owner's CPU limit would be exceeded"));
        }
        let placements = placements.clone();
        let old_request = entry.request.clone();
        let mut new_request = crate::TaskRequest::clone(&old_request);
        new_request.per_node = per_node;
        self.cluster.resize(&old, &per_node, &placements);
        // The same arithmetic as a stop and a start, so every account moves as one.
        self.refund(now, user, group, &old_request);
        self.charge(now, user, group, &new_request);
        self.tasks.get_mut(&task).expect("known task").request = std::sync::Arc::new(new_request);
        Ok(())
    }

    /// How much CPU and memory per node a running task could add now: the least free on
    /// its nodes, and no more CPU than its user's and group's limits leave. `None` when
    /// the task is not running.
    pub fn resize_room(&self, task: TaskId) -> Option<Resources> {
        let entry = self.tasks.get(&task)?;
        let Phase::Running { placements, .. } = &entry.phase else {
            return None;
        };
        let free = self.cluster.least_free(placements.iter().map(|p| p.node));
        let nodes = u64::from(entry.request.nodes.max(1));
        let quota = cpu_headroom(
            &self.users[entry.user].limits,
            &self.users[entry.user].usage,
        )
        .min(cpu_headroom(
            &self.groups[entry.group].account.limits,
            &self.groups[entry.group].account.usage,
        )) / nodes;
        Some(Resources {
            cpu_millis: free.cpu_millis.min(quota),
            memory_bytes: free.memory_bytes,
            gpus: 0,
        })
    }
}

/// CPU (thousandths) an account may still take under its `max_cpus`.
fn cpu_headroom(limits: &Limits, usage: &Usage) -> u64 {
    limits.max_cpus.map_or(u64::MAX, |max| {
        (max * 1000).saturating_sub(usage.cpu_millis)
    })
}

#[cfg(test)]
mod tests {
    use tacc_core::{NodeId, UserName};

    use crate::config::SchedulerConfig;
    use crate::{Action, Event, NodeSpec, Scheduler, SchedulerError, TaskRequest};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn node(id: u64) -> NodeSpec {
        NodeSpec {
            id: NodeId(id),
            capacity: Resources {
                cpu_millis: 8000,
                memory_bytes: 16 * GIB,
                gpus: 0,
            },
            gpu_type: None,
            labels: Default::default(),
        }
    }

    fn request(user: &str, cpu_millis: u64) -> TaskRequest {
        TaskRequest {
            user: UserName::new(user.to_string()),
            per_node: Resources {
                cpu_millis,
                memory_bytes: 4 * GIB,
                gpus: 0,
            },
            nodes: 1,
            ..TaskRequest::default()
        }
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    fn started(plan: &crate::Plan) -> Vec<TaskId> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, .. } => Some(*task),
                _ => None,
            })
            .collect()
    }

    fn cluster() -> Scheduler {
        let mut scheduler = Scheduler::new();
        scheduler.handle(at(0), Event::NodeUp(node(1))).unwrap();
        scheduler
    }

    #[test]
    fn a_shrink_frees_capacity_for_the_queue() {
        let mut s = cluster();
        let plan = s
            .handle(
                at(1),
                Event::TaskSubmitted {
                    task: TaskId(1),
                    request: request("ann", 6000),
                },
            )
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(1)]);
        let plan = s
            .handle(
                at(2),
                Event::TaskSubmitted {
                    task: TaskId(2),
                    request: request("bob", 4000),
                },
            )
            .unwrap();
        assert!(started(&plan).is_empty());
        assert_eq!(s.resize_room(TaskId(1)).unwrap().cpu_millis, 2000);
        let per_node = Resources {
            cpu_millis: 2000,
            memory_bytes: 2 * GIB,
            gpus: 0,
        };
        let plan = s
            .handle(
                at(3),
                Event::TaskResized {
                    task: TaskId(1),
                    per_node,
                },
            )
            .unwrap();
        assert_eq!(
            started(&plan),
            vec![TaskId(2)],
            "the freed CPUs start the queued task"
        );
        assert_eq!(s.group_usage("ann").cpu_millis, 2000);
        assert_eq!(s.resize_room(TaskId(1)).unwrap().cpu_millis, 2000);
    }

    #[test]
    fn a_grow_beyond_the_node_or_of_gpus_is_rejected_and_changes_nothing() {
        let mut s = cluster();
        s.handle(
            at(1),
            Event::TaskSubmitted {
                task: TaskId(1),
                request: request("ann", 6000),
            },
        )
        .unwrap();
        let too_big = Resources {
            cpu_millis: 9000,
            memory_bytes: 4 * GIB,
            gpus: 0,
        };
        let err = s
            .handle(
                at(2),
                Event::TaskResized {
                    task: TaskId(1),
                    per_node: too_big,
                },
            )
            .unwrap_err();
        assert!(
            matches!(err, SchedulerError::ResizeRejected { .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "task 1 cannot be resized: its nodes lack the free CPU or memory"
        );
        let gpus = Resources {
            cpu_millis: 6000,
            memory_bytes: 4 * GIB,
            gpus: 1,
        };
        assert!(
            s.handle(
                at(2),
                Event::TaskResized {
                    task: TaskId(1),
                    per_node: gpus
                }
            )
            .is_err()
        );
        assert_eq!(s.group_usage("ann").cpu_millis, 6000);
        assert_eq!(s.resize_room(TaskId(1)).unwrap().cpu_millis, 2000);
    }

    #[test]
    fn a_grow_respects_the_owners_cpu_limit() {
        let mut config = SchedulerConfig::default();
        config.users.insert(
            "ann".into(),
            crate::config::UserConfig {
                limits: Limits {
                    max_cpus: Some(5),
                    ..Limits::default()
                },
                ..Default::default()
            },
        );
        let mut s = Scheduler::with_config(config);
        s.handle(at(0), Event::NodeUp(node(1))).unwrap();
        s.handle(
            at(1),
            Event::TaskSubmitted {
                task: TaskId(1),
                request: request("ann", 4000),
            },
        )
        .unwrap();
        assert_eq!(s.resize_room(TaskId(1)).unwrap().cpu_millis, 1000);
        let grow = Resources {
            cpu_millis: 6000,
            memory_bytes: 4 * GIB,
            gpus: 0,
        };
        assert!(
            s.handle(
                at(2),
                Event::TaskResized {
                    task: TaskId(1),
                    per_node: grow
                }
            )
            .is_err()
        );
        let grow = Resources {
            cpu_millis: 5000,
            memory_bytes: 4 * GIB,
            gpus: 0,
        };
        s.handle(
            at(2),
            Event::TaskResized {
                task: TaskId(1),
                per_node: grow,
            },
        )
        .unwrap();
        assert_eq!(s.resize_room(TaskId(1)).unwrap().cpu_millis, 0);
    }

    #[test]
    fn a_queued_task_cannot_be_resized() {
        let mut s = cluster();
        s.handle(
            at(1),
            Event::TaskSubmitted {
                task: TaskId(1),
                request: request("ann", 8000),
            },
        )
        .unwrap();
        s.handle(
            at(1),
            Event::TaskSubmitted {
                task: TaskId(2),
                request: request("bob", 8000),
            },
        )
        .unwrap();
        assert_eq!(s.resize_room(TaskId(2)), None);
        let per_node = Resources {
            cpu_millis: 1000,
            memory_bytes: GIB,
            gpus: 0,
        };
        let err = s
            .handle(
                at(2),
                Event::TaskResized {
                    task: TaskId(2),
                    per_node,
                },
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "task 2 cannot be resized: it is not running"
        );
    }
}
