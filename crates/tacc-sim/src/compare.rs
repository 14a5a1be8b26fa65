//! `tacc-sim --adaptive`: the same trace, nodes and speed model replayed twice — every
//! job at its static request, then with adaptive re-allocation — and reported side by
//! side: JCT, queueing delay, GPU and CPU utilisation, re-allocations, and the mean JCT
//! of each job class (where the difference comes from).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::nodes::{NodeOptions, NodeReplay, Reallocations, replay_nodes};
use crate::speed::SpeedModel;
use crate::{TraceJob, nearest_rank};

/// One replay's figures. Times in seconds; utilisations are fractions of the cluster's
/// capacity over the makespan.
#[derive(Debug, Clone, Serialize)]
pub struct ModelReport {
    pub policy: String,
    /// `static` or `adaptive`.
    pub allocation: String,
    pub mode: String,
    pub jobs_done: usize,
    pub jobs_dropped: usize,
    pub avg_jct_s: f64,
    pub p50_jct_s: f64,
    pub p95_jct_s: f64,
    pub p99_jct_s: f64,
    /// Time a job held no resources between its submission and its end (the first wait
    /// and any wait after a preemption).
    pub avg_queue_s: f64,
    pub makespan_s: f64,
    /// GPUs held by jobs.
    pub gpu_allocated: f64,
    /// GPUs held, weighted by each job's speed: what GPU utilisation would show.
    pub gpu_busy: f64,
    /// CPUs held by jobs, and used by them (the least of allocation and demand).
    pub cpu_allocated: f64,
    pub cpu_used: f64,
    pub preemptions: u64,
    pub reallocations: Reallocations,
    /// Per job class (in the model's order).
    pub classes: BTreeMap<String, ClassFigures>,
    pub wall_time_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassFigures {
    pub jobs: usize,
    pub avg_jct_s: f64,
    /// Mean time holding resources.
    pub avg_run_s: f64,
    pub avg_queue_s: f64,
}

/// Replays `jobs` with static and with adaptive allocation: `[static, adaptive]`.
pub fn run_compare(
    jobs: &[TraceJob],
    policy: &str,
    options: &NodeOptions,
    model: &SpeedModel,
) -> Result<[ModelReport; 2]> {
    let mode = format!(
        "{} nodes x {} GPUs, {} CPUs, {} GiB",
        options.nodes,
        options.gpus_per_node.max(1),
        options.node_capacity().cpu_millis / 1000,
        options.node_capacity().memory_bytes >> 30
    );
    let mut reports = Vec::with_capacity(2);
    for adaptive in [false, true] {
        let started = Instant::now();
        let replay = replay_nodes(jobs, policy, options, model, adaptive)?;
        reports.push(model_report(
            policy,
            if adaptive { "adaptive" } else { "static" },
            &mode,
            model,
            &replay,
            started,
        ));
    }
    let adaptive = reports.pop().expect("two replays");
    let fixed = reports.pop().expect("two replays");
    Ok([fixed, adaptive])
}

fn model_report(
    policy: &str,
    allocation: &str,
    mode: &str,
    model: &SpeedModel,
    replay: &NodeReplay,
    started: Instant,
) -> ModelReport {
    let secs = |ms: u64| ms as f64 / 1000.0;
    let outcomes = &replay.outcomes;
    let n = outcomes.len().max(1) as f64;
    let mut jcts: Vec<f64> = outcomes
        .iter()
        .map(|o| secs(o.finish_ms - o.submit_ms))
        .collect();
    jcts.sort_by(f64::total_cmp);
    let queue = |o: &crate::JobOutcome| secs(o.finish_ms - o.submit_ms - o.held_ms);
    let first = outcomes.iter().map(|o| o.submit_ms).min().unwrap_or(0);
    let last = outcomes.iter().map(|o| o.finish_ms).max().unwrap_or(0);
    let makespan_ms = last.saturating_sub(first) as f64;
    let share = |used: f64, capacity: f64| {
        if makespan_ms > 0.0 && capacity > 0.0 {
            used / (capacity * makespan_ms)
        } else {
            0.0
        }
    };
    let gpus = f64::from(replay.capacity.gpus);
    let cpus = replay.capacity.cpu_millis as f64 / 1000.0;
    let sum = |f: fn(&crate::JobOutcome) -> f64| outcomes.iter().map(f).sum::<f64>();
    let mut classes: BTreeMap<String, ClassFigures> = BTreeMap::new();
    for o in outcomes {
        let c = classes
            .entry(model.class_name(o.class).to_string())
            .or_default();
        c.jobs += 1;
        c.avg_jct_s += secs(o.finish_ms - o.submit_ms);
        c.avg_run_s += secs(o.held_ms);
        c.avg_queue_s += queue(o);
    }
    for c in classes.values_mut() {
        let k = c.jobs as f64;
        c.avg_jct_s /= k;
        c.avg_run_s /= k;
        c.avg_queue_s /= k;
    }
    ModelReport {
        policy: policy.to_string(),
        allocation: allocation.to_string(),
        mode: mode.to_string(),
        jobs_done: outcomes.len(),
        jobs_dropped: replay.dropped,
        avg_jct_s: jcts.iter().sum::<f64>() / n,
        p50_jct_s: nearest_rank(&jcts, 0.50),
        p95_jct_s: nearest_rank(&jcts, 0.95),
        p99_jct_s: nearest_rank(&jcts, 0.99),
        avg_queue_s: outcomes.iter().map(queue).sum::<f64>() / n,
        makespan_s: makespan_ms / 1000.0,
        gpu_allocated: share(sum(|o| o.gpu_ms), gpus),
        gpu_busy: share(sum(|o| o.gpu_busy_ms), gpus),
        cpu_allocated: share(sum(|o| o.cpu_alloc_ms), cpus),
        cpu_used: share(sum(|o| o.cpu_used_ms), cpus),
        preemptions: replay.preemptions,
        reallocations: replay.reallocations,
        classes,
        wall_time_s: started.elapsed().as_secs_f64(),
    }
}

/// The reports as two aligned text tables: the figures, then the mean JCT per class.
pub fn compare_table(reports: &[ModelReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:<9} {:>6} {:>10} {:>9} {:>10} {:>11} {:>7} {:>7} {:>7} {:>7} {:>8} {:>7} {:>7}",
        "policy",
        "alloc",
        "done",
        "avg JCT s",
        "p50 s",
        "p95 s",
        "avg queue s",
        "GPU",
        "busy",
        "CPU",
        "used",
        "realloc",
        "preempt",
        "wall s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<11} {:<9} {:>6} {:>10.0} {:>9.0} {:>10.0} {:>11.0} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>8} {:>7} {:>7.1}",
            r.policy,
            r.allocation,
            r.jobs_done,
            r.avg_jct_s,
            r.p50_jct_s,
            r.p95_jct_s,
            r.avg_queue_s,
            r.gpu_allocated,
            r.gpu_busy,
            r.cpu_allocated,
            r.cpu_used,
            r.reallocations.total,
            r.preemptions,
            r.wall_time_s
        );
    }
    let names: Vec<&String> = reports
        .iter()
        .flat_map(|r| r.classes.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let _ = write!(
        out,
        "\nmean JCT s by class\n{:<11} {:<9}",
        "policy", "alloc"
    );
    for name in &names {
        let _ = write!(out, " {name:>17}");
    }
    out.push('\n');
    for r in reports {
        let _ = write!(out, "{:<11} {:<9}", r.policy, r.allocation);
        for name in &names {
            match r.classes.get(*name) {
                Some(c) => {
                    let _ = write!(out, " {:>17}", format!("{:.0} ({})", c.avg_jct_s, c.jobs));
                }
                None => {
                    let _ = write!(out, " {:>17}", "-");
                }
            }
        }
        out.push('\n');
    }
    out
}
