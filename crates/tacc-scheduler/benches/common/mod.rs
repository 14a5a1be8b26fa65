//! The loaded cluster the scheduler's benchmarks share: 100,000 queued tasks on 10,000
//! nodes × 8 GPUs that are all busy (80,000 running one-GPU tasks with time limits).

use tacc_core::{NodeId, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::{Event, NodeSpec, Scheduler, TaskRequest};

const NODES: u64 = 10_000;
const GPUS_PER_NODE: u32 = 8;
const QUEUED: u64 = 100_000;

/// The production default (`fairshare`) over the loaded cluster.
pub fn loaded_scheduler() -> Scheduler {
    let mut scheduler = Scheduler::new();
    let nodes = (1..=NODES)
        .map(|id| {
            Event::NodeUp(NodeSpec {
                id: NodeId(id),
                capacity: Resources::new(64_000, 512 << 30, GPUS_PER_NODE),
                gpu_type: None,
                labels: Default::default(),
            })
        })
        .collect();
    scheduler.handle(Timestamp(0), Event::Batch(nodes)).unwrap();
    let task = |id: u64, gpus: u32, at: u64| Event::TaskSubmitted {
        task: TaskId(id),
        request: TaskRequest {
            user: UserName::new(format!("user{}", id % 200)),
            group: Some(format!("team{}", id % 20)),
            per_node: Resources::new(4_000 * gpus as u64, (32 << 30) * gpus as u64, gpus),
            nodes: 1 + (id % 50 == 0) as u32,
            time_limit_secs: Some(3_600 + id % 7_200),
            submitted_at: Timestamp(at),
            ..Default::default()
        },
    };
    // Fill every GPU: 80,000 one-GPU tasks.
    let running = (1..=NODES * GPUS_PER_NODE as u64)
        .map(|id| task(id, 1, 0))
        .collect();
    scheduler
        .handle(Timestamp(0), Event::Batch(running))
        .unwrap();
    let first = NODES * GPUS_PER_NODE as u64 + 1;
    let queued = (first..first + QUEUED)
        .map(|id| task(id, 1 << (id % 4), 1_000))
        .collect();
    scheduler
        .handle(Timestamp(1_000), Event::Batch(queued))
        .unwrap();
    assert!(scheduler.queue_len() >= QUEUED as usize);
    scheduler
}
