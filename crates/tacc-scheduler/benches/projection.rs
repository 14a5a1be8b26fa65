//! One start-estimate projection (`Scheduler::project`, default limits: what the server
//! computes once per scheduler epoch) over 100,000 queued tasks on 10,000 nodes × 8 GPUs
//! that are all busy (80,000 running tasks ending at their time limits).

mod common;

use common::loaded_scheduler;
use criterion::{Criterion, criterion_group, criterion_main};
use tacc_core::TaskId;
use tacc_scheduler::ProjectionLimits;

fn projection(c: &mut Criterion) {
    let scheduler = loaded_scheduler();
    let limits = ProjectionLimits::default();
    let once = scheduler.project(limits);
    eprintln!(
        "projection: {} steps, {} of {} queued tasks given a start",
        once.steps(),
        once.started(),
        scheduler.queue_len()
    );
    let mut group = c.benchmark_group("projection");
    group.sample_size(10);
    group.bench_function("project_100k_queued_10k_nodes", |b| {
        b.iter(|| scheduler.project(limits))
    });
    // `tcloud why` on the first task submitted after the running ones: the projection
    // stops once it starts.
    let head = TaskId(80_001);
    group.bench_function("project_one_task_near_the_head", |b| {
        b.iter(|| scheduler.project_task(head, limits))
    });
    group.finish();
}

criterion_group!(benches, projection);
criterion_main!(benches);
