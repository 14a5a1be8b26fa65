//! Start-estimate projections (`Scheduler::project`: what the server computes once per
//! scheduler epoch) over 100,000 queued tasks on 10,000 nodes × 8 GPUs that are all busy
//! (80,000 running tasks ending at their time limits), at several step caps; the copy of
//! the state every projection starts with; and the projection `tcloud why` makes for one
//! task near the head of the queue.

mod common;

use common::loaded_scheduler;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use tacc_core::{TaskId, Timestamp};
use tacc_scheduler::{Projection, ProjectionLimits};

fn projection(c: &mut Criterion) {
    let scheduler = loaded_scheduler();
    let mut group = c.benchmark_group("projection");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.bench_function("copy_of_the_state", |b| b.iter(|| scheduler.clone()));
    let mut default: Option<Projection> = None;
    let default_steps = ProjectionLimits::default().max_steps;
    for max_steps in [16, 64, 256] {
        let limits = ProjectionLimits {
            max_steps,
            ..ProjectionLimits::default()
        };
        let once = scheduler.project(limits);
        eprintln!(
            "projection capped at {max_steps} steps: {} steps, {} of {} queued tasks given a start",
            once.steps(),
            once.started(),
            scheduler.queue_len()
        );
        group.bench_function(
            format!("project_100k_queued_10k_nodes_{max_steps}_steps"),
            |b| b.iter(|| scheduler.project(limits)),
        );
        if max_steps == default_steps {
            default = Some(once);
        }
    }
    // The first queued task (by id) the projection starts: one asked about alone stops
    // once it starts.
    let default = default.expect("a projection");
    let at = Timestamp(1_000);
    let head = (80_001..)
        .map(TaskId)
        .find(|id| {
            default
                .estimate(*id, at)
                .is_some_and(|e| e.latest_at().is_some())
        })
        .expect("a task the projection starts");
    group.bench_function("project_one_task_near_the_head", |b| {
        b.iter(|| scheduler.project_task(head, ProjectionLimits::default()))
    });
    group.finish();
}

criterion_group!(benches, projection);
criterion_main!(benches);
