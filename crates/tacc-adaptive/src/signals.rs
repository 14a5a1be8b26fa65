//! What a running attempt used, sample by sample: the input of every classifier. A
//! [`Signals`] window keeps the samples of the last [`Signals::span_ms`] only, so its
//! size is bounded however long the attempt runs.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use tacc_core::Timestamp;

/// One attempt (all its processes on one node) at one moment, with the allocation in
/// force then. `None` where the runtime or node cannot measure it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at: Timestamp,
    /// The CPU quota in force, in thousandths of a CPU (0: no quota).
    pub cpu_quota_millis: u64,
    /// Thousandths of a CPU used on average since the previous sample.
    pub cpu_used_millis: Option<u64>,
    /// Fraction (0–1) of the time since the previous sample the quota held it back.
    pub cpu_throttled_fraction: Option<f64>,
    /// The memory limit in force (0: no limit).
    pub memory_limit_bytes: u64,
    pub memory_used_bytes: Option<u64>,
    /// Percent of time some of its tasks stalled on memory (PSI `some avg10`, cgroup v2),
    /// or a rising failure count on v1 reported as 100.
    pub memory_pressure_percent: Option<f64>,
    /// Mean utilisation of its GPUs in percent; `None` when it has no GPU.
    pub gpu_utilization_percent: Option<f64>,
    /// Percent of time its tasks waited for I/O, where known.
    pub io_wait_percent: Option<f64>,
}

/// The recent samples of one attempt, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    span_ms: u64,
    samples: VecDeque<Sample>,
}

impl Signals {
    /// A window that keeps `span_ms` of history.
    pub fn new(span_ms: u64) -> Signals {
        Signals {
            span_ms,
            samples: VecDeque::new(),
        }
    }

    pub fn span_ms(&self) -> u64 {
        self.span_ms
    }

    /// Adds a sample (samples older than the newest are ignored: reports may be
    /// duplicated or reordered) and forgets what fell out of the window.
    pub fn push(&mut self, sample: Sample) {
        if self.samples.back().is_some_and(|last| sample.at <= last.at) {
            return;
        }
        let newest = sample.at;
        self.samples.push_back(sample);
        while self
            .samples
            .front()
            .is_some_and(|s| newest.millis_since(s.at) > self.span_ms)
        {
            self.samples.pop_front();
        }
    }

    /// Forgets everything, e.g. after the allocation changed (old samples measured the
    /// old allocation).
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    pub fn samples(&self) -> impl ExactSizeIterator<Item = &Sample> + DoubleEndedIterator {
        self.samples.iter()
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// Milliseconds between the oldest and the newest sample.
    pub fn covered_ms(&self) -> u64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(first), Some(last)) => last.at.millis_since(first.at),
            _ => 0,
        }
    }

    /// The mean of a measure over the samples that have it, with how many had it.
    pub fn mean(&self, measure: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        let values: Vec<f64> = self.samples.iter().filter_map(measure).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// The highest value of a measure over the samples that have it.
    pub fn max(&self, measure: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        self.samples.iter().filter_map(measure).reduce(f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(at_s: u64) -> Sample {
        Sample {
            at: Timestamp::from_millis(at_s * 1000),
            cpu_quota_millis: 2000,
            cpu_used_millis: Some(1000),
            cpu_throttled_fraction: Some(0.0),
            memory_limit_bytes: 1 << 30,
            memory_used_bytes: Some(1 << 28),
            memory_pressure_percent: None,
            gpu_utilization_percent: None,
            io_wait_percent: None,
        }
    }

    #[test]
    fn the_window_forgets_what_is_older_than_its_span() {
        let mut signals = Signals::new(10_000);
        for s in 0..30 {
            signals.push(sample(s));
        }
        assert_eq!(signals.len(), 11);
        assert_eq!(signals.covered_ms(), 10_000);
    }

    #[test]
    fn duplicated_or_reordered_samples_are_ignored() {
        let mut signals = Signals::new(60_000);
        signals.push(sample(5));
        signals.push(sample(5));
        signals.push(sample(3));
        signals.push(sample(7));
        let times: Vec<u64> = signals.samples().map(|s| s.at.0).collect();
        assert_eq!(times, vec![5000, 7000]);
    }

    #[test]
    fn mean_and_max_skip_samples_without_the_measure() {
        let mut signals = Signals::new(60_000);
        let mut a = sample(1);
        a.gpu_utilization_percent = Some(20.0);
        let mut b = sample(2);
        b.gpu_utilization_percent = Some(60.0);
        signals.push(a);
        signals.push(b);
        signals.push(sample(3));
        assert_eq!(signals.mean(|s| s.gpu_utilization_percent), Some(40.0));
        assert_eq!(signals.max(|s| s.gpu_utilization_percent), Some(60.0));
        assert_eq!(signals.mean(|s| s.io_wait_percent), None);
    }
}
