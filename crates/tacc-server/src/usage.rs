//! What running tasks use, for `tcloud top` and `tcloud show`: the latest sample of each
//! rank of each running attempt (in memory: a server restart loses only a few seconds of
//! it), the peak of each rank of each attempt (durable, in the store), the GPUs each node
//! registered, and two flags: the first rank that failed, and a rank that has written no
//! output and used no CPU (where that is measured) for longer than
//! [`ServerConfig::silent_after`](crate::ServerConfig::silent_after).
//!
//! Agents stamp samples with their own clock; only differences of the agent's times are
//! used (`at` minus the last output), applied to the server's clock at receipt, so a
//! node's skewed clock cannot make a rank look silent or alive.
//!
//! For the dashboard's plots each rank of each attempt also keeps a bounded series of its
//! samples ([`SERIES_POINTS`] per rank, [`SERIES_KEPT`] ranks, in memory): it outlives the
//! attempt, so a task that just ended still shows its curves, and the oldest series go
//! first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tacc_core::{AttemptNo, NodeId, TaskId, TaskState, Timestamp};
use tacc_proto::{
    AttemptOutcome, AttemptRef, GpuDevice, RankUsage, TaskUsage, UsageFlag, UsagePeakView,
    UsageSample,
};
use tacc_schema::TaskSpec;
use tacc_store::{Store, TaskRecord, UsagePeak};

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::{Control, ServerError};

/// Below this a rank counts as using no CPU (a process blocked on I/O or a lock uses
/// almost none; a busy or computing one uses far more).
pub(crate) const CPU_ACTIVE_MILLIS: u64 = 50;

/// Samples of attempts that sent nothing for this long are dropped (their node is gone
/// or the attempt ended without a report reaching us).
const STALE_AFTER: Duration = Duration::from_secs(600);

/// The latest attempts of a multi-node task whose kept rank ends are read for their
/// "failed first" flag.
const FLAGGED_ATTEMPTS: u32 = 10;

/// First failures kept at most (the oldest go first).
const FAILURES_KEPT: usize = 10_000;

/// Samples kept per rank for the plots: 24 minutes at the agents' 2 s interval.
pub(crate) const SERIES_POINTS: usize = 720;
/// Rank series kept at most (≈ 30 MB at most); the one sampled longest ago goes first.
pub(crate) const SERIES_KEPT: usize = 1_024;

/// One sample of one rank, as plotted: the server's clock, and what the rank used.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SeriesPoint {
    pub(crate) at: Timestamp,
    /// Cores used on average since the previous sample, where measured.
    pub(crate) cpus: Option<f64>,
    pub(crate) memory_bytes: Option<u64>,
    /// The mean utilisation of the rank's GPUs; `None` without GPUs.
    pub(crate) gpu_percent: Option<f64>,
    pub(crate) gpu_memory_bytes: Option<u64>,
}

/// The kept samples of one rank of one attempt.
#[derive(Debug, Clone)]
pub(crate) struct RankSeries {
    pub(crate) node_rank: u32,
    pub(crate) node: String,
    pub(crate) points: VecDeque<SeriesPoint>,
}

impl SeriesPoint {
    fn of(sample: &UsageSample, at: Timestamp) -> SeriesPoint {
        let gpus = &sample.gpus;
        SeriesPoint {
            at,
            cpus: sample.cpu_millis_used.map(|m| m as f64 / 1000.0),
            memory_bytes: sample.memory_bytes,
            gpu_percent: (!gpus.is_empty()).then(|| {
                gpus.iter()
                    .map(|g| f64::from(g.utilization_percent))
                    .sum::<f64>()
                    / gpus.len() as f64
            }),
            gpu_memory_bytes: (!gpus.is_empty())
                .then(|| gpus.iter().map(|g| g.memory_used_bytes).sum()),
        }
    }
}

/// What one node's GPUs do now, from the latest samples of the ranks running there.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeGpuUse {
    /// GPU index → its latest utilisation, percent.
    pub(crate) utilization: BTreeMap<u32, u32>,
    pub(crate) memory_used_bytes: u64,
}

impl NodeGpuUse {
    /// The node's GPUs' utilisation summed, percent (175 = one and three quarter GPUs).
    pub(crate) fn percent_total(&self) -> u32 {
        self.utilization.values().map(|p| (*p).min(100)).sum()
    }
}

/// How recent a GPU sample must be to count as what the GPU does now (agents sample every
/// 2 s; an attempt that ended has its samples dropped at once).
pub(crate) const GPU_SAMPLE_FRESH: Duration = Duration::from_secs(30);

/// The latest sample of one rank, in the server's clock.
#[derive(Debug, Clone)]
struct RankState {
    node: NodeId,
    received: Instant,
    at: Timestamp,
    sample: UsageSample,
    last_output_at: Option<Timestamp>,
    /// The last sign of life: start, output, or CPU or GPU use.
    alive_at: Timestamp,
    /// The last time one of its GPUs was used at or above the book's threshold (its start
    /// when never); `None` for a rank with no GPU.
    gpu_busy_at: Option<Timestamp>,
    /// The highest use seen of this rank in this attempt, and what the store has.
    peak: UsagePeak,
    kept: Option<UsagePeak>,
}

/// The first rank of an attempt that failed.
#[derive(Debug, Clone)]
struct Failure {
    node_rank: u32,
    node: String,
    at: Timestamp,
    what: String,
}

#[derive(Debug, Default)]
struct Book {
    ranks: BTreeMap<(TaskId, AttemptNo, u32), RankState>,
    failures: BTreeMap<(TaskId, AttemptNo), Failure>,
    nodes: BTreeMap<NodeId, (String, Vec<GpuDevice>)>,
    pruned: Option<Instant>,
    /// Warnings of idle GPUs, per attempt: when, and what they say.
    idle_warnings: BTreeMap<(TaskId, AttemptNo), (Timestamp, String)>,
    /// Plotted samples per (task, attempt, rank), with when each was last fed.
    series: BTreeMap<(TaskId, AttemptNo, u32), (RankSeries, Instant)>,
}

/// The most one usage sample accounts for: agents sample every 2 s, and a longer gap (an
/// agent away) is not counted as GPU use or allocation.
const MAX_SAMPLE_PERIOD_MS: u64 = 10_000;

/// GPU time one sample accounts for, in milliseconds of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GpuTime {
    pub allocated_ms: u64,
    pub busy_ms: u64,
}

/// GPU utilisation (percent) at or above which a GPU counts as used, unless the
/// operator's idle-GPU policy says otherwise.
pub(crate) const GPU_BUSY_PERCENT: u32 = 5;

/// The usage the server knows, shared by the report path and the API.
#[derive(Debug)]
pub struct UsageBook {
    book: Mutex<Book>,
    /// GPU utilisation at or above which a rank's GPUs count as used.
    gpu_busy_percent: u32,
}

impl Default for UsageBook {
    fn default() -> Self {
        UsageBook::new(GPU_BUSY_PERCENT)
    }
}

impl UsageBook {
    pub(crate) fn new(gpu_busy_percent: u32) -> UsageBook {
        UsageBook {
            book: Mutex::default(),
            gpu_busy_percent,
        }
    }

    /// Per sampled rank of `attempt` that has GPUs: the last time one was used at or above
    /// the threshold (see `rules::idle_gpus`).
    pub(crate) fn gpu_busy_ranks(&self, attempt: AttemptRef) -> BTreeMap<u32, Timestamp> {
        let book = self.book.lock().unwrap();
        book.ranks
            .range((attempt.task, attempt.attempt, 0)..=(attempt.task, attempt.attempt, u32::MAX))
            .filter_map(|((_, _, rank), state)| state.gpu_busy_at.map(|at| (*rank, at)))
            .collect()
    }

    /// The GPU time each sampled rank of `task`'s attempts used so far (in memory).
    pub(crate) fn gpu_busy_live(&self, task: TaskId) -> BTreeMap<(AttemptNo, u32), u64> {
        let book = self.book.lock().unwrap();
        book.ranks
            .range((task, AttemptNo(0), 0)..=(task, AttemptNo(u32::MAX), u32::MAX))
            .map(|((_, attempt, rank), state)| ((*attempt, *rank), state.peak.gpu_busy_ms))
            .collect()
    }

    /// Show (or, with `None`, stop showing) a warning about `attempt`'s idle GPUs.
    pub(crate) fn set_idle_warning(
        &self,
        attempt: AttemptRef,
        warning: Option<(Timestamp, String)>,
    ) {
        let mut book = self.book.lock().unwrap();
        let key = (attempt.task, attempt.attempt);
        match warning {
            Some(warning) => book.idle_warnings.insert(key, warning),
            None => book.idle_warnings.remove(&key),
        };
    }

    /// A node (re)registered with these GPUs.
    pub(crate) fn register_node(&self, node: NodeId, name: String, gpus: Vec<GpuDevice>) {
        self.book.lock().unwrap().nodes.insert(node, (name, gpus));
    }

    /// The GPUs `node` registered.
    pub(crate) fn node_gpus(&self, node: NodeId) -> Vec<GpuDevice> {
        let book = self.book.lock().unwrap();
        book.nodes
            .get(&node)
            .map(|(_, gpus)| gpus.clone())
            .unwrap_or_default()
    }

    fn node_name(book: &Book, node: NodeId) -> String {
        book.nodes
            .get(&node)
            .map_or_else(|| format!("node-{node}"), |(name, _)| name.clone())
    }

    /// Take a sample of rank `node_rank` on `node`, received at `now`; the peak to keep
    /// durably, when it rose enough to be worth a write, and the GPU time the sample's
    /// period accounts for.
    fn record(
        &self,
        node: NodeId,
        sample: UsageSample,
        now: Timestamp,
        received: Instant,
    ) -> (Option<UsagePeak>, GpuTime) {
        let mut book = self.book.lock().unwrap();
        if book
            .pruned
            .is_none_or(|at| received.duration_since(at) > Duration::from_secs(60))
        {
            book.ranks
                .retain(|_, rank| received.duration_since(rank.received) < STALE_AFTER);
            book.pruned = Some(received);
        }
        let name = Self::node_name(&book, node);
        let key = (
            sample.attempt.task,
            sample.attempt.attempt,
            sample.node_rank,
        );
        // The agent's times, moved to the server's clock by their distance from `at`.
        let to_server =
            |t: Timestamp| Timestamp(now.0.saturating_sub(sample.at.0.saturating_sub(t.0)));
        let last_output_at = sample.last_output_at.map(to_server);
        let busy = sample
            .cpu_millis_used
            .is_some_and(|m| m >= CPU_ACTIVE_MILLIS)
            || sample.gpus.iter().any(|g| g.utilization_percent > 0);
        let previous = book.ranks.get(&key);
        let mut alive_at = to_server(sample.started_at);
        for seen in [
            last_output_at,
            busy.then_some(now),
            previous.map(|p| p.alive_at),
        ]
        .into_iter()
        .flatten()
        {
            alive_at = alive_at.max(seen);
        }
        let gpu_busy_at = (!sample.gpus.is_empty()).then(|| {
            let used = sample
                .gpus
                .iter()
                .any(|g| g.utilization_percent >= self.gpu_busy_percent);
            let mut at = to_server(sample.started_at);
            for seen in [used.then_some(now), previous.and_then(|p| p.gpu_busy_at)]
                .into_iter()
                .flatten()
            {
                at = at.max(seen);
            }
            at
        });
        // The period this sample accounts for: since the rank's previous sample (or its
        // start), never more than a few sample periods (a gap is not counted as use).
        let since = previous.map_or_else(|| to_server(sample.started_at), |p| p.at);
        let period_ms = now.millis_since(since).min(MAX_SAMPLE_PERIOD_MS);
        let gpu_time = GpuTime {
            allocated_ms: sample.gpus.len() as u64 * period_ms,
            busy_ms: sample
                .gpus
                .iter()
                .map(|g| u64::from(g.utilization_percent.min(100)) * period_ms / 100)
                .sum(),
        };
        let observed = UsagePeak {
            task: sample.attempt.task,
            attempt: sample.attempt.attempt,
            node_rank: sample.node_rank,
            node: name,
            cpu_millis: sample.cpu_millis_used.unwrap_or(0),
            memory_bytes: sample
                .memory_peak_bytes
                .or(sample.memory_bytes)
                .unwrap_or(0),
            gpu_utilization_percent: sample
                .gpus
                .iter()
                .map(|g| g.utilization_percent)
                .max()
                .unwrap_or(0),
            gpu_memory_bytes: sample.gpus.iter().map(|g| g.memory_used_bytes).sum(),
            at: now,
            gpu_busy_ms: previous.map_or(0, |p| p.peak.gpu_busy_ms) + gpu_time.busy_ms,
        };
        let peak = match previous {
            Some(previous) => merge_rising(&previous.peak, &observed),
            None => observed,
        };
        let kept = previous.and_then(|p| p.kept.clone());
        let write = worth_keeping(kept.as_ref(), &peak).then(|| peak.clone());
        Self::extend_series(&mut book, key, &peak.node, &sample, now, received);
        book.ranks.insert(
            key,
            RankState {
                node,
                received,
                at: now,
                sample,
                last_output_at,
                alive_at,
                gpu_busy_at,
                peak,
                kept: write.clone().or(kept),
            },
        );
        (write, gpu_time)
    }

    fn extend_series(
        book: &mut Book,
        key: (TaskId, AttemptNo, u32),
        node: &str,
        sample: &UsageSample,
        now: Timestamp,
        received: Instant,
    ) {
        if !book.series.contains_key(&key) && book.series.len() >= SERIES_KEPT {
            let oldest = book
                .series
                .iter()
                .min_by_key(|(_, (_, fed))| *fed)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                book.series.remove(&oldest);
            }
        }
        let (series, fed) = book.series.entry(key).or_insert_with(|| {
            (
                RankSeries {
                    node_rank: key.2,
                    node: node.to_string(),
                    points: VecDeque::new(),
                },
                received,
            )
        });
        if series.points.len() >= SERIES_POINTS {
            series.points.pop_front();
        }
        series.points.push_back(SeriesPoint::of(sample, now));
        *fed = received;
    }

    /// The last sign of life of each sampled rank of `attempt` (see `rules::hangs`).
    pub(crate) fn alive_ranks(&self, attempt: AttemptRef) -> BTreeMap<u32, Timestamp> {
        let book = self.book.lock().unwrap();
        book.ranks
            .range((attempt.task, attempt.attempt, 0)..=(attempt.task, attempt.attempt, u32::MAX))
            .map(|((_, _, rank), state)| (*rank, state.alive_at))
            .collect()
    }

    /// The kept samples of each rank of `attempt`, rank by rank.
    pub(crate) fn series(&self, task: TaskId, attempt: AttemptNo) -> Vec<RankSeries> {
        let book = self.book.lock().unwrap();
        book.series
            .range((task, attempt, 0)..=(task, attempt, u32::MAX))
            .map(|(_, (series, _))| series.clone())
            .collect()
    }

    /// What each node's GPUs do now, from the latest sample of every running rank
    /// received within `fresh` (an older one no longer says what the GPU does).
    pub(crate) fn gpu_use_by_node(&self, fresh: Duration) -> BTreeMap<NodeId, NodeGpuUse> {
        let book = self.book.lock().unwrap();
        let mut nodes: BTreeMap<NodeId, NodeGpuUse> = BTreeMap::new();
        for rank in book.ranks.values().filter(|r| r.received.elapsed() < fresh) {
            let entry = nodes.entry(rank.node).or_default();
            for gpu in &rank.sample.gpus {
                entry.utilization.insert(gpu.index, gpu.utilization_percent);
                entry.memory_used_bytes += gpu.memory_used_bytes;
            }
        }
        nodes
    }

    /// The attempt ended: its peaks not yet kept (to write now), and its samples dropped.
    fn end_attempt(&self, attempt: AttemptRef) -> Vec<UsagePeak> {
        let mut book = self.book.lock().unwrap();
        let keys: Vec<_> = book
            .ranks
            .range((attempt.task, attempt.attempt, 0)..=(attempt.task, attempt.attempt, u32::MAX))
            .map(|(key, _)| *key)
            .collect();
        keys.into_iter()
            .filter_map(|key| book.ranks.remove(&key))
            .filter(|rank| rank.kept.as_ref() != Some(&rank.peak))
            .map(|rank| rank.peak)
            .collect()
    }

    /// Rank `node_rank` on `node` failed first in its attempt (later ones are ignored).
    fn note_failure(
        &self,
        attempt: AttemptRef,
        node_rank: u32,
        node: NodeId,
        at: Timestamp,
        what: String,
    ) {
        let mut book = self.book.lock().unwrap();
        let name = Self::node_name(&book, node);
        book.failures
            .entry((attempt.task, attempt.attempt))
            .or_insert(Failure {
                node_rank,
                node: name,
                at,
                what,
            });
        while book.failures.len() > FAILURES_KEPT {
            let oldest = book
                .failures
                .iter()
                .min_by_key(|(_, f)| f.at)
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => book.failures.remove(&key),
                None => break,
            };
        }
    }

    /// The latest samples of `attempt`'s ranks, its in-memory peaks, and the flags of
    /// the task, as of `now`.
    fn view(
        &self,
        task: TaskId,
        attempt: AttemptNo,
        state: TaskState,
        now: Timestamp,
        silent_after: Duration,
        names: &BTreeMap<NodeId, String>,
    ) -> (Vec<RankUsage>, Vec<UsagePeak>, Vec<UsageFlag>) {
        let book = self.book.lock().unwrap();
        let name_of = |node: NodeId| {
            names
                .get(&node)
                .cloned()
                .unwrap_or_else(|| Self::node_name(&book, node))
        };
        let mut ranks = Vec::new();
        let mut peaks = Vec::new();
        let mut flags = Vec::new();
        for ((_, _, node_rank), rank) in book
            .ranks
            .range((task, attempt, 0)..=(task, attempt, u32::MAX))
        {
            peaks.push(rank.peak.clone());
            if !state.is_active() {
                continue;
            }
            let quiet = Duration::from_millis(now.millis_since(rank.alive_at));
            let node = name_of(rank.node);
            if state == TaskState::Running && quiet >= silent_after {
                flags.push(silent_flag(
                    attempt,
                    *node_rank,
                    &node,
                    rank.alive_at,
                    quiet,
                ));
            }
            ranks.push(RankUsage {
                node_rank: *node_rank,
                node,
                at: rank.at,
                cpu_millis_used: rank.sample.cpu_millis_used,
                cpu_throttled_ms: rank.sample.cpu_throttled_ms,
                memory_bytes: rank.sample.memory_bytes,
                memory_peak_bytes: rank.sample.memory_peak_bytes,
                gpus: rank.sample.gpus.clone(),
                last_output_at: rank.last_output_at,
                quiet_secs: quiet.as_secs(),
            });
        }
        if let Some((since, message)) = book.idle_warnings.get(&(task, attempt))
            && state.is_active()
        {
            flags.push(UsageFlag {
                kind: "idle_gpu".into(),
                attempt,
                node_rank: 0,
                node: String::new(),
                since: *since,
                message: message.clone(),
            });
        }
        for ((_, failed_attempt), failure) in book
            .failures
            .range((task, AttemptNo(0))..=(task, AttemptNo(u32::MAX)))
        {
            flags.insert(
                0,
                UsageFlag {
                    kind: "failed".into(),
                    attempt: *failed_attempt,
                    node_rank: failure.node_rank,
                    node: failure.node.clone(),
                    since: failure.at,
                    message: format!(
                        "rank {} on {} failed first in attempt {}: {}",
                        failure.node_rank, failure.node, failed_attempt, failure.what
                    ),
                },
            );
        }
        (ranks, peaks, flags)
    }
}

/// The maxima of `kept` and `seen`; `at` says when a measure last rose, not when the
/// rank was last seen.
fn merge_rising(kept: &UsagePeak, seen: &UsagePeak) -> UsagePeak {
    let merged = kept.merge(seen);
    let rose = merged.cpu_millis > kept.cpu_millis
        || merged.memory_bytes > kept.memory_bytes
        || merged.gpu_utilization_percent > kept.gpu_utilization_percent
        || merged.gpu_memory_bytes > kept.gpu_memory_bytes;
    UsagePeak {
        at: if rose { seen.at } else { kept.at },
        ..merged
    }
}

/// Whether `peak` rose far enough above what the store has (5 %) to be written now;
/// the exact peak is written when the attempt ends.
fn worth_keeping(kept: Option<&UsagePeak>, peak: &UsagePeak) -> bool {
    let Some(kept) = kept else {
        return true;
    };
    let rose = |old: u64, new: u64| new > old && (new - old) * 20 > old;
    rose(kept.cpu_millis, peak.cpu_millis)
        || rose(kept.memory_bytes, peak.memory_bytes)
        || rose(
            u64::from(kept.gpu_utilization_percent),
            u64::from(peak.gpu_utilization_percent),
        )
        || rose(kept.gpu_memory_bytes, peak.gpu_memory_bytes)
        // GPU time grows with every sample: kept every 10 GPU-minutes (and at the end).
        || peak.gpu_busy_ms >= kept.gpu_busy_ms + 600_000
}

fn silent_flag(
    attempt: AttemptNo,
    node_rank: u32,
    node: &str,
    since: Timestamp,
    quiet: Duration,
) -> UsageFlag {
    UsageFlag {
        kind: "silent".into(),
        attempt,
        node_rank,
        node: node.to_string(),
        since,
        message: format!(
            "rank {node_rank} on {node} silent for {}",
            human_duration(quiet)
        ),
    }
}

/// `45s`, `5 min`, `2h5m`: how long, for a person.
pub(crate) fn human_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 if secs % 60 == 0 => format!("{} min", secs / 60),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// How a failed rank ended, for its flag; `None` when it did not fail.
pub(crate) fn failure_of(outcome: &AttemptOutcome) -> Option<String> {
    match outcome {
        AttemptOutcome::Exited { code: 0 } | AttemptOutcome::Cancelled => None,
        AttemptOutcome::Exited { code } => Some(format!("exit code {code}")),
        AttemptOutcome::Signalled { signal } => Some(format!("killed by signal {signal}")),
        AttemptOutcome::TimeLimit => Some("time limit reached".into()),
        AttemptOutcome::LaunchFailed { reason, message } => Some(format!("{reason}: {message}")),
    }
}

fn peak_view(peak: &UsagePeak) -> UsagePeakView {
    UsagePeakView {
        attempt: peak.attempt,
        node_rank: peak.node_rank,
        node: peak.node.clone(),
        cpu_millis: peak.cpu_millis,
        memory_bytes: peak.memory_bytes,
        gpu_utilization_percent: peak.gpu_utilization_percent,
        gpu_memory_bytes: peak.gpu_memory_bytes,
        at: peak.at,
    }
}

impl UsageBook {
    /// An agent's usage sample: taken only for an attempt of the node's own that is
    /// still starting or running, for the rank the node holds in it. `false`: refused.
    /// `record` is the sample's task as the control plane has it; the peak worth keeping
    /// goes to `store`, the GPU time to `metrics`.
    pub(crate) async fn accept(
        &self,
        store: &dyn Store,
        metrics: &Metrics,
        clock: &dyn Clock,
        record: Option<&TaskRecord>,
        node: NodeId,
        sample: UsageSample,
    ) -> Result<bool, ServerError> {
        let Some(record) = record else {
            return Ok(false);
        };
        let holds_rank = record
            .placements
            .get(sample.node_rank as usize)
            .is_some_and(|p| p.node == node);
        if record.attempt != sample.attempt.attempt || !record.state.is_active() || !holds_rank {
            return Ok(false);
        }
        let (peak, gpu_time) = self.record(node, sample, clock.now(), clock.instant());
        if gpu_time.allocated_ms > 0 {
            metrics.gpu_time(
                &record.user,
                Duration::from_millis(gpu_time.allocated_ms),
                Duration::from_millis(gpu_time.busy_ms),
            );
        }
        if let Some(peak) = peak {
            store.record_usage_peak(peak).await?;
        }
        Ok(true)
    }

    /// A node reported the end of its rank of `attempt` (an accepted report): the first
    /// failure is flagged, and the attempt's peaks are kept exactly (in `store`).
    /// `record` is the attempt's task as the control plane has it.
    pub(crate) async fn end_rank(
        &self,
        store: &dyn Store,
        record: Option<&TaskRecord>,
        node: NodeId,
        attempt: AttemptRef,
        outcome: &AttemptOutcome,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        if let Some(what) = failure_of(outcome) {
            let rank = record.and_then(|r| r.placements.iter().position(|p| p.node == node));
            if let Some(rank) = rank {
                self.note_failure(attempt, rank as u32, node, at, what);
            }
        }
        for peak in self.end_attempt(attempt) {
            store.record_usage_peak(peak).await?;
        }
        Ok(())
    }
}

/// What tasks use, as `GET /v1/tasks/{id}/usage` and the dashboard show it: the usage
/// book's samples, flags and peaks beside the peaks and rank ends the store kept.
#[derive(Debug, Clone)]
pub(crate) struct UsageService {
    book: Arc<UsageBook>,
    store: Arc<dyn Store>,
    /// A running rank quiet this long is flagged silent.
    silent_after: Duration,
}

impl UsageService {
    /// The usage of `control`'s book, store and configuration.
    pub(crate) fn of(control: &Control) -> UsageService {
        UsageService {
            book: control.usage.clone(),
            store: control.store.clone(),
            silent_after: control.config.silent_after,
        }
    }

    /// The "failed first" flags of a multi-node task's attempts that memory no longer
    /// holds (a restart, or attempts long over), from the rank ends the store kept.
    async fn with_kept_failures(
        &self,
        record: &tacc_store::TaskRecord,
        mut flags: Vec<UsageFlag>,
        names: &BTreeMap<NodeId, String>,
    ) -> Result<Vec<UsageFlag>, ServerError> {
        let multi_node = serde_json::from_value::<TaskSpec>(record.spec.clone())
            .is_ok_and(|spec| spec.resources.nodes > 1);
        if !multi_node {
            return Ok(flags);
        }
        let first = record.attempt.0.saturating_sub(FLAGGED_ATTEMPTS - 1).max(1);
        for attempt in (first..=record.attempt.0).rev().map(AttemptNo) {
            if flags
                .iter()
                .any(|f| f.kind == "failed" && f.attempt == attempt)
            {
                continue;
            }
            let ends = self.store.rank_ends(record.id, attempt).await?;
            let Some(failed) = ends
                .iter()
                .filter(|end| end.failure.is_some())
                .min_by_key(|end| (end.at, end.rank))
            else {
                continue;
            };
            let node = names
                .get(&failed.node)
                .cloned()
                .unwrap_or_else(|| failed.node.to_string());
            let what = failed.failure.clone().unwrap_or_default();
            flags.insert(
                0,
                UsageFlag {
                    kind: "failed".into(),
                    attempt,
                    node_rank: failed.rank,
                    message: format!(
                        "rank {} on {node} failed first in attempt {attempt}: {what}",
                        failed.rank
                    ),
                    node,
                    since: failed.at,
                },
            );
        }
        Ok(flags)
    }

    /// `GET /v1/tasks/{id}/usage`. `control` says what the control plane knows now: the
    /// allocation in force, the nodes' names, the ranks already finished.
    pub(crate) async fn task_usage(
        &self,
        control: &Control,
        task: TaskId,
    ) -> Result<TaskUsage, ServerError> {
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
        let adaptive = control
            .facts
            .adaptive_view(task, &control.adaptive)
            .await
            .ok();
        // What each rank holds now: after a resize that is the new allocation, not what
        // the task file asked for.
        let allocated = match &adaptive {
            Some(adaptive) => adaptive.allocation,
            None => serde_json::from_value::<TaskSpec>(record.spec.clone())
                .map(|spec| spec.resources.per_node())
                .unwrap_or(tacc_core::Resources::ZERO),
        };
        let names = control.node_names().await;
        let silent_after = self.silent_after;
        let (ranks, live_peaks, flags) = self.book.view(
            task,
            record.attempt,
            record.state,
            crate::now(),
            silent_after,
            &names,
        );
        let flags = self.with_kept_failures(&record, flags, &names).await?;
        let finished_ranks = if record.state.is_active() {
            control
                .facts
                .finished_ranks_of(&record)
                .await?
                .into_keys()
                .collect()
        } else {
            Vec::new()
        };
        let mut peaks: BTreeMap<(AttemptNo, u32), UsagePeak> = self
            .store
            .list_usage_peaks(task)
            .await?
            .into_iter()
            .map(|p| ((p.attempt, p.node_rank), p))
            .collect();
        for live in live_peaks {
            let key = (live.attempt, live.node_rank);
            let merged = match peaks.get(&key) {
                Some(kept) => kept.merge(&live),
                None => live,
            };
            peaks.insert(key, merged);
        }
        Ok(TaskUsage {
            task_id: record.id,
            name: record.name,
            state: record.state,
            attempt: record.attempt,
            allocated,
            ranks,
            peaks: peaks.values().map(peak_view).collect(),
            flags,
            silent_after_secs: silent_after.as_secs(),
            adaptive,
            finished_ranks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    fn sample(at: u64, started: u64, output: Option<u64>, cpu: Option<u64>) -> UsageSample {
        UsageSample {
            attempt: attempt(7),
            node_rank: 2,
            at: Timestamp(at),
            started_at: Timestamp(started),
            last_output_at: output.map(Timestamp),
            cpu_millis_used: cpu,
            cpu_throttled_ms: None,
            memory_bytes: Some(100),
            memory_peak_bytes: Some(150),
            gpus: Vec::new(),
            cpu_quota_millis: None,
            cpu_throttled_fraction: None,
            memory_limit_bytes: None,
            memory_pressure_percent: None,
            memory_failcnt: None,
            io_wait_percent: None,
        }
    }

    fn book() -> UsageBook {
        let book = UsageBook::default();
        book.register_node(NodeId(3), "n3".into(), Vec::new());
        book
    }

    fn flags_at(book: &UsageBook, now: u64, after: Duration) -> Vec<UsageFlag> {
        let names = BTreeMap::new();
        book.view(
            TaskId(7),
            AttemptNo(1),
            TaskState::Running,
            Timestamp(now),
            after,
            &names,
        )
        .2
    }

    #[test]
    fn a_rank_without_output_or_cpu_past_the_threshold_is_silent() {
        let book = book();
        let start = 1_000_000;
        // Output at start + 10 s, then nothing, and no CPU.
        book.record(
            NodeId(3),
            sample(start + 20_000, start, Some(start + 10_000), Some(0)),
            Timestamp(start + 20_000),
            Instant::now(),
        );
        let minutes = Duration::from_secs(300);
        assert!(flags_at(&book, start + 10_000 + 299_000, minutes).is_empty());
        let flags = flags_at(&book, start + 10_000 + 300_000, minutes);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].kind, "silent");
        assert_eq!(flags[0].message, "rank 2 on n3 silent for 5 min");
        assert_eq!(flags[0].since, Timestamp(start + 10_000));
        // A task that is not running is not flagged silent.
        let names = BTreeMap::new();
        let (_, _, flags) = book.view(
            TaskId(7),
            AttemptNo(1),
            TaskState::Starting,
            Timestamp(start + 1_000_000),
            minutes,
            &names,
        );
        assert!(flags.is_empty());
    }

    #[test]
    fn cpu_use_keeps_a_rank_that_prints_nothing_alive() {
        let book = book();
        let start = 1_000_000;
        for at in [start + 2_000, start + 4_000, start + 6_000] {
            book.record(
                NodeId(3),
                sample(at, start, None, Some(900)),
                Timestamp(at),
                Instant::now(),
            );
        }
        let after = Duration::from_secs(3);
        assert!(flags_at(&book, start + 8_000, after).is_empty());
        // CPU use stopped: silent once the threshold has passed since the last use.
        book.record(
            NodeId(3),
            sample(start + 8_000, start, None, Some(10)),
            Timestamp(start + 8_000),
            Instant::now(),
        );
        assert!(flags_at(&book, start + 8_999, after).is_empty());
        assert_eq!(flags_at(&book, start + 9_000, after).len(), 1);
    }

    #[test]
    fn an_agent_s_skewed_clock_does_not_count() {
        let book = book();
        // The agent's clock is an hour behind: its times only count relative to `at`.
        let skew = 3_600_000;
        let now = 10_000_000;
        book.record(
            NodeId(3),
            sample(
                now - skew,
                now - skew - 5_000,
                Some(now - skew - 1_000),
                Some(0),
            ),
            Timestamp(now),
            Instant::now(),
        );
        let (ranks, _, flags) = book.view(
            TaskId(7),
            AttemptNo(1),
            TaskState::Running,
            Timestamp(now + 1_000),
            Duration::from_secs(60),
            &BTreeMap::new(),
        );
        assert!(flags.is_empty());
        assert_eq!(ranks[0].last_output_at, Some(Timestamp(now - 1_000)));
        assert_eq!(ranks[0].quiet_secs, 2);
    }

    #[test]
    fn the_first_failed_rank_is_flagged_and_later_ones_ignored() {
        let book = book();
        book.register_node(NodeId(4), "n4".into(), Vec::new());
        let what = |o| failure_of(&o).unwrap();
        book.note_failure(
            attempt(7),
            1,
            NodeId(4),
            Timestamp(5),
            what(AttemptOutcome::Exited { code: 3 }),
        );
        book.note_failure(
            attempt(7),
            0,
            NodeId(3),
            Timestamp(6),
            what(AttemptOutcome::Signalled { signal: 9 }),
        );
        let flags = flags_at(&book, 10, Duration::from_secs(60));
        assert_eq!(flags.len(), 1);
        assert_eq!(flags[0].kind, "failed");
        assert_eq!(
            flags[0].message,
            "rank 1 on n4 failed first in attempt 1: exit code 3"
        );
        assert_eq!(failure_of(&AttemptOutcome::Exited { code: 0 }), None);
        assert_eq!(failure_of(&AttemptOutcome::Cancelled), None);
    }

    #[test]
    fn peaks_are_written_when_they_rise_enough_and_exactly_at_the_end() {
        let book = book();
        let record = |cpu: u64, memory: u64, at: u64| {
            let mut s = sample(at, 0, None, Some(cpu));
            s.memory_peak_bytes = Some(memory);
            book.record(NodeId(3), s, Timestamp(at), Instant::now()).0
        };
        let first = record(500, 1000, 1).expect("the first peak is kept");
        assert_eq!((first.cpu_millis, first.memory_bytes), (500, 1000));
        // 2 % more memory: not worth a write yet.
        assert!(record(400, 1020, 2).is_none());
        // 10 % more CPU: written, with both maxima.
        let written = record(550, 1000, 3).unwrap();
        assert_eq!((written.cpu_millis, written.memory_bytes), (550, 1020));
        assert!(record(100, 1030, 4).is_none());
        let last = book.end_attempt(attempt(7));
        assert_eq!(last.len(), 1);
        assert_eq!((last[0].cpu_millis, last[0].memory_bytes), (550, 1030));
        assert_eq!(last[0].at, Timestamp(4));
        assert!(book.end_attempt(attempt(7)).is_empty());
    }

    #[test]
    fn gpu_use_is_summed_per_node_from_fresh_samples_until_the_attempt_ends() {
        let book = book();
        let gpu = |index, percent| tacc_proto::GpuSample {
            index,
            utilization_percent: percent,
            memory_used_bytes: 0,
            memory_total_bytes: 0,
        };
        let received = Instant::now();
        let mut rank = sample(1_000, 0, None, None);
        rank.gpus = vec![gpu(0, 100), gpu(1, 50)];
        book.record(NodeId(3), rank, Timestamp(1_000), received);
        let mut other = sample(1_000, 0, None, None);
        other.node_rank = 0;
        other.gpus = vec![gpu(2, 25)];
        book.record(NodeId(3), other, Timestamp(1_000), received);
        let fresh = Duration::from_secs(30);
        let totals: BTreeMap<NodeId, u32> = book
            .gpu_use_by_node(fresh)
            .into_iter()
            .map(|(node, gpus)| (node, gpus.percent_total()))
            .collect();
        assert_eq!(totals, BTreeMap::from([(NodeId(3), 175)]));
        // Too old to count as current use.
        assert!(book.gpu_use_by_node(Duration::ZERO).is_empty());
        book.end_attempt(attempt(7));
        assert!(book.gpu_use_by_node(fresh).is_empty());
    }

    #[test]
    fn each_rank_keeps_a_bounded_series_that_outlives_its_attempt() {
        let book = book();
        let start = 1_000_000;
        for i in 0..(SERIES_POINTS as u64 + 5) {
            let at = start + i * 2_000;
            let mut s = sample(at, start, None, Some(1_500));
            s.gpus = vec![
                tacc_proto::GpuSample {
                    index: 0,
                    utilization_percent: 40,
                    memory_used_bytes: 10,
                    memory_total_bytes: 100,
                },
                tacc_proto::GpuSample {
                    index: 1,
                    utilization_percent: 60,
                    memory_used_bytes: 5,
                    memory_total_bytes: 100,
                },
            ];
            book.record(NodeId(3), s, Timestamp(at), Instant::now());
        }
        let series = book.series(TaskId(7), AttemptNo(1));
        assert_eq!(series.len(), 1);
        let points = &series[0].points;
        assert_eq!(points.len(), SERIES_POINTS, "the oldest samples go first");
        assert_eq!(points[0].at, Timestamp(start + 5 * 2_000));
        let last = points.back().unwrap();
        assert_eq!(last.cpus, Some(1.5));
        assert_eq!(last.gpu_percent, Some(50.0));
        assert_eq!(last.gpu_memory_bytes, Some(15));
        assert_eq!(series[0].node, "n3");
        let gpus = book.gpu_use_by_node(GPU_SAMPLE_FRESH);
        assert_eq!(gpus[&NodeId(3)].utilization.get(&1), Some(&60));
        book.end_attempt(attempt(7));
        assert_eq!(
            book.series(TaskId(7), AttemptNo(1)).len(),
            1,
            "kept for the plots"
        );
        assert!(
            book.gpu_use_by_node(GPU_SAMPLE_FRESH).is_empty(),
            "nothing runs any more"
        );
    }

    #[test]
    fn the_series_sampled_longest_ago_goes_first_past_the_bound() {
        let book = book();
        let base = Instant::now();
        for task in 0..(SERIES_KEPT as u64 + 1) {
            let mut s = sample(1, 0, None, Some(1));
            s.attempt = AttemptRef {
                task: TaskId(task),
                attempt: AttemptNo(1),
            };
            book.record(
                NodeId(3),
                s,
                Timestamp(1),
                base + Duration::from_millis(task),
            );
        }
        assert!(book.series(TaskId(0), AttemptNo(1)).is_empty());
        assert_eq!(book.series(TaskId(1), AttemptNo(1)).len(), 1);
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(Duration::from_secs(3)), "3s");
        assert_eq!(human_duration(Duration::from_secs(300)), "5 min");
        assert_eq!(human_duration(Duration::from_secs(312)), "5m12s");
        assert_eq!(human_duration(Duration::from_secs(7_500)), "2h5m");
    }

    #[test]
    fn gpu_time_adds_up_each_sample_period_s_utilisation() {
        let book = book();
        let gpus = |percents: &[u32]| {
            percents
                .iter()
                .enumerate()
                .map(|(i, p)| tacc_proto::GpuSample {
                    index: i as u32,
                    utilization_percent: *p,
                    memory_used_bytes: 0,
                    memory_total_bytes: 0,
                })
                .collect::<Vec<_>>()
        };
        let mut total = GpuTime::default();
        // Started at 0; samples at 2 s, 4 s and 30 s (a gap: counted as 10 s at most).
        for (at, percents) in [(2_000, [100, 50]), (4_000, [0, 0]), (30_000, [100, 100])] {
            let mut s = sample(at, 0, None, Some(100));
            s.gpus = gpus(&percents);
            let (_, time) = book.record(NodeId(3), s, Timestamp(at), Instant::now());
            total.allocated_ms += time.allocated_ms;
            total.busy_ms += time.busy_ms;
        }
        assert_eq!(total.allocated_ms, 2 * (2_000 + 2_000 + 10_000));
        assert_eq!(total.busy_ms, 2_000 + 1_000 + 20_000);
        let live = book.gpu_busy_live(TaskId(7));
        assert_eq!(live.values().copied().collect::<Vec<_>>(), [23_000]);
    }
}
