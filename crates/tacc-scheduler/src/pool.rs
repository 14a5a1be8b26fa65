//! Pool mode: the cluster as one pool of G GPUs — no nodes, no placement constraints, no
//! preemption cost, a job's speed independent of where it runs. This is the model of the
//! trace-driven studies (Tiresias, Gandiva, …) and the fast path of `tacc-sim --pool-gpus`.
//!
//! Semantics (time in integer milliseconds, so every decision is exact):
//! - a job asking for more than G GPUs is refused ([`SchedulerError::PoolJobTooLarge`]);
//! - the driver reports, for each instant, completions first, then calls
//!   [`PoolScheduler::advance`] (LAS demotions due by then), then arrivals, then
//!   [`PoolScheduler::decide`] once;
//! - `fifo`: strict arrival order, a blocked head blocks everyone;
//! - `fifo-backfill` (no time limits in a pool): arrival order, every waiting job that fits
//!   starts (greedy skipping);
//! - `sjf`: true duration, ties by arrival, greedy skipping, non-preemptive;
//! - `las2d`: attained service = GPUs × seconds run; queues split at 3250 and 7200
//!   GPU-seconds; at every arrival, completion or demotion the allocation is recomputed
//!   from scratch — queues in order, arrival order within a queue, greedy skipping — and
//!   running jobs not selected are preempted (they resume later, losing nothing).
//!
//! Costs: `fifo` O(1) per start; `fifo-backfill` and `sjf` O(distinct job sizes) per start
//! (one FIFO or ordered set per size: the earliest job that fits is the head of one of the
//! size buckets ≤ free); `las2d` keeps each queue as a segment tree over arrival order (sum,
//! min, running and waiting counts), so a from-scratch greedy allocation is a handful of
//! O(log n) descents — one per run of consecutive selected jobs, at most G — and the diff
//! against the running set visits only the jobs that change.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SchedulerError;
use crate::policy::LAS2D_THRESHOLDS_GPU_SECS;

/// The policies pool mode implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PoolPolicy {
    Fifo,
    FifoBackfill,
    Sjf,
    Las2d,
}

impl PoolPolicy {
    pub const ALL: [PoolPolicy; 4] = [
        PoolPolicy::Fifo,
        PoolPolicy::FifoBackfill,
        PoolPolicy::Sjf,
        PoolPolicy::Las2d,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PoolPolicy::Fifo => "fifo",
            PoolPolicy::FifoBackfill => "fifo-backfill",
            PoolPolicy::Sjf => "sjf",
            PoolPolicy::Las2d => "las2d",
        }
    }
}

impl fmt::Display for PoolPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PoolPolicy {
    type Err = SchedulerError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        PoolPolicy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| SchedulerError::UnknownPolicy {
                name: name.to_string(),
                known: "fifo, fifo-backfill, sjf, las2d (pool mode)".to_string(),
            })
    }
}

/// A job as pool mode sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolJob {
    pub id: u64,
    pub gpus: u32,
    /// True run time: only `sjf` (an oracle) looks at it.
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PoolAction {
    /// Stop the job now; it keeps its progress and waits to be started again.
    Preempt(u64),
    /// Run the job from now on.
    Start(u64),
}

#[derive(Debug, Clone)]
struct PoolJobState {
    seq: usize,
    gpus: u32,
    duration_ms: u64,
    running: bool,
    started_at: u64,
    /// GPU-milliseconds received before the current run.
    attained_gpu_ms: u64,
    level: usize,
    demotion_at: Option<u64>,
}

/// A segment tree over arrival positions: per range, the GPUs of present jobs, the
/// smallest job, and how many present jobs run / wait.
#[derive(Debug, Clone)]
struct ArrivalTree {
    size: usize,
    sum: Vec<u64>,
    min: Vec<u32>,
    running: Vec<u32>,
    waiting: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

impl ArrivalTree {
    fn new() -> Self {
        Self::with_size(1024)
    }

    fn with_size(size: usize) -> Self {
        ArrivalTree {
            size,
            sum: vec![0; 2 * size],
            min: vec![ABSENT; 2 * size],
            running: vec![0; 2 * size],
            waiting: vec![0; 2 * size],
        }
    }

    fn grow_to(&mut self, pos: usize) {
        if pos < self.size {
            return;
        }
        let mut size = self.size;
        while size <= pos {
            size *= 2;
        }
        let mut bigger = ArrivalTree::with_size(size);
        for leaf in 0..self.size {
            let i = self.size + leaf;
            if self.min[i] != ABSENT {
                bigger.set(leaf, Some((self.min[i], self.running[i] == 1)));
            }
        }
        *self = bigger;
    }

    /// Put a job (GPUs, running?) at `pos`, or clear it.
    fn set(&mut self, pos: usize, job: Option<(u32, bool)>) {
        self.grow_to(pos);
        let mut i = self.size + pos;
        match job {
            Some((gpus, running)) => {
                self.sum[i] = gpus as u64;
                self.min[i] = gpus;
                self.running[i] = running as u32;
                self.waiting[i] = !running as u32;
            }
            None => {
                self.sum[i] = 0;
                self.min[i] = ABSENT;
                self.running[i] = 0;
                self.waiting[i] = 0;
            }
        }
        while i > 1 {
            i /= 2;
            let (l, r) = (2 * i, 2 * i + 1);
            self.sum[i] = self.sum[l] + self.sum[r];
            self.min[i] = self.min[l].min(self.min[r]);
            self.running[i] = self.running[l] + self.running[r];
            self.waiting[i] = self.waiting[l] + self.waiting[r];
        }
    }

    /// First present job at or after `from` with at most `cap` GPUs.
    fn first_fit(&self, from: usize, cap: u64) -> Option<usize> {
        self.first_fit_in(1, 0, self.size, from, cap)
    }

    fn first_fit_in(
        &self,
        node: usize,
        lo: usize,
        hi: usize,
        from: usize,
        cap: u64,
    ) -> Option<usize> {
        if hi <= from || self.min[node] == ABSENT || self.min[node] as u64 > cap {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.first_fit_in(2 * node, lo, mid, from, cap)
            .or_else(|| self.first_fit_in(2 * node + 1, mid, hi, from, cap))
    }

    /// The longest run `[from, end)` whose GPUs add up to at most `cap`; returns `end`
    /// and the run's GPUs.
    fn run_end(&self, from: usize, cap: u64) -> (usize, u64) {
        let mut taken = 0;
        let end = self.run_end_in(1, 0, self.size, from, cap, &mut taken);
        (end.unwrap_or(self.size), taken)
    }

    fn run_end_in(
        &self,
        node: usize,
        lo: usize,
        hi: usize,
        from: usize,
        cap: u64,
        taken: &mut u64,
    ) -> Option<usize> {
        if hi <= from {
            return None;
        }
        if lo >= from && *taken + self.sum[node] <= cap {
            *taken += self.sum[node];
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.run_end_in(2 * node, lo, mid, from, cap, taken)
            .or_else(|| self.run_end_in(2 * node + 1, mid, hi, from, cap, taken))
    }

    /// Positions in `[lo, hi)` of jobs that run (`want_running`) or wait.
    fn collect(&self, lo: usize, hi: usize, want_running: bool, out: &mut Vec<usize>) {
        self.collect_in(1, 0, self.size, lo, hi, want_running, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn collect_in(
        &self,
        node: usize,
        nlo: usize,
        nhi: usize,
        lo: usize,
        hi: usize,
        want_running: bool,
        out: &mut Vec<usize>,
    ) {
        let count = if want_running {
            self.running[node]
        } else {
            self.waiting[node]
        };
        if count == 0 || nhi <= lo || hi <= nlo {
            return;
        }
        if nhi - nlo == 1 {
            out.push(nlo);
            return;
        }
        let mid = (nlo + nhi) / 2;
        self.collect_in(2 * node, nlo, mid, lo, hi, want_running, out);
        self.collect_in(2 * node + 1, mid, nhi, lo, hi, want_running, out);
    }
}

/// The pool scheduler: pure and deterministic like [`crate::Scheduler`].
#[derive(Debug, Clone)]
pub struct PoolScheduler {
    policy: PoolPolicy,
    capacity: u32,
    free: u32,
    jobs: BTreeMap<u64, PoolJobState>,
    /// Job id by arrival position.
    by_seq: Vec<u64>,
    fifo: VecDeque<u64>,
    /// Waiting jobs per size, in arrival order (`fifo-backfill`).
    arrival_buckets: BTreeMap<u32, VecDeque<(usize, u64)>>,
    /// Waiting jobs per size, by (duration, arrival) (`sjf`).
    duration_buckets: BTreeMap<u32, BTreeSet<(u64, usize, u64)>>,
    /// One tree per LAS queue (`las2d`).
    levels: [ArrivalTree; 3],
    demotions: BTreeSet<(u64, usize)>,
    preemptions: u64,
}

const LAS_THRESHOLDS_GPU_MS: [u64; 2] = [
    LAS2D_THRESHOLDS_GPU_SECS[0] * 1000,
    LAS2D_THRESHOLDS_GPU_SECS[1] * 1000,
];

impl PoolScheduler {
    pub fn new(policy: PoolPolicy, capacity_gpus: u32) -> Self {
        PoolScheduler {
            policy,
            capacity: capacity_gpus,
            free: capacity_gpus,
            jobs: BTreeMap::new(),
            by_seq: Vec::new(),
            fifo: VecDeque::new(),
            arrival_buckets: BTreeMap::new(),
            duration_buckets: BTreeMap::new(),
            levels: [ArrivalTree::new(), ArrivalTree::new(), ArrivalTree::new()],
            demotions: BTreeSet::new(),
            preemptions: 0,
        }
    }

    pub fn policy(&self) -> PoolPolicy {
        self.policy
    }

    pub fn free_gpus(&self) -> u32 {
        self.free
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Jobs known (waiting or running).
    pub fn active_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// When the next LAS demotion is due, so the driver can wake up exactly then.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.demotions.first().map(|(at, _)| *at)
    }

    pub fn submit(&mut self, _now_ms: u64, job: PoolJob) -> Result<(), SchedulerError> {
        if job.gpus > self.capacity {
            return Err(SchedulerError::PoolJobTooLarge {
                job: job.id,
                gpus: job.gpus,
                capacity: self.capacity,
            });
        }
        if self.jobs.contains_key(&job.id) {
            return Err(SchedulerError::DuplicatePoolJob(job.id));
        }
        let seq = self.by_seq.len();
        self.by_seq.push(job.id);
        self.jobs.insert(
            job.id,
            PoolJobState {
                seq,
                gpus: job.gpus,
                duration_ms: job.duration_ms,
                running: false,
                started_at: 0,
                attained_gpu_ms: 0,
                level: 0,
                demotion_at: None,
            },
        );
        self.enqueue_waiting(job.id);
        Ok(())
    }

    fn enqueue_waiting(&mut self, id: u64) {
        let job = &self.jobs[&id];
        match self.policy {
            PoolPolicy::Fifo => self.fifo.push_back(id),
            PoolPolicy::FifoBackfill => self
                .arrival_buckets
                .entry(job.gpus)
                .or_default()
                .push_back((job.seq, id)),
            PoolPolicy::Sjf => {
                self.duration_buckets.entry(job.gpus).or_default().insert((
                    job.duration_ms,
                    job.seq,
                    id,
                ));
            }
            PoolPolicy::Las2d => self.levels[job.level].set(job.seq, Some((job.gpus, false))),
        }
    }

    /// The job finished: it leaves the pool and its GPUs are free.
    pub fn complete(&mut self, _now_ms: u64, id: u64) {
        let Some(job) = self.jobs.remove(&id) else {
            return;
        };
        if job.running {
            self.free += job.gpus;
        }
        if let Some(at) = job.demotion_at {
            self.demotions.remove(&(at, job.seq));
        }
        if self.policy == PoolPolicy::Las2d {
            self.levels[job.level].set(job.seq, None);
        }
        // Only running jobs complete, and only las2d keeps running jobs in a queue.
    }

    /// Apply the LAS demotions due at or before `now_ms`.
    pub fn advance(&mut self, now_ms: u64) {
        while let Some(&(at, seq)) = self.demotions.first() {
            if at > now_ms {
                break;
            }
            self.demotions.remove(&(at, seq));
            let id = self.by_seq[seq];
            let job = self.jobs.get_mut(&id).expect("demoted job is known");
            job.demotion_at = None;
            self.levels[job.level].set(seq, None);
            job.level += 1;
            self.levels[job.level].set(seq, Some((job.gpus, job.running)));
            self.schedule_demotion(id);
        }
    }

    fn schedule_demotion(&mut self, id: u64) {
        let job = self.jobs.get_mut(&id).expect("known job");
        if job.level >= LAS_THRESHOLDS_GPU_MS.len() || job.gpus == 0 || !job.running {
            return;
        }
        let missing = LAS_THRESHOLDS_GPU_MS[job.level].saturating_sub(job.attained_gpu_ms);
        let at = job.started_at + missing.div_ceil(job.gpus as u64);
        job.demotion_at = Some(at);
        self.demotions.insert((at, job.seq));
    }

    /// Decide the allocation now; actions are preemptions first, then starts, each in
    /// arrival order.
    pub fn decide(&mut self, now_ms: u64) -> Vec<PoolAction> {
        let mut actions = Vec::new();
        match self.policy {
            PoolPolicy::Fifo => {
                while let Some(&id) = self.fifo.front() {
                    if self.jobs[&id].gpus > self.free {
                        break;
                    }
                    self.fifo.pop_front();
                    self.run(now_ms, id, &mut actions);
                }
            }
            PoolPolicy::FifoBackfill => loop {
                let earliest = self
                    .arrival_buckets
                    .range(..=self.free)
                    .filter_map(|(gpus, queue)| queue.front().map(|(seq, _)| (*seq, *gpus)))
                    .min();
                let Some((_, gpus)) = earliest else { break };
                let bucket = self.arrival_buckets.get_mut(&gpus).expect("bucket");
                let (_, id) = bucket.pop_front().expect("non-empty bucket");
                self.run(now_ms, id, &mut actions);
            },
            PoolPolicy::Sjf => loop {
                let shortest = self
                    .duration_buckets
                    .range(..=self.free)
                    .filter_map(|(gpus, queue)| queue.first().map(|key| (*key, *gpus)))
                    .min();
                let Some((key, gpus)) = shortest else { break };
                self.duration_buckets
                    .get_mut(&gpus)
                    .expect("bucket")
                    .remove(&key);
                self.run(now_ms, key.2, &mut actions);
            },
            PoolPolicy::Las2d => self.decide_las2d(now_ms, &mut actions),
        }
        actions
    }

    fn run(&mut self, now_ms: u64, id: u64, actions: &mut Vec<PoolAction>) {
        let job = self.jobs.get_mut(&id).expect("known job");
        job.running = true;
        job.started_at = now_ms;
        self.free -= job.gpus;
        actions.push(PoolAction::Start(id));
    }

    fn decide_las2d(&mut self, now_ms: u64, actions: &mut Vec<PoolAction>) {
        // Greedy from scratch: queues in order, arrival order, skipping what does not fit.
        let mut room = self.capacity as u64;
        let mut selected: [Vec<(usize, usize)>; 3] = Default::default();
        for (level, tree) in self.levels.iter().enumerate() {
            let mut from = 0;
            while room > 0 {
                let Some(first) = tree.first_fit(from, room) else {
                    break;
                };
                let (end, gpus) = tree.run_end(first, room);
                selected[level].push((first, end));
                room -= gpus;
                from = end;
            }
        }
        let mut stop = Vec::new();
        let mut go = Vec::new();
        for (level, ranges) in selected.iter().enumerate() {
            let tree = &self.levels[level];
            let mut gap_start = 0;
            for &(lo, hi) in ranges {
                tree.collect(gap_start, lo, true, &mut stop);
                tree.collect(lo, hi, false, &mut go);
                gap_start = hi;
            }
            tree.collect(gap_start, tree.size, true, &mut stop);
        }
        stop.sort_unstable();
        go.sort_unstable();
        for seq in stop {
            let id = self.by_seq[seq];
            let job = self.jobs.get_mut(&id).expect("running job");
            job.running = false;
            job.attained_gpu_ms += (now_ms - job.started_at) * job.gpus as u64;
            if let Some(at) = job.demotion_at.take() {
                self.demotions.remove(&(at, seq));
            }
            self.free += job.gpus;
            self.levels[job.level].set(seq, Some((job.gpus, false)));
            self.preemptions += 1;
            actions.push(PoolAction::Preempt(id));
        }
        for seq in go {
            let id = self.by_seq[seq];
            self.run(now_ms, id, actions);
            let job = &self.jobs[&id];
            self.levels[job.level].set(seq, Some((job.gpus, true)));
            self.schedule_demotion(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, gpus: u32, secs: u64) -> PoolJob {
        PoolJob {
            id,
            gpus,
            duration_ms: secs * 1000,
        }
    }

    #[test]
    fn fifo_blocks_behind_head_while_backfill_skips() {
        for (policy, expected) in [
            (PoolPolicy::Fifo, vec![PoolAction::Start(1)]),
            (
                PoolPolicy::FifoBackfill,
                vec![PoolAction::Start(1), PoolAction::Start(3)],
            ),
        ] {
            let mut pool = PoolScheduler::new(policy, 4);
            pool.submit(0, job(1, 3, 10)).unwrap();
            pool.submit(0, job(2, 2, 10)).unwrap();
            pool.submit(0, job(3, 1, 10)).unwrap();
            assert_eq!(pool.decide(0), expected, "{policy}");
        }
    }

    #[test]
    fn sjf_prefers_short_jobs_that_fit() {
        let mut pool = PoolScheduler::new(PoolPolicy::Sjf, 2);
        pool.submit(0, job(1, 1, 100)).unwrap();
        pool.submit(0, job(2, 2, 1)).unwrap();
        pool.submit(0, job(3, 1, 50)).unwrap();
        assert_eq!(pool.decide(0), vec![PoolAction::Start(2)]);
        pool.complete(1000, 2);
        assert_eq!(
            pool.decide(1000),
            vec![PoolAction::Start(3), PoolAction::Start(1)]
        );
    }

    #[test]
    fn las2d_demotes_exactly_and_preempts_for_newcomers() {
        let mut pool = PoolScheduler::new(PoolPolicy::Las2d, 3);
        pool.submit(0, job(1, 3, 100_000)).unwrap();
        assert_eq!(pool.decide(0), vec![PoolAction::Start(1)]);
        // 3250 GPU-s at 3 GPUs: 1083.333 s, rounded up to the millisecond.
        assert_eq!(pool.next_wakeup(), Some(1_083_334));
        pool.submit(500_000, job(2, 1, 10)).unwrap();
        assert_eq!(pool.decide(500_000), vec![], "same queue, arrival order");
        pool.advance(1_083_334);
        assert_eq!(
            pool.decide(1_083_334),
            vec![PoolAction::Preempt(1), PoolAction::Start(2)]
        );
        assert_eq!(pool.preemptions(), 1);
        pool.complete(1_093_334, 2);
        assert_eq!(pool.decide(1_093_334), vec![PoolAction::Start(1)]);
        // It ran 1_083_334 ms x 3 = 3_250_002 GPU-ms; 7_200_000 is 1_316_666 ms away.
        assert_eq!(pool.next_wakeup(), Some(1_093_334 + 1_316_666));
    }

    #[test]
    fn oversized_jobs_are_refused() {
        let mut pool = PoolScheduler::new(PoolPolicy::Las2d, 8);
        assert!(matches!(
            pool.submit(0, job(1, 9, 1)),
            Err(SchedulerError::PoolJobTooLarge { .. })
        ));
    }
}
