//! `tacc-sim` internals: replay a GPU-cluster trace (CSV, `job_id,user,submit_time_s,
//! duration_s,num_gpus,num_nodes,status,vc`) through `tacc-scheduler` with a virtual clock,
//! either as one GPU pool ([`run_pool`]) or as nodes × GPUs through the full scheduler
//! ([`run_nodes`]), and report job completion times, utilisation and fairness. In node
//! mode a per-job speed model ([`SpeedModel`]) can make each job's speed depend on its
//! CPUs, and [`run_compare`] replays the trace with static and with adaptive allocation
//! (`tacc-sim --adaptive`, docs/ADAPTIVE.md).
//!
//! A thin binary over the scheduler crate: it reads files, the scheduler never does.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tacc_scheduler::pool::{PoolAction, PoolJob, PoolPolicy, PoolScheduler};

mod adaptation;
mod compare;
mod nodes;
mod progress;
mod speed;

pub use adaptation::{Adapter, JobAdaptation};
pub use compare::{ClassFigures, ModelReport, compare_table, run_compare};
pub use nodes::{JobOutcome, NodeOptions, NodeReplay, Reallocations, replay_nodes, run_nodes};
pub use progress::Progress;
pub use speed::{
    AdaptiveParams, ClassId, ClassParams, DEFAULT_MODEL_TOML, RequestDefaults, SpeedModel,
};

/// One row of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    pub job_id: String,
    pub submit_s: u64,
    pub duration_s: u64,
    pub gpus: u32,
    /// Tenant: Philly's virtual cluster, or ITP's cluster id.
    pub vc: String,
}

#[derive(Debug, serde::Deserialize)]
struct Row {
    job_id: String,
    #[allow(dead_code)]
    user: Option<String>,
    submit_time_s: u64,
    duration_s: u64,
    num_gpus: u32,
    #[allow(dead_code)]
    num_nodes: Option<u32>,
    #[allow(dead_code)]
    status: Option<String>,
    vc: String,
}

/// Read a trace, optionally keeping only one tenant (`vc`).
pub fn load_trace(path: &Path, vc: Option<&str>) -> Result<Vec<TraceJob>> {
    let mut reader = csv::Reader::from_path(path)
        .with_context(|| format!("cannot open trace {}", path.display()))?;
    let mut jobs = Vec::new();
    for (line, row) in reader.deserialize::<Row>().enumerate() {
        let row = row.with_context(|| format!("{}: bad row {}", path.display(), line + 2))?;
        if vc.is_some_and(|vc| vc != row.vc) {
            continue;
        }
        jobs.push(TraceJob {
            job_id: row.job_id,
            submit_s: row.submit_time_s,
            duration_s: row.duration_s,
            gpus: row.num_gpus,
            vc: row.vc,
        });
    }
    if jobs.is_empty() {
        bail!(
            "no jobs in {}{}",
            path.display(),
            vc.map(|vc| format!(" for --vc {vc}")).unwrap_or_default()
        );
    }
    // Stable: ties keep file order, which is the arrival order.
    jobs.sort_by_key(|job| job.submit_s);
    Ok(jobs)
}

/// A finished job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    submit_ms: u64,
    finish_ms: u64,
    duration_ms: u64,
    gpus: u32,
    tenant: usize,
}

/// What a replay measured. Times in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub policy: String,
    pub mode: String,
    pub jobs_done: usize,
    pub jobs_dropped: usize,
    pub avg_jct_s: f64,
    pub avg_queue_s: f64,
    pub p50_jct_s: f64,
    pub p99_jct_s: f64,
    pub makespan_s: f64,
    pub utilization: f64,
    pub preemptions: u64,
    /// Jain's index over the tenants' mean bounded slowdown (1 = all tenants equal).
    pub jain_fairness: f64,
    pub wall_time_s: f64,
    /// Sorted job completion times, for the CDF plot.
    #[serde(skip)]
    pub jcts_s: Vec<f64>,
}

pub(crate) fn tenants(jobs: &[TraceJob]) -> Vec<usize> {
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    jobs.iter()
        .map(|job| {
            let next = index.len();
            *index.entry(&job.vc).or_insert(next)
        })
        .collect()
}

pub(crate) fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Bounded slowdown threshold: jobs shorter than this count as this long, so a one-second
/// job that waited a minute does not dominate a tenant's fairness.
const SLOWDOWN_BOUND_MS: u64 = 10_000;

pub(crate) fn report(
    policy: &str,
    mode: String,
    outcomes: &[Outcome],
    dropped: usize,
    capacity_gpus: u64,
    preemptions: u64,
    started: Instant,
) -> Report {
    let secs = |ms: u64| ms as f64 / 1000.0;
    let mut jcts: Vec<f64> = outcomes
        .iter()
        .map(|o| secs(o.finish_ms - o.submit_ms))
        .collect();
    jcts.sort_by(f64::total_cmp);
    let n = outcomes.len().max(1) as f64;
    let first_submit = outcomes.iter().map(|o| o.submit_ms).min().unwrap_or(0);
    let last_finish = outcomes.iter().map(|o| o.finish_ms).max().unwrap_or(0);
    let makespan_ms = last_finish.saturating_sub(first_submit);
    let busy: f64 = outcomes
        .iter()
        .map(|o| o.gpus as f64 * secs(o.duration_ms))
        .sum();
    let mut per_tenant: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for o in outcomes {
        let jct = (o.finish_ms - o.submit_ms) as f64;
        let slowdown = (jct / o.duration_ms.max(SLOWDOWN_BOUND_MS) as f64).max(1.0);
        let slot = per_tenant.entry(o.tenant).or_default();
        slot.0 += slowdown;
        slot.1 += 1.0;
    }
    let means: Vec<f64> = per_tenant
        .values()
        .map(|(sum, count)| sum / count)
        .collect();
    let sum: f64 = means.iter().sum();
    let squares: f64 = means.iter().map(|x| x * x).sum();
    let jain = if squares > 0.0 {
        sum * sum / (means.len() as f64 * squares)
    } else {
        1.0
    };
    Report {
        policy: policy.to_string(),
        mode,
        jobs_done: outcomes.len(),
        jobs_dropped: dropped,
        avg_jct_s: jcts.iter().sum::<f64>() / n,
        avg_queue_s: outcomes
            .iter()
            .map(|o| secs(o.finish_ms - o.submit_ms - o.duration_ms))
            .sum::<f64>()
            / n,
        p50_jct_s: nearest_rank(&jcts, 0.50),
        p99_jct_s: nearest_rank(&jcts, 0.99),
        makespan_s: secs(makespan_ms),
        utilization: if makespan_ms == 0 {
            0.0
        } else {
            busy / (capacity_gpus as f64 * secs(makespan_ms))
        },
        preemptions,
        jain_fairness: jain,
        wall_time_s: started.elapsed().as_secs_f64(),
        jcts_s: jcts,
    }
}

/// Per-job progress the simulator keeps (the scheduler never sees true durations except
/// as the `sjf` oracle hint).
#[derive(Debug, Clone, Copy, Default)]
struct PoolProgress {
    remaining_ms: u64,
    started_at: u64,
    /// Bumped whenever a scheduled completion becomes stale.
    version: u32,
}

/// Replay in pool mode (see `tacc_scheduler::pool` for the exact semantics).
pub fn run_pool(jobs: &[TraceJob], policy: PoolPolicy, capacity_gpus: u32) -> Report {
    let started = Instant::now();
    let tenant = tenants(jobs);
    let mut pool = PoolScheduler::new(policy, capacity_gpus);
    let mut progress: Vec<PoolProgress> = jobs
        .iter()
        .map(|job| PoolProgress {
            remaining_ms: job.duration_s * 1000,
            ..PoolProgress::default()
        })
        .collect();
    let mut completions: BinaryHeap<Reverse<(u64, usize, u32)>> = BinaryHeap::new();
    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut dropped = 0;
    let mut next = 0;
    loop {
        while let Some(Reverse((_, job, version))) = completions.peek() {
            if progress[*job].version == *version {
                break;
            }
            completions.pop();
        }
        let now = [
            completions.peek().map(|Reverse((t, _, _))| *t),
            jobs.get(next).map(|job| job.submit_s * 1000),
            pool.next_wakeup(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = now else { break };
        while let Some(Reverse((t, job, version))) = completions.peek().copied() {
            if t != now {
                break;
            }
            completions.pop();
            if progress[job].version != version {
                continue;
            }
            pool.complete(now, job as u64);
            outcomes.push(Outcome {
                submit_ms: jobs[job].submit_s * 1000,
                finish_ms: now,
                duration_ms: jobs[job].duration_s * 1000,
                gpus: jobs[job].gpus,
                tenant: tenant[job],
            });
        }
        pool.advance(now);
        while next < jobs.len() && jobs[next].submit_s * 1000 == now {
            let job = PoolJob {
                id: next as u64,
                gpus: jobs[next].gpus,
                duration_ms: jobs[next].duration_s * 1000,
            };
            if pool.submit(now, job).is_err() {
                dropped += 1;
            }
            next += 1;
        }
        for action in pool.decide(now) {
            match action {
                PoolAction::Start(id) => {
                    let p = &mut progress[id as usize];
                    p.started_at = now;
                    completions.push(Reverse((now + p.remaining_ms, id as usize, p.version)));
                }
                PoolAction::Preempt(id) => {
                    let p = &mut progress[id as usize];
                    p.remaining_ms -= now - p.started_at;
                    p.version += 1;
                }
            }
        }
    }
    report(
        policy.name(),
        format!("pool {capacity_gpus} GPUs"),
        &outcomes,
        dropped,
        capacity_gpus as u64,
        pool.preemptions(),
        started,
    )
}

/// The results as an aligned text table.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>5} {:>11} {:>9} {:>11} {:>11} {:>6} {:>11} {:>8} {:>6} {:>8}",
        "policy",
        "done",
        "drop",
        "avg JCT s",
        "p50 s",
        "p99 s",
        "avg queue s",
        "util",
        "makespan s",
        "preempt",
        "jain",
        "wall s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<14} {:>7} {:>5} {:>11.0} {:>9.0} {:>11.0} {:>11.0} {:>6.3} {:>11.0} {:>8} {:>6.3} {:>8.3}",
            r.policy,
            r.jobs_done,
            r.jobs_dropped,
            r.avg_jct_s,
            r.p50_jct_s,
            r.p99_jct_s,
            r.avg_queue_s,
            r.utilization,
            r.makespan_s,
            r.preemptions,
            r.jain_fairness,
            r.wall_time_s
        );
    }
    out
}

/// A JCT CDF per policy (log-scale x axis), drawn through `tacc-plot` as SVG or PNG.
pub fn cdf_chart(reports: &[Report]) -> tacc_plot::LineChart {
    let series = reports
        .iter()
        .map(|r| {
            let n = r.jcts_s.len().max(1);
            // At most ~2000 points a line: the curve looks the same and the file stays small.
            let step = (n / 2000).max(1);
            let points = r
                .jcts_s
                .iter()
                .enumerate()
                .filter(|(k, _)| k % step == 0 || k + 1 == n)
                .map(|(k, jct)| (*jct, (k + 1) as f64 / n as f64))
                .collect();
            tacc_plot::LineSeries {
                name: r.policy.clone(),
                points,
            }
        })
        .collect();
    tacc_plot::LineChart {
        title: "JCT CDF per policy".into(),
        x_label: "job completion time (s, log scale)".into(),
        y_label: "fraction of jobs".into(),
        log_x: true,
        y_range: Some((0.0, 1.0)),
        series,
        width: 720,
        height: 440,
    }
}
