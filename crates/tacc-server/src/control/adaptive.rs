//! Adaptive allocation's book in the control plane. Every usage sample of rank 0 of a running
//! attempt feeds that attempt's bounded [`Signals`] window; the classifier judges the
//! window on each sample, and — where the cluster's mode and the task's `adaptive:`
//! bounds allow — the re-allocation policy decides a change from the verdict, the room
//! [`Scheduler::resize_room`](tacc_scheduler::Scheduler::resize_room) gives and the
//! attempt's change history (its hysteresis). A change goes to the scheduler first
//! (`Event::TaskResized`: accounting, quotas and placement move with it; a shrink may
//! start queued tasks, whose plan is carried out like any other), is kept durably with
//! its reason (the store's resize history: a restarted server restores the scheduler
//! with the allocation in force), then rides the nodes' level-triggered desired work
//! (`Assignment::allocation`) to the agents, which apply it live and report back. A
//! change an agent could not apply is undone where it still fits, recorded, and ends
//! adaptation of that attempt: it is never retried forever.
//!
//! A multi-node task is judged by its rank 0 and all its nodes move together.
//!
//! This file keeps the settings and the book (each attempt's signals, verdict, change
//! history and allocation); the decisions are `handlers::resize`, run in the reports'
//! turn by `Control::adapt` and `Control::resized_on_node` (`mod.rs`); what `tcloud
//! why` / `top` / `show` say of it is read by `facts/adaptive.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tacc_adaptive::{
    Bounds, ChangeHistory, Classifier, Reallocator, RuleClassifier, Rules, Sample, Signals,
    StepPolicy, StepPolicyConfig, Verdict,
};
use tacc_core::{AttemptNo, Resources, TaskId, Timestamp};
use tacc_proto::{AttemptRef, SignalPoint, UsageSample};
use tacc_scheduler::Event;
use tacc_schema::TaskSpec;
use tacc_store::SignalRecord;

use super::handlers::resize;

/// Signal points kept per attempt (at the default 10 s: the last 80 minutes).
pub(crate) const POINTS_KEPT: u32 = 480;
/// Attempts not sampled for this long are forgotten (their node is gone).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Which running tasks' allocations may move (`taccd server --adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdaptiveMode {
    /// Nothing moves; verdicts are still computed and shown.
    Off,
    /// Tasks with `adaptive:` bounds only give back what they do not use (down to their
    /// minimum); nothing grows.
    Shrink,
    /// Tasks with `adaptive:` bounds grow and shrink within them.
    On,
}

impl AdaptiveMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdaptiveMode::Off => "off",
            AdaptiveMode::Shrink => "shrink",
            AdaptiveMode::On => "on",
        }
    }
}

impl fmt::Display for AdaptiveMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AdaptiveMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "off" => Ok(AdaptiveMode::Off),
            "shrink" => Ok(AdaptiveMode::Shrink),
            "on" => Ok(AdaptiveMode::On),
            other => Err(format!(
                "unknown adaptive mode `{other}`: use `off`, `shrink` or `on`"
            )),
        }
    }
}

/// The cluster's adaptive-allocation settings.
#[derive(Debug, Clone)]
pub struct AdaptiveConfig {
    pub mode: AdaptiveMode,
    /// A verdict needs samples covering this long (what "sustained" means).
    pub window: Duration,
    /// A resource changes at most once per this long; a reversal waits five times as long.
    pub cooldown: Duration,
    /// One point of each attempt's signals is kept durably per this long.
    pub record_every: Duration,
    /// The cluster's default policy for tasks that give no `adaptive:` bounds: their CPU
    /// and memory may move between these multiples of what they asked for (`None`: such
    /// tasks never move).
    pub default_bounds: Option<DefaultBounds>,
}

/// Bounds as multiples of a task's request (`taccd server --adaptive-default 0.5..2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DefaultBounds {
    pub min: f64,
    pub max: f64,
}

impl FromStr for DefaultBounds {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "`{text}` is not a range of multiples of the request: write MIN..MAX, \
                 e.g. `0.5..2` (from half to twice what a task asks for)"
            )
        };
        let (min, max) = text.split_once("..").ok_or_else(bad)?;
        let min: f64 = min.trim().parse().map_err(|_| bad())?;
        let max: f64 = max.trim().parse().map_err(|_| bad())?;
        if !(min.is_finite() && max.is_finite()) || min <= 0.0 || min > 1.0 || max < 1.0 {
            return Err(format!(
                "`{text}`: the minimum must be above 0 and at most 1, the maximum at least 1 \
                 (a task's request must lie within its bounds), e.g. `0.5..2`"
            ));
        }
        Ok(DefaultBounds { min, max })
    }
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            mode: AdaptiveMode::On,
            window: Duration::from_secs(30),
            cooldown: Duration::from_secs(60),
            record_every: Duration::from_secs(10),
            default_bounds: None,
        }
    }
}

/// What the control plane knows of one attempt's adaptation.
#[derive(Debug)]
struct Tracked {
    signals: Signals,
    verdict: Option<(Timestamp, Verdict)>,
    history: ChangeHistory,
    /// The per-node allocation in force, once it moved from the request.
    allocation: Option<Resources>,
    /// A change the agents have not confirmed yet, and the allocation before it.
    pending: Option<(Resources, Resources)>,
    /// Why this attempt no longer adapts (an agent could not apply a change).
    stopped: Option<String>,
    last_failcnt: Option<u64>,
    last_point: Option<Timestamp>,
    fed: Instant,
}

/// The classifier, the policy and every running attempt's adaptive state.
#[derive(Debug)]
pub(crate) struct AdaptiveBook {
    config: AdaptiveConfig,
    classifier: Box<dyn Classifier>,
    reallocator: Box<dyn Reallocator>,
    tracked: Mutex<BTreeMap<(TaskId, AttemptNo), Tracked>>,
}

impl AdaptiveBook {
    pub(crate) fn new(config: &AdaptiveConfig) -> AdaptiveBook {
        let window_ms = config.window.as_millis() as u64;
        let cooldown_ms = config.cooldown.as_millis() as u64;
        AdaptiveBook {
            classifier: Box::new(RuleClassifier::new(Rules {
                min_window_ms: window_ms,
                ..Rules::default()
            })),
            reallocator: Box::new(StepPolicy::new(StepPolicyConfig {
                cooldown_ms,
                reverse_after_ms: cooldown_ms * 5,
                ..StepPolicyConfig::default()
            })),
            config: config.clone(),
            tracked: Mutex::new(BTreeMap::new()),
        }
    }

    fn tracked(signals_ms: u64) -> Tracked {
        Tracked {
            signals: Signals::new(signals_ms),
            verdict: None,
            history: ChangeHistory::default(),
            allocation: None,
            pending: None,
            stopped: None,
            last_failcnt: None,
            last_point: None,
            fed: Instant::now(),
        }
    }

    fn span_ms(&self) -> u64 {
        // A little more than the window, so a full window is always at hand.
        self.config.window.as_millis() as u64 * 3 / 2
    }

    /// A restarted server: the allocation in force of a running attempt, from its
    /// resize history.
    pub(crate) fn restore(&self, task: TaskId, attempt: AttemptNo, allocation: Resources) {
        let span = self.span_ms();
        let mut tracked = self.tracked.lock().unwrap();
        tracked
            .entry((task, attempt))
            .or_insert_with(|| Self::tracked(span))
            .allocation = Some(allocation);
    }

    /// The per-node allocation in force of `attempt`, when it moved from the request.
    pub(crate) fn allocation(&self, attempt: AttemptRef) -> Option<Resources> {
        let tracked = self.tracked.lock().unwrap();
        tracked
            .get(&(attempt.task, attempt.attempt))
            .and_then(|t| t.allocation)
    }

    /// The verdict last given on `attempt`'s window, and when.
    pub(crate) fn verdict(&self, attempt: AttemptRef) -> Option<(Timestamp, Verdict)> {
        let tracked = self.tracked.lock().unwrap();
        tracked
            .get(&(attempt.task, attempt.attempt))
            .and_then(|t| t.verdict.clone())
    }

    /// The cluster's mode, and the names of the classifier and the policy.
    pub(crate) fn names(&self) -> (AdaptiveMode, &'static str, &'static str) {
        (
            self.config.mode,
            self.classifier.name(),
            self.reallocator.name(),
        )
    }

    /// The attempt ended: its window goes.
    pub(crate) fn end(&self, attempt: AttemptRef) {
        self.tracked
            .lock()
            .unwrap()
            .remove(&(attempt.task, attempt.attempt));
    }

    /// Restored tasks take the allocation in force, not the request (a restarted or
    /// rebuilt scheduler must count what they hold).
    pub(crate) fn patch_restored(&self, event: &mut Event) {
        match event {
            Event::TaskRestored { task, request, .. } => {
                let latest = {
                    let tracked = self.tracked.lock().unwrap();
                    tracked
                        .range((*task, AttemptNo(0))..=(*task, AttemptNo(u32::MAX)))
                        .next_back()
                        .and_then(|(_, t)| t.allocation)
                };
                if let Some(allocation) = latest {
                    request.per_node.cpu_millis = allocation.cpu_millis;
                    request.per_node.memory_bytes = allocation.memory_bytes;
                }
            }
            Event::Batch(events) => {
                for event in events {
                    self.patch_restored(event);
                }
            }
            _ => {}
        }
    }

    /// The bounds a task's allocation may move in under the cluster's mode, given what
    /// it holds now; `None`: it does not move.
    pub(crate) fn bounds(&self, spec: &TaskSpec, current: Resources) -> Option<Bounds> {
        resize::bounds(spec, current, self.config.mode, self.config.default_bounds)
    }

    /// The cluster's settings and policy a decision is taken under (`handlers::resize`).
    pub(crate) fn policy(&self) -> resize::Policy<'_> {
        resize::Policy {
            mode: self.config.mode,
            default_bounds: self.config.default_bounds,
            reallocator: &*self.reallocator,
        }
    }

    /// Take a sample of rank 0 received at `at`: the verdict on the window, the signal
    /// point to keep (when one is due), and what the policy would decide from (unless
    /// the attempt waits for a confirmation or stopped adapting).
    pub(crate) fn observe(
        &self,
        sample: &UsageSample,
        at: Timestamp,
        requested: Resources,
    ) -> Observed {
        let span = self.span_ms();
        let mut book = self.tracked.lock().unwrap();
        book.retain(|_, t| t.fed.elapsed() < FORGET_AFTER);
        let key = (sample.attempt.task, sample.attempt.attempt);
        let tracked = book.entry(key).or_insert_with(|| Self::tracked(span));
        tracked.fed = Instant::now();
        // v1 has no PSI: a failure count that rose means the limit was hit.
        let failing = match (sample.memory_failcnt, tracked.last_failcnt) {
            (Some(now), Some(before)) => Some(if now > before { 100.0 } else { 0.0 }),
            _ => None,
        };
        let pressure = sample.memory_pressure_percent.or(failing);
        tracked.last_failcnt = sample.memory_failcnt.or(tracked.last_failcnt);
        let gpus = &sample.gpus;
        tracked.signals.push(Sample {
            at,
            cpu_quota_millis: sample.cpu_quota_millis.unwrap_or(0),
            cpu_used_millis: sample.cpu_millis_used,
            cpu_throttled_fraction: sample.cpu_throttled_fraction,
            memory_limit_bytes: sample.memory_limit_bytes.unwrap_or(0),
            memory_used_bytes: sample.memory_bytes,
            memory_pressure_percent: pressure,
            gpu_utilization_percent: (!gpus.is_empty()).then(|| {
                gpus.iter()
                    .map(|g| f64::from(g.utilization_percent))
                    .sum::<f64>()
                    / gpus.len() as f64
            }),
            io_wait_percent: sample.io_wait_percent,
        });
        let verdict = self.classifier.classify(&tracked.signals);
        tracked.verdict = Some((at, verdict.clone()));
        let due = tracked.last_point.is_none_or(|last| {
            at.millis_since(last) >= self.config.record_every.as_millis() as u64
        });
        let point = due.then(|| {
            tracked.last_point = Some(at);
            SignalPoint {
                at,
                attempt: sample.attempt.attempt,
                cpu_used_millis: sample.cpu_millis_used,
                cpu_quota_millis: sample.cpu_quota_millis.unwrap_or(0),
                cpu_throttled_permille: sample
                    .cpu_throttled_fraction
                    .map(|f| (f * 1000.0).round() as u32),
                memory_used_bytes: sample.memory_bytes,
                memory_limit_bytes: sample.memory_limit_bytes.unwrap_or(0),
                memory_pressure_permille: pressure.map(|p| (p * 10.0).round() as u32),
                gpu_percent: (!gpus.is_empty()).then(|| {
                    gpus.iter().map(|g| g.utilization_percent).sum::<u32>() / gpus.len() as u32
                }),
                bottleneck: verdict.bottleneck.to_string(),
            }
        });
        let decide = (tracked.pending.is_none() && tracked.stopped.is_none())
            .then(|| (tracked.allocation.unwrap_or(requested), tracked.history));
        Observed {
            point: point.map(|point| SignalRecord {
                task: sample.attempt.task,
                attempt: sample.attempt.attempt,
                at,
                point: serde_json::to_value(&point).expect("points serialise"),
            }),
            verdict,
            decide,
        }
    }

    /// The policy moved `attempt` (`handlers::resize::on_sample`): the new allocation is
    /// in force, the change joins its history, the agents' confirmation is awaited, and
    /// the samples so far (which measured the old allocation) go.
    pub(crate) fn changed(&self, attempt: AttemptRef, decided: &resize::Decided, at: Timestamp) {
        let span = self.span_ms();
        let mut book = self.tracked.lock().unwrap();
        let tracked = book
            .entry((attempt.task, attempt.attempt))
            .or_insert_with(|| Self::tracked(span));
        tracked.allocation = Some(decided.to);
        tracked.history.record(&decided.change, at);
        tracked.pending = Some((decided.from, decided.to));
        tracked.signals.clear();
    }

    /// `attempt` was moved back to `to` after an agent could not apply a change.
    pub(crate) fn moved(&self, attempt: AttemptRef, to: Resources) {
        let span = self.span_ms();
        let mut book = self.tracked.lock().unwrap();
        book.entry((attempt.task, attempt.attempt))
            .or_insert_with(|| Self::tracked(span))
            .allocation = Some(to);
    }

    /// An agent applied a change of `attempt` (or could not: `error`, which ends its
    /// adaptation). The change that was pending (the allocation before it, and it), when
    /// the attempt is tracked at all.
    pub(crate) fn confirmed(
        &self,
        attempt: AttemptRef,
        error: Option<&str>,
    ) -> Option<Option<(Resources, Resources)>> {
        let mut book = self.tracked.lock().unwrap();
        let tracked = book.get_mut(&(attempt.task, attempt.attempt))?;
        if let Some(error) = error {
            tracked.stopped = Some(error.to_string());
        }
        Some(tracked.pending.take())
    }
}

/// What the adaptive book made of a sample of rank 0.
#[derive(Debug)]
pub(crate) struct Observed {
    /// The verdict on the attempt's window.
    pub(crate) verdict: Verdict,
    /// The signal point to keep durably, when one is due (at most [`POINTS_KEPT`]).
    pub(crate) point: Option<SignalRecord>,
    /// What the policy decides from — the allocation in force and its change history —
    /// unless the attempt waits for a confirmation or stopped adapting.
    pub(crate) decide: Option<(Resources, ChangeHistory)>,
}

impl Observed {
    /// What the policy decides on for `attempt` (`handlers::resize::on_sample`), unless
    /// the attempt waits for a confirmation or stopped adapting.
    pub(crate) fn judged(&self, attempt: AttemptRef) -> Option<resize::Judged<'_>> {
        let (current, history) = self.decide?;
        Some(resize::Judged {
            attempt,
            verdict: &self.verdict,
            current,
            history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_ones_say_the_choices() {
        assert_eq!("on".parse::<AdaptiveMode>(), Ok(AdaptiveMode::On));
        assert_eq!("shrink".parse::<AdaptiveMode>(), Ok(AdaptiveMode::Shrink));
        assert_eq!("off".parse::<AdaptiveMode>(), Ok(AdaptiveMode::Off));
        let error = "yes".parse::<AdaptiveMode>().unwrap_err();
        assert!(error.contains("`off`, `shrink` or `on`"), "{error}");
    }

    fn spec(adaptive: &str) -> TaskSpec {
        let text =
            format!("name: t\nrun: 'true'\nresources: {{cpus: 2, memory: 2GiB}}\n{adaptive}");
        tacc_schema::parse_task("t/task.yaml", &text).unwrap().0
    }

    #[test]
    fn bounds_follow_the_mode_and_the_task_file() {
        let adaptive = spec("adaptive: {cpus: 1..8, memory: 1GiB..4GiB}\n");
        let current = adaptive.resources.per_node();
        let book = |mode| {
            AdaptiveBook::new(&AdaptiveConfig {
                mode,
                ..AdaptiveConfig::default()
            })
        };
        let on = book(AdaptiveMode::On).bounds(&adaptive, current).unwrap();
        assert_eq!((on.min.cpu_millis, on.max.cpu_millis), (1000, 8000));
        assert_eq!(on.max.memory_bytes, 4 << 30);
        // Shrink: nothing above what it holds now.
        let shrink = book(AdaptiveMode::Shrink)
            .bounds(&adaptive, current)
            .unwrap();
        assert_eq!((shrink.min.cpu_millis, shrink.max.cpu_millis), (1000, 2000));
        assert!(book(AdaptiveMode::Off).bounds(&adaptive, current).is_none());
        // Without `adaptive:` a task never moves.
        let plain = spec("");
        assert!(book(AdaptiveMode::On).bounds(&plain, current).is_none());
    }

    #[test]
    fn the_cluster_default_bounds_tasks_that_give_none() {
        let plain: TaskSpec = serde_json::from_value(serde_json::json!({
            "run": "x", "resources": {"cpus": 2, "memory": "4GiB"}
        }))
        .unwrap();
        let current = plain.resources.per_node();
        let mut config = AdaptiveConfig {
            mode: AdaptiveMode::On,
            ..AdaptiveConfig::default()
        };
        assert!(AdaptiveBook::new(&config).bounds(&plain, current).is_none());
        config.default_bounds = Some("0.5..2".parse().unwrap());
        let bounds = AdaptiveBook::new(&config).bounds(&plain, current).unwrap();
        assert_eq!((bounds.min.cpu_millis, bounds.max.cpu_millis), (1000, 4000));
        assert_eq!(
            (bounds.min.memory_bytes, bounds.max.memory_bytes),
            (2 << 30, 8 << 30)
        );
        let err = "2..3".parse::<DefaultBounds>().unwrap_err();
        assert!(err.contains("at most 1"), "{err}");
        assert!(
            "half"
                .parse::<DefaultBounds>()
                .unwrap_err()
                .contains("MIN..MAX")
        );
    }
}
