//! The arithmetic of usage accounting: when each attempt of a task held its resources
//! (from its task events), and what that costs in CPU-, GPU- and memory-GiB-hours inside
//! a window, per user or group and per time bucket. Pure: events and times in, numbers
//! out.
//!
//! An attempt holds its task's per-node resources on each of its nodes from the moment
//! it was placed (`starting`) until the first later event that leaves `starting` and
//! `running` or belongs to another attempt (an end, or a retry or preemption sending the
//! task back to the queue); an attempt still holding them counts up to the report's time.
//! What was allocated is the accounting basis, as in Slurm, not what was measured.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{AttemptNo, Resources, TaskId, Timestamp};
use tacc_proto::{UsageBy, UsagePoint, UsageReport, UsageRow, UsageSeries};
use tacc_store::TaskEvent;

const MILLIS_PER_HOUR: f64 = 3_600_000.0;
const GIB: f64 = (1u64 << 30) as f64;

/// The time one attempt held its resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub attempt: AttemptNo,
    pub start: Timestamp,
    pub end: Timestamp,
    /// Still holding them: `end` is the time of the report.
    pub running: bool,
}

/// The spans of every attempt in `events` (oldest first), open ones ending at `now`.
pub fn attempt_spans(events: &[TaskEvent], now: Timestamp) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut open: Option<(AttemptNo, Timestamp)> = None;
    for event in events {
        if let Some((attempt, start)) = open {
            if event.attempt == attempt && event.state.is_active() {
                continue;
            }
            spans.push(Span {
                attempt,
                start,
                end: event.at.max(start),
                running: false,
            });
            open = None;
        }
        if event.state.is_active() {
            open = Some((event.attempt, event.at));
        }
    }
    if let Some((attempt, start)) = open {
        spans.push(Span {
            attempt,
            start,
            end: now.max(start),
            running: true,
        });
    }
    spans
}

/// What an attempt of a task holds: `per_node` on each of `nodes` nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub per_node: Resources,
    pub nodes: u32,
    /// A share of one GPU per node in hundredths (`gpus: 0.5` is 50), charged as such;
    /// `per_node.gpus` is 0 then.
    pub gpu_share: Option<u32>,
}

/// Resource-hours.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amount {
    pub cpu_hours: f64,
    pub gpu_hours: f64,
    pub memory_gib_hours: f64,
}

impl Amount {
    /// What `allocation` costs when held for `millis`.
    pub fn of(allocation: &Allocation, millis: u64) -> Amount {
        let hours = millis as f64 / MILLIS_PER_HOUR * f64::from(allocation.nodes);
        let per_node = &allocation.per_node;
        Amount {
            cpu_hours: per_node.cpu_millis as f64 / 1000.0 * hours,
            gpu_hours: allocation
                .gpu_share
                .map_or(f64::from(per_node.gpus), |share| f64::from(share) / 100.0)
                * hours,
            memory_gib_hours: per_node.memory_bytes as f64 / GIB * hours,
        }
    }

    fn add(&mut self, other: &Amount) {
        self.cpu_hours += other.cpu_hours;
        self.gpu_hours += other.gpu_hours;
        self.memory_gib_hours += other.memory_gib_hours;
    }
}

/// The series' bucket for a window: an hour up to two days, a day up to a year, else a
/// week.
pub fn bucket_secs_for(since: Timestamp, until: Timestamp) -> u64 {
    let span_secs = until.millis_since(since) / 1000;
    if span_secs <= 2 * 86_400 {
        3600
    } else if span_secs <= 366 * 86_400 {
        86_400
    } else {
        7 * 86_400
    }
}

#[derive(Debug, Clone, Default)]
struct Tally {
    group: Option<String>,
    tasks: BTreeSet<TaskId>,
    attempts: u64,
    running: u64,
    amount: Amount,
    /// GPU time used, in hours of one GPU fully busy.
    gpu_used_hours: f64,
    buckets: Vec<Amount>,
}

impl Tally {
    fn row(&self, name: &str) -> UsageRow {
        UsageRow {
            name: name.to_string(),
            group: self.group.clone(),
            tasks: self.tasks.len() as u64,
            attempts: self.attempts,
            running: self.running,
            cpu_hours: self.amount.cpu_hours,
            gpu_hours: self.amount.gpu_hours,
            memory_gib_hours: self.amount.memory_gib_hours,
            gpu_used_hours: self.gpu_used_hours,
            gpu_idle_hours: (self.amount.gpu_hours - self.gpu_used_hours).max(0.0),
        }
    }
}

/// Usage in `[since, until)` added up per row (a user or a group) and per bucket.
#[derive(Debug, Clone)]
pub struct Ledger {
    since: Timestamp,
    until: Timestamp,
    /// Start of the first bucket (`since` rounded down to a whole bucket since the epoch,
    /// so days start at midnight UTC).
    first: u64,
    bucket_ms: u64,
    rows: BTreeMap<String, Tally>,
    total: Tally,
}

impl Ledger {
    pub fn new(since: Timestamp, until: Timestamp, bucket_secs: u64) -> Ledger {
        let bucket_ms = bucket_secs.max(1) * 1000;
        let first = since.0 / bucket_ms * bucket_ms;
        let count = (until.0 - first).div_ceil(bucket_ms) as usize;
        Ledger {
            since,
            until,
            first,
            bucket_ms,
            rows: BTreeMap::new(),
            total: Tally {
                buckets: vec![Amount::default(); count],
                ..Tally::default()
            },
        }
    }

    /// Charge one attempt's span of `task` to row `name` (whose group is `group`).
    pub fn charge(
        &mut self,
        name: &str,
        group: Option<&str>,
        task: TaskId,
        allocation: &Allocation,
        span: &Span,
    ) {
        let start = span.start.max(self.since);
        let end = span.end.min(self.until);
        let overlaps = start < end || (span.start == span.end && start == span.start);
        if !overlaps || span.start >= self.until {
            return;
        }
        let count = self.total.buckets.len();
        let row = self.rows.entry(name.to_string()).or_insert_with(|| Tally {
            group: group.map(str::to_string),
            buckets: vec![Amount::default(); count],
            ..Tally::default()
        });
        for tally in [&mut *row, &mut self.total] {
            tally.tasks.insert(task);
            tally.attempts += 1;
            tally.running += u64::from(span.running);
            tally
                .amount
                .add(&Amount::of(allocation, end.millis_since(start)));
        }
        // Split the span at bucket boundaries.
        let mut at = start.0;
        while at < end.0 {
            let index = ((at - self.first) / self.bucket_ms) as usize;
            let bucket_end = (self.first + (index as u64 + 1) * self.bucket_ms).min(end.0);
            let amount = Amount::of(allocation, bucket_end - at);
            row.buckets[index].add(&amount);
            self.total.buckets[index].add(&amount);
            at = bucket_end;
        }
    }

    /// Charge `busy_ms` of GPU time an attempt used over its span to row `name`, the part
    /// that falls in the window (spread evenly over the span: samples are not kept).
    pub fn charge_gpu_use(&mut self, name: &str, span: &Span, busy_ms: u64) {
        let start = span.start.max(self.since);
        let end = span.end.min(self.until);
        let length = span.end.millis_since(span.start);
        if start >= end || length == 0 || busy_ms == 0 {
            return;
        }
        let share = end.millis_since(start) as f64 / length as f64;
        let hours = busy_ms as f64 * share / MILLIS_PER_HOUR;
        if let Some(row) = self.rows.get_mut(name) {
            row.gpu_used_hours += hours;
        }
        self.total.gpu_used_hours += hours;
    }

    /// The report, rows with the most GPU-hours first (then CPU-hours, then name).
    pub fn report(self, by: UsageBy, at: Timestamp) -> UsageReport {
        let mut named: Vec<(&String, &Tally)> = self.rows.iter().collect();
        named.sort_by(|(a_name, a), (b_name, b)| {
            b.amount
                .gpu_hours
                .total_cmp(&a.amount.gpu_hours)
                .then(b.amount.cpu_hours.total_cmp(&a.amount.cpu_hours))
                .then(a_name.cmp(b_name))
        });
        let points = |tally: &Tally| {
            tally
                .buckets
                .iter()
                .enumerate()
                .map(|(i, amount)| UsagePoint {
                    start: Timestamp(self.first + i as u64 * self.bucket_ms),
                    cpu_hours: amount.cpu_hours,
                    gpu_hours: amount.gpu_hours,
                    memory_gib_hours: amount.memory_gib_hours,
                })
                .collect()
        };
        UsageReport {
            since: self.since,
            until: self.until,
            at,
            by,
            rows: named.iter().map(|(name, tally)| tally.row(name)).collect(),
            total: UsageRow {
                group: None,
                ..self.total.row("total")
            },
            bucket_secs: self.bucket_ms / 1000,
            series: named
                .iter()
                .map(|(name, tally)| UsageSeries {
                    name: name.to_string(),
                    points: points(tally),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::TaskState::{self, *};

    const H: u64 = 3_600_000;

    fn events(steps: &[(TaskState, u32, u64)]) -> Vec<TaskEvent> {
        steps
            .iter()
            .map(|(state, attempt, at)| TaskEvent {
                at: Timestamp(*at),
                attempt: AttemptNo(*attempt),
                state: *state,
                reason: None,
            })
            .collect()
    }

    fn alloc(cpus: u64, gib: u64, gpus: u32, nodes: u32) -> Allocation {
        Allocation {
            per_node: Resources::new(cpus * 1000, gib << 30, gpus),
            nodes,
            gpu_share: None,
        }
    }

    fn span(start: u64, end: u64) -> Span {
        Span {
            attempt: AttemptNo(1),
            start: Timestamp(start),
            end: Timestamp(end),
            running: false,
        }
    }

    #[test]
    fn an_attempt_holds_from_starting_to_its_end() {
        let spans = attempt_spans(
            &events(&[
                (Queued, 1, 0),
                (Starting, 1, H),
                (Running, 1, H + 10),
                (Succeeded, 1, 3 * H),
            ]),
            Timestamp(10 * H),
        );
        assert_eq!(spans, vec![span(H, 3 * H)]);
    }

    #[test]
    fn retried_and_preempted_attempts_are_each_counted() {
        let spans = attempt_spans(
            &events(&[
                (Queued, 1, 0),
                (Starting, 1, 10),
                (Running, 1, 20),
                // Preempted: back to the queue as attempt 2.
                (Queued, 2, 100),
                (Starting, 2, 200),
                (Running, 2, 210),
                // Failed, and retried as attempt 3 at once.
                (Failed, 2, 300),
                (Queued, 3, 300),
                (Starting, 3, 400),
                (Lost, 3, 450),
            ]),
            Timestamp(1000),
        );
        let ranges: Vec<(u32, u64, u64)> = spans
            .iter()
            .map(|s| (s.attempt.0, s.start.0, s.end.0))
            .collect();
        assert_eq!(ranges, vec![(1, 10, 100), (2, 200, 300), (3, 400, 450)]);
        assert!(spans.iter().all(|s| !s.running));
    }

    #[test]
    fn a_running_attempt_counts_up_to_now() {
        let spans = attempt_spans(
            &events(&[(Queued, 1, 0), (Starting, 1, 50), (Running, 1, 60)]),
            Timestamp(500),
        );
        assert_eq!(
            spans,
            vec![Span {
                running: true,
                ..span(50, 500)
            }]
        );
        // A task cancelled while queued never held anything.
        assert!(
            attempt_spans(
                &events(&[(Queued, 1, 0), (Cancelled, 1, 9)]),
                Timestamp(500)
            )
            .is_empty()
        );
    }

    #[test]
    fn resources_times_nodes_times_hours() {
        let amount = Amount::of(&alloc(4, 16, 2, 3), 90 * 60_000);
        assert_eq!(amount.cpu_hours, 4.0 * 3.0 * 1.5);
        assert_eq!(amount.gpu_hours, 2.0 * 3.0 * 1.5);
        assert_eq!(amount.memory_gib_hours, 16.0 * 3.0 * 1.5);
    }

    #[test]
    fn spans_are_clipped_at_since_and_until() {
        let mut ledger = Ledger::new(Timestamp(10 * H), Timestamp(20 * H), 3600);
        let one_gpu = alloc(1, 1, 1, 1);
        // Straddles since: only 2 of its 4 hours count.
        ledger.charge("alice", None, TaskId(1), &one_gpu, &span(8 * H, 12 * H));
        // Straddles until: 1 of its 3 hours.
        ledger.charge("alice", None, TaskId(2), &one_gpu, &span(19 * H, 22 * H));
        // Entirely before or after the window: nothing, and no attempt counted.
        ledger.charge("alice", None, TaskId(3), &one_gpu, &span(H, 2 * H));
        ledger.charge("alice", None, TaskId(4), &one_gpu, &span(20 * H, 21 * H));
        // Covers the whole window.
        ledger.charge("bob", None, TaskId(5), &alloc(2, 0, 0, 2), &span(0, 30 * H));
        let report = ledger.report(UsageBy::User, Timestamp(30 * H));
        let alice = report.rows.iter().find(|r| r.name == "alice").unwrap();
        assert_eq!((alice.gpu_hours, alice.tasks, alice.attempts), (3.0, 2, 2));
        let bob = report.rows.iter().find(|r| r.name == "bob").unwrap();
        assert_eq!((bob.cpu_hours, bob.gpu_hours), (2.0 * 2.0 * 10.0, 0.0));
        assert_eq!(report.rows[0].name, "alice", "most GPU-hours first");
        assert_eq!(report.total.attempts, 3);
        assert_eq!(report.total.cpu_hours, 3.0 + 40.0);
        // Hourly buckets over the window: alice's GPU-hours land in hours 10, 11 and 19.
        let series = &report.series[0];
        assert_eq!(series.points.len(), 10);
        let busy: Vec<(u64, f64)> = series
            .points
            .iter()
            .filter(|p| p.gpu_hours > 0.0)
            .map(|p| (p.start.0 / H, p.gpu_hours))
            .collect();
        assert_eq!(busy, vec![(10, 1.0), (11, 1.0), (19, 1.0)]);
    }

    #[test]
    fn a_multi_node_attempt_split_over_days() {
        let day = 24 * H;
        // since at 06:00 of day 1: buckets start at midnight of day 1.
        let mut ledger = Ledger::new(Timestamp(day + 6 * H), Timestamp(4 * day), 86_400);
        let spans = attempt_spans(
            &events(&[
                (Queued, 1, 0),
                (Starting, 1, 2 * day - 2 * H),
                (Running, 1, 2 * day),
                (Running, 1, 2 * day),
            ]),
            Timestamp(2 * day + 4 * H),
        );
        ledger.charge("vision", None, TaskId(9), &alloc(8, 64, 4, 2), &spans[0]);
        let report = ledger.report(UsageBy::Group, Timestamp(2 * day + 4 * H));
        let row = &report.rows[0];
        assert_eq!(row.running, 1);
        assert_eq!(row.gpu_hours, 4.0 * 2.0 * 6.0);
        let points: Vec<(u64, f64)> = report.series[0]
            .points
            .iter()
            .map(|p| (p.start.0 / day, p.gpu_hours))
            .collect();
        assert_eq!(points, vec![(1, 16.0), (2, 32.0), (3, 0.0)]);
    }
}
