//! One scheduling decision with the production default (`fairshare`) over 100,000 queued
//! tasks on 10,000 nodes × 8 GPUs that are all busy (80,000 running tasks).

mod common;

use common::loaded_scheduler;
use criterion::{Criterion, criterion_group, criterion_main};
use tacc_core::Timestamp;
use tacc_scheduler::Event;

fn decision(c: &mut Criterion) {
    let mut scheduler = loaded_scheduler();
    let mut group = c.benchmark_group("fairshare");
    group.sample_size(20);
    group.bench_function("decision_100k_queued_10k_nodes", |b| {
        b.iter(|| scheduler.handle(Timestamp(2_000), Event::Tick).unwrap())
    });
    // Each decision here also recomputes every queued task's priority (period elapsed).
    let mut now = 2_000;
    group.bench_function("decision_with_priority_recalc", |b| {
        b.iter(|| {
            now += 61_000;
            scheduler.handle(Timestamp(now), Event::Tick).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
