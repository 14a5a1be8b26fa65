//! Node mode: replay a trace through the full scheduler on nodes × GPUs, with CPU and
//! memory per node as real constraints. Each job's speed follows the speed model
//! (`speed.rs`); with adaptation on, every running job is sampled at a fixed virtual
//! period and its allocation changed through `Event::TaskResized` (`adaptation.rs`), its
//! end time recomputed from the work it has left (`progress.rs`), and whatever a shrink
//! lets the scheduler start is started at once.
//!
//! Time limits: with `oracle_time_limits` a task's limit is its trace duration, its run
//! time at its static request. The scheduler never ends a task by its limit — it only
//! plans backfill with it, and the replay ends each job when its work is done — so a job
//! sped up by adaptation just ends early (its limit is an upper bound, as a user's is),
//! and one slowed down by a custom model is not killed (the plan is then optimistic).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use anyhow::{Context, Result};
use tacc_core::{NodeId, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::{
    Action, Event, NodeSpec, Plan, Scheduler, SchedulerConfig, SchedulerError, TaskRequest,
};

use crate::adaptation::{Adapter, JobAdaptation};
use crate::progress::Progress;
use crate::speed::{ClassId, SpeedModel};
use crate::{TraceJob, tenants};

const GIB: u64 = 1 << 30;

/// How node mode turns trace rows into task requests, and the nodes it runs them on.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// CPUs per node; `None`: 8 per GPU.
    pub cpus_per_node: Option<u64>,
    /// Memory per node in GiB; `None`: 64 GiB per GPU.
    pub memory_gib_per_node: Option<u64>,
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
            cpus_per_node: None,
            memory_gib_per_node: None,
            oracle_time_limits: true,
            preemptible: true,
            proportional_guarantees: false,
            config: SchedulerConfig::default(),
        }
    }

    /// One node's capacity.
    pub fn node_capacity(&self) -> Resources {
        let gpn = u64::from(self.gpus_per_node.max(1));
        Resources::new(
            self.cpus_per_node.unwrap_or(8 * gpn) * 1000,
            self.memory_gib_per_node.unwrap_or(64 * gpn) * GIB,
            self.gpus_per_node.max(1),
        )
    }
}

/// One finished job as the replay saw it.
#[derive(Debug, Clone, Copy)]
pub struct JobOutcome {
    pub job: usize,
    pub class: ClassId,
    pub tenant: usize,
    pub gpus: u32,
    pub submit_ms: u64,
    pub finish_ms: u64,
    /// The trace's duration (its run time at its static request).
    pub trace_duration_ms: u64,
    /// Time it held resources, over all attempts (grace periods included).
    pub held_ms: u64,
    /// GPU-milliseconds held, and weighted by its speed (what GPU utilisation shows).
    pub gpu_ms: f64,
    pub gpu_busy_ms: f64,
    /// CPU-milliseconds (in CPUs, not thousandths) held and used.
    pub cpu_alloc_ms: f64,
    pub cpu_used_ms: f64,
}

/// Re-allocations applied during a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reallocations {
    /// Resizes applied (one may move CPU and memory together).
    pub total: u64,
    pub cpu_grows: u64,
    pub cpu_shrinks: u64,
    pub memory_grows: u64,
    pub memory_shrinks: u64,
    /// Decisions the scheduler refused (the room had changed); none are expected.
    pub rejected: u64,
}

/// Everything one node-mode replay measured.
#[derive(Debug, Clone)]
pub struct NodeReplay {
    pub outcomes: Vec<JobOutcome>,
    pub dropped: usize,
    pub preemptions: u64,
    /// The whole cluster.
    pub capacity: Resources,
    pub reallocations: Reallocations,
}

#[derive(Debug, Clone)]
struct JobState {
    class: ClassId,
    per_node: Resources,
    nodes: u32,
    progress: Progress,
    /// Since when it holds resources (the accounts below are integrated up to here).
    held_since: Option<u64>,
    held_ms: u64,
    gpu_ms: f64,
    gpu_busy_ms: f64,
    cpu_alloc_ms: f64,
    cpu_used_ms: f64,
    adaptation: Option<JobAdaptation>,
}

/// Timer kinds, in the order they fire at one instant.
const COMPLETION: u8 = 0;
const PREEMPTION_STOP: u8 = 1;

struct Replay<'a> {
    jobs: &'a [TraceJob],
    model: &'a SpeedModel,
    adapter: Option<Adapter>,
    scheduler: Scheduler,
    state: Vec<JobState>,
    /// Jobs in the scheduler's running phase (resizable), in id order.
    running: BTreeSet<usize>,
    timers: BinaryHeap<Reverse<(u64, u8, usize, u32)>>,
    grace_ms: u64,
    tenant: Vec<usize>,
    outcomes: Vec<JobOutcome>,
    dropped: usize,
    reallocations: Reallocations,
}

fn task_id(job: usize) -> TaskId {
    TaskId(job as u64 + 1)
}

/// Replay through the full scheduler with every job at its static request and a model
/// where no job's speed depends on its CPUs: tacc-sim's plain node mode.
pub fn run_nodes(jobs: &[TraceJob], policy: &str, options: &NodeOptions) -> Result<crate::Report> {
    let started = std::time::Instant::now();
    let replay = replay_nodes(jobs, policy, options, &SpeedModel::neutral(), false)?;
    let outcomes: Vec<crate::Outcome> = replay
        .outcomes
        .iter()
        .map(|o| crate::Outcome {
            submit_ms: o.submit_ms,
            finish_ms: o.finish_ms,
            duration_ms: o.trace_duration_ms,
            gpus: o.gpus,
            tenant: o.tenant,
        })
        .collect();
    Ok(crate::report(
        policy,
        format!(
            "{} nodes x {} GPUs",
            options.nodes,
            options.gpus_per_node.max(1)
        ),
        &outcomes,
        replay.dropped,
        replay.capacity.gpus as u64,
        replay.preemptions,
        started,
    ))
}

/// Replay on `options`' nodes under `model`; with `adaptive`, jobs are re-allocated
/// as the live cluster would.
pub fn replay_nodes(
    jobs: &[TraceJob],
    policy: &str,
    options: &NodeOptions,
    model: &SpeedModel,
    adaptive: bool,
) -> Result<NodeReplay> {
    let gpn = options.gpus_per_node.max(1);
    let node = options.node_capacity();
    let mut config = options.config.clone();
    if options.proportional_guarantees {
        let capacity = options.nodes as u64 * gpn as u64;
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
                capacity: node,
                gpu_type: None,
                labels: BTreeMap::new(),
            }),
        )?;
    }
    let adapter = adaptive.then(|| Adapter::new(model));
    let state = jobs
        .iter()
        .map(|job| {
            let class = model.class_of(&job.job_id);
            let nodes = job.gpus.div_ceil(gpn);
            let per_node = model.request(class, job.gpus.div_ceil(nodes));
            let speed = model.speed(class, per_node.cpu_millis, per_node.gpus);
            JobState {
                class,
                per_node,
                nodes,
                progress: Progress::new(job.duration_s * 1000, speed),
                held_since: None,
                held_ms: 0,
                gpu_ms: 0.0,
                gpu_busy_ms: 0.0,
                cpu_alloc_ms: 0.0,
                cpu_used_ms: 0.0,
                adaptation: adapter.as_ref().map(|a| a.job(model, per_node)),
            }
        })
        .collect();
    let mut replay = Replay {
        jobs,
        model,
        adapter,
        scheduler,
        state,
        running: BTreeSet::new(),
        timers: BinaryHeap::new(),
        grace_ms,
        tenant: tenants(jobs),
        outcomes: Vec::with_capacity(jobs.len()),
        dropped: 0,
        reallocations: Reallocations::default(),
    };
    replay.run(options)?;
    Ok(NodeReplay {
        outcomes: replay.outcomes,
        dropped: replay.dropped,
        preemptions: replay.scheduler.preemptions(),
        capacity: Resources::new(
            node.cpu_millis * u64::from(options.nodes),
            node.memory_bytes * u64::from(options.nodes),
            gpn * options.nodes,
        ),
        reallocations: replay.reallocations,
    })
}

impl Replay<'_> {
    fn run(&mut self, options: &NodeOptions) -> Result<()> {
        let period = self
            .adapter
            .as_ref()
            .map(|_| self.model.adaptive.sample_every_s * 1000);
        let mut next = 0;
        let mut previous = 0;
        loop {
            while let Some(Reverse((_, _, job, version))) = self.timers.peek() {
                if self.state[*job].progress.version == *version {
                    break;
                }
                self.timers.pop();
            }
            let tick = period
                .filter(|_| !self.running.is_empty())
                .map(|p| (previous / p + 1) * p);
            let now = [
                self.timers.peek().map(|Reverse((t, ..))| *t),
                self.jobs.get(next).map(|j| j.submit_s * 1000),
                tick,
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(now) = now else { break };
            previous = now;
            let mut events = Vec::new();
            while let Some(Reverse((t, kind, job, version))) = self.timers.peek().copied() {
                if t != now {
                    break;
                }
                self.timers.pop();
                if self.state[job].progress.version != version {
                    continue;
                }
                self.state[job].progress.version += 1;
                self.release(job, now);
                if kind == COMPLETION {
                    self.finish(job, now);
                    events.push(Event::TaskEnded(task_id(job)));
                } else {
                    events.push(Event::TaskPreempted(task_id(job)));
                }
            }
            while next < self.jobs.len() && self.jobs[next].submit_s * 1000 == now {
                events.push(self.submission(next, now, options));
                next += 1;
            }
            if !events.is_empty() || tick != Some(now) {
                let plan = self
                    .scheduler
                    .handle(Timestamp(now), Event::Batch(events))?;
                self.carry_out(plan, now);
            }
            if tick == Some(now) {
                self.adapt(now)?;
            }
        }
        Ok(())
    }

    fn submission(&self, job: usize, now: u64, options: &NodeOptions) -> Event {
        let trace = &self.jobs[job];
        let state = &self.state[job];
        Event::TaskSubmitted {
            task: task_id(job),
            request: TaskRequest {
                user: UserName::new(trace.vc.clone()),
                group: Some(trace.vc.clone()),
                per_node: state.per_node,
                nodes: state.nodes,
                preemptible: options.preemptible,
                time_limit_secs: options.oracle_time_limits.then_some(trace.duration_s),
                duration_hint_secs: Some(trace.duration_s),
                submitted_at: Timestamp(now),
                ..TaskRequest::default()
            },
        }
    }

    fn carry_out(&mut self, plan: Plan, now: u64) {
        for action in plan.actions {
            match action {
                Action::Start { task, placements } => {
                    let job = task.0 as usize - 1;
                    let s = &mut self.state[job];
                    s.nodes = placements.len() as u32;
                    let speed = self
                        .model
                        .speed(s.class, s.per_node.cpu_millis, s.per_node.gpus);
                    let end = s.progress.start(now, speed);
                    s.held_since = Some(now);
                    if let Some(a) = &mut s.adaptation {
                        a.restarted();
                    }
                    self.timers
                        .push(Reverse((end, COMPLETION, job, s.progress.version)));
                    self.running.insert(job);
                }
                Action::Preempt { task, .. } => {
                    let job = task.0 as usize - 1;
                    self.running.remove(&job);
                    let p = &mut self.state[job].progress;
                    // The task checkpoints at the signal; the grace period is lost work.
                    if p.preempt(now, self.grace_ms) {
                        self.timers.push(Reverse((
                            now + self.grace_ms,
                            PREEMPTION_STOP,
                            job,
                            p.version,
                        )));
                    }
                }
                Action::Reject { .. } => self.dropped += 1,
                Action::Pending { .. } => {}
            }
        }
    }

    /// Brings the job's accounts up to `now`.
    fn account(&mut self, job: usize, now: u64) {
        let model = self.model;
        let s = &mut self.state[job];
        let Some(since) = s.held_since else { return };
        let dt = now.saturating_sub(since) as f64;
        let nodes = f64::from(s.nodes);
        let demand = model.cpu_demand(s.class, s.per_node.gpus);
        s.held_ms += now.saturating_sub(since);
        s.gpu_ms += f64::from(s.per_node.gpus) * nodes * dt;
        s.gpu_busy_ms += f64::from(s.per_node.gpus) * nodes * dt * s.progress.speed();
        s.cpu_alloc_ms += s.per_node.cpu_millis as f64 / 1000.0 * nodes * dt;
        s.cpu_used_ms += s.per_node.cpu_millis.min(demand) as f64 / 1000.0 * nodes * dt;
        s.held_since = Some(now);
    }

    /// The job stops holding resources at `now`.
    fn release(&mut self, job: usize, now: u64) {
        self.account(job, now);
        self.state[job].held_since = None;
        self.running.remove(&job);
    }

    fn finish(&mut self, job: usize, now: u64) {
        let s = &self.state[job];
        let trace = &self.jobs[job];
        self.outcomes.push(JobOutcome {
            job,
            class: s.class,
            tenant: self.tenant[job],
            gpus: trace.gpus,
            submit_ms: trace.submit_s * 1000,
            finish_ms: now,
            trace_duration_ms: trace.duration_s * 1000,
            held_ms: s.held_ms,
            gpu_ms: s.gpu_ms,
            gpu_busy_ms: s.gpu_busy_ms,
            cpu_alloc_ms: s.cpu_alloc_ms,
            cpu_used_ms: s.cpu_used_ms,
        });
    }

    /// One sampling step: every running job, in id order, is sampled, classified and
    /// perhaps resized; a resize's plan is carried out before the next job is looked at,
    /// so capacity a shrink frees goes to the queue first.
    fn adapt(&mut self, now: u64) -> Result<()> {
        let Some(adapter) = self.adapter.take() else {
            return Ok(());
        };
        let jobs: Vec<usize> = self.running.iter().copied().collect();
        for job in jobs {
            if !self.running.contains(&job) {
                continue; // preempted by an earlier resize's plan
            }
            let task = task_id(job);
            let room = self
                .scheduler
                .resize_room(task)
                .context("a job the replay runs is not running in the scheduler")?;
            let s = &mut self.state[job];
            let (class, current) = (s.class, s.per_node);
            let adaptation = s.adaptation.as_mut().expect("adaptive replay");
            let Some(change) = adapter.step(now, self.model, class, adaptation, current, room)
            else {
                continue;
            };
            let per_node =
                Resources::new(change.to.cpu_millis, change.to.memory_bytes, current.gpus);
            match self
                .scheduler
                .handle(Timestamp(now), Event::TaskResized { task, per_node })
            {
                Ok(plan) => {
                    self.account(job, now);
                    let s = &mut self.state[job];
                    s.per_node = per_node;
                    s.adaptation
                        .as_mut()
                        .expect("adaptive replay")
                        .applied(&change, now);
                    let speed = self.model.speed(class, per_node.cpu_millis, per_node.gpus);
                    if speed != s.progress.speed() {
                        let end = s.progress.change_speed(now, speed);
                        self.timers
                            .push(Reverse((end, COMPLETION, job, s.progress.version)));
                    }
                    let r = &mut self.reallocations;
                    r.total += 1;
                    let grew = |from: u64, to: u64| (to > from, to < from);
                    let (cg, cs) = grew(current.cpu_millis, per_node.cpu_millis);
                    let (mg, ms) = grew(current.memory_bytes, per_node.memory_bytes);
                    r.cpu_grows += u64::from(cg);
                    r.cpu_shrinks += u64::from(cs);
                    r.memory_grows += u64::from(mg);
                    r.memory_shrinks += u64::from(ms);
                    self.carry_out(plan, now);
                }
                Err(SchedulerError::ResizeRejected { .. }) => self.reallocations.rejected += 1,
                Err(e) => {
                    self.adapter = Some(adapter);
                    return Err(e.into());
                }
            }
        }
        self.adapter = Some(adapter);
        Ok(())
    }
}
