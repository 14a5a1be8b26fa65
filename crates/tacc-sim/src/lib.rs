//! `tacc-sim` internals: replay a GPU-cluster trace (CSV, `job_id,user,submit_time_s,
//! duration_s,num_gpus,num_nodes,status,vc`) through `tacc-scheduler` with a virtual clock,
//! either as one GPU pool ([`run_pool`]) or as nodes × GPUs through the full scheduler
//! ([`run_nodes`]), and report job completion times, utilisation and fairness.
//!
//! A thin binary over the scheduler crate: it reads files, the scheduler never does.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tacc_core::{NodeId, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::pool::{PoolAction, PoolJob, PoolPolicy, PoolScheduler};
use tacc_scheduler::{Action, Event, NodeSpec, Scheduler, SchedulerConfig, TaskRequest};

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
struct Outcome {
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

fn tenants(jobs: &[TraceJob]) -> Vec<usize> {
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    jobs.iter()
        .map(|job| {
            let next = index.len();
            *index.entry(&job.vc).or_insert(next)
        })
        .collect()
}

fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Bounded slowdown threshold: jobs shorter than this count as this long, so a one-second
/// job that waited a minute does not dominate a tenant's fairness.
const SLOWDOWN_BOUND_MS: u64 = 10_000;

fn report(
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
struct Progress {
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
    let mut progress: Vec<Progress> = jobs
        .iter()
        .map(|job| Progress {
            remaining_ms: job.duration_s * 1000,
            ..Progress::default()
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

/// How node mode turns trace rows into task requests.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Give each task its true duration as time limit (perfect user estimates), so EASY
    /// backfill can plan; without it only the resources outside reservations backfill.
    pub oracle_time_limits: bool,
    pub preemptible: bool,
    /// Guarantee each tenant GPUs in proportion to its GPU-hours in the replayed trace
    /// (so borrowing and reclaim happen).
    pub proportional_guarantees: bool,
    pub config: SchedulerConfig,
}

impl NodeOptions {
    pub fn new(nodes: u32, gpus_per_node: u32) -> Self {
        NodeOptions {
            nodes,
            gpus_per_node,
            oracle_time_limits: true,
            preemptible: true,
            proportional_guarantees: false,
            config: SchedulerConfig::default(),
        }
    }
}

const CPUS_PER_GPU: u64 = 4;
const GIB: u64 = 1 << 30;

/// Replay through the full scheduler on `nodes × gpus_per_node`. Tenants (vc) become
/// groups; with no user ids in the traces, each tenant is also its own (synthetic) user.
pub fn run_nodes(jobs: &[TraceJob], policy: &str, options: &NodeOptions) -> Result<Report> {
    let started = Instant::now();
    let tenant = tenants(jobs);
    let gpn = options.gpus_per_node.max(1);
    let capacity = options.nodes as u64 * gpn as u64;
    let mut config = options.config.clone();
    if options.proportional_guarantees {
        let mut demand: BTreeMap<&str, f64> = BTreeMap::new();
        for job in jobs {
            *demand.entry(&job.vc).or_default() += job.gpus as f64 * job.duration_s as f64;
        }
        let total: f64 = demand.values().sum();
        for (vc, gpu_secs) in demand {
            let group = config.groups.entry(vc.to_string()).or_default();
            group.guaranteed_gpus = (capacity as f64 * gpu_secs / total).floor() as u64;
        }
    }
    let grace_ms = config.preemption.grace_secs * 1000;
    let mut scheduler = Scheduler::by_name(policy, config)?;
    for id in 1..=options.nodes as u64 {
        scheduler.handle(
            Timestamp(0),
            Event::NodeUp(NodeSpec {
                id: NodeId(id),
                capacity: Resources::new(
                    gpn as u64 * CPUS_PER_GPU * 2000,
                    gpn as u64 * 64 * GIB,
                    gpn,
                ),
                gpu_type: None,
                labels: BTreeMap::new(),
            }),
        )?;
    }
    let mut progress: Vec<Progress> = jobs
        .iter()
        .map(|job| Progress {
            remaining_ms: job.duration_s * 1000,
            ..Progress::default()
        })
        .collect();
    // (time, kind: 0 completion / 1 preemption stop, job, version)
    let mut timers: BinaryHeap<Reverse<(u64, u8, usize, u32)>> = BinaryHeap::new();
    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut dropped = 0;
    let mut next = 0;
    let task_id = |job: usize| TaskId(job as u64 + 1);
    loop {
        while let Some(Reverse((_, _, job, version))) = timers.peek() {
            if progress[*job].version == *version {
                break;
            }
            timers.pop();
        }
        let now = [
            timers.peek().map(|Reverse((t, ..))| *t),
            jobs.get(next).map(|j| j.submit_s * 1000),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = now else { break };
        let mut events = Vec::new();
        while let Some(Reverse((t, kind, job, version))) = timers.peek().copied() {
            if t != now {
                break;
            }
            timers.pop();
            if progress[job].version != version {
                continue;
            }
            progress[job].version += 1;
            if kind == 0 {
                outcomes.push(Outcome {
                    submit_ms: jobs[job].submit_s * 1000,
                    finish_ms: now,
                    duration_ms: jobs[job].duration_s * 1000,
                    gpus: jobs[job].gpus,
                    tenant: tenant[job],
                });
                events.push(Event::TaskEnded(task_id(job)));
            } else {
                events.push(Event::TaskPreempted(task_id(job)));
            }
        }
        while next < jobs.len() && jobs[next].submit_s * 1000 == now {
            let job = &jobs[next];
            let nodes = job.gpus.div_ceil(gpn);
            let per_node_gpus = job.gpus.div_ceil(nodes);
            let request = TaskRequest {
                user: UserName::new(job.vc.clone()),
                group: Some(job.vc.clone()),
                per_node: Resources::new(
                    per_node_gpus as u64 * CPUS_PER_GPU * 1000,
                    per_node_gpus as u64 * 32 * GIB,
                    per_node_gpus,
                ),
                nodes,
                preemptible: options.preemptible,
                time_limit_secs: options.oracle_time_limits.then_some(job.duration_s),
                duration_hint_secs: Some(job.duration_s),
                submitted_at: Timestamp(now),
                ..TaskRequest::default()
            };
            events.push(Event::TaskSubmitted {
                task: task_id(next),
                request,
            });
            next += 1;
        }
        {
            let plan = scheduler.handle(Timestamp(now), Event::Batch(events))?;
            for action in plan.actions {
                match action {
                    Action::Start { task, .. } => {
                        let job = task.0 as usize - 1;
                        let p = &mut progress[job];
                        p.started_at = now;
                        timers.push(Reverse((now + p.remaining_ms, 0, job, p.version)));
                    }
                    Action::Preempt { task, .. } => {
                        let job = task.0 as usize - 1;
                        let p = &mut progress[job];
                        // The task checkpoints at the signal; the grace period is lost work.
                        let ran = now - p.started_at;
                        if p.remaining_ms > ran + grace_ms {
                            p.remaining_ms -= ran;
                            p.version += 1;
                            timers.push(Reverse((now + grace_ms, 1, job, p.version)));
                        }
                    }
                    Action::Reject { .. } => dropped += 1,
                    Action::Pending { .. } => {}
                }
            }
        }
    }
    Ok(report(
        policy,
        format!("{} nodes x {gpn} GPUs", options.nodes),
        &outcomes,
        dropped,
        capacity,
        scheduler.preemptions(),
        started,
    ))
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
