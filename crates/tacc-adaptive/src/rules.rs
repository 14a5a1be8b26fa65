//! The default classifier: a handful of documented thresholds (docs/ADAPTIVE.md),
//! checked in a fixed order so the most urgent finding wins — memory pressure (the
//! attempt may be killed), input-bound (GPUs wait for the data loader), CPU-bound,
//! GPU-bound, over-provisioned, balanced.

use serde::{Deserialize, Serialize};
use tacc_core::ByteSize;

use crate::{Bottleneck, Classifier, Fit, Signals, Verdict};

/// The thresholds of [`RuleClassifier`]; fractions are of the allocation in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rules {
    /// No verdict from fewer samples than this …
    pub min_samples: usize,
    /// … or from samples covering less time than this: "sustained" means this long.
    pub min_window_ms: u64,
    /// CPU is short when its mean use reaches this fraction of the quota …
    pub cpu_short_used: f64,
    /// … or the quota held it back at least this fraction of the time.
    pub cpu_short_throttled: f64,
    /// CPU is idle when even its busiest sample used less than this fraction.
    pub cpu_idle_peak: f64,
    /// Memory is short when its mean use reaches this fraction of the limit …
    pub memory_short_used: f64,
    /// … or it stalled on memory at least this percent of the time (PSI).
    pub memory_short_pressure_percent: f64,
    /// Memory is idle when its highest use stayed below this fraction of the limit.
    pub memory_idle_peak: f64,
    /// GPUs below this mean utilisation are waiting for something.
    pub gpu_waiting_percent: f64,
    /// GPUs at or above this mean utilisation are the bottleneck.
    pub gpu_busy_percent: f64,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            min_samples: 3,
            min_window_ms: 20_000,
            cpu_short_used: 0.90,
            cpu_short_throttled: 0.10,
            cpu_idle_peak: 0.40,
            memory_short_used: 0.90,
            memory_short_pressure_percent: 10.0,
            memory_idle_peak: 0.50,
            gpu_waiting_percent: 50.0,
            gpu_busy_percent: 85.0,
        }
    }
}

/// Classifies by [`Rules`].
#[derive(Debug, Clone, Default)]
pub struct RuleClassifier {
    rules: Rules,
}

impl RuleClassifier {
    pub fn new(rules: Rules) -> RuleClassifier {
        RuleClassifier { rules }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    fn cpu(&self, signals: &Signals, evidence: &mut Vec<String>) -> (Fit, Option<u64>) {
        let quota = signals.latest().map_or(0, |s| s.cpu_quota_millis);
        let used = signals.mean(|s| s.cpu_used_millis.map(|m| m as f64));
        let peak = signals.max(|s| s.cpu_used_millis.map(|m| m as f64));
        let throttled = signals.mean(|s| s.cpu_throttled_fraction).unwrap_or(0.0);
        let (Some(used), Some(peak)) = (used, peak) else {
            return (Fit::Unknown, None);
        };
        if quota == 0 {
            evidence.push(format!("CPU {} cores used, no quota", cores(used)));
            return (Fit::Unknown, Some(peak as u64));
        }
        let quota_f = quota as f64;
        evidence.push(format!(
            "CPU {} of {} cores used (busiest {}), throttled {:.0}% of the time",
            cores(used),
            cores(quota_f),
            cores(peak),
            throttled * 100.0
        ));
        let fit = if used >= self.rules.cpu_short_used * quota_f
            || throttled >= self.rules.cpu_short_throttled
        {
            Fit::Short
        } else if peak < self.rules.cpu_idle_peak * quota_f {
            Fit::Idle
        } else {
            Fit::Fit
        };
        (fit, Some(peak as u64))
    }

    fn memory(&self, signals: &Signals, evidence: &mut Vec<String>) -> (Fit, Option<u64>) {
        let limit = signals.latest().map_or(0, |s| s.memory_limit_bytes);
        let used = signals.mean(|s| s.memory_used_bytes.map(|b| b as f64));
        let peak = signals.max(|s| s.memory_used_bytes.map(|b| b as f64));
        let pressure = signals.mean(|s| s.memory_pressure_percent);
        let (Some(used), Some(peak)) = (used, peak) else {
            return (Fit::Unknown, None);
        };
        let peak_bytes = peak as u64;
        if limit == 0 {
            evidence.push(format!("memory {} used, no limit", bytes(used)));
            return (Fit::Unknown, Some(peak_bytes));
        }
        let limit_f = limit as f64;
        let stalls = pressure.map_or(String::new(), |p| format!(", stalled {p:.0}% of the time"));
        evidence.push(format!(
            "memory {} of {} used (highest {}){stalls}",
            bytes(used),
            bytes(limit_f),
            bytes(peak)
        ));
        let fit = if used >= self.rules.memory_short_used * limit_f
            || pressure.is_some_and(|p| p >= self.rules.memory_short_pressure_percent)
        {
            Fit::Short
        } else if peak < self.rules.memory_idle_peak * limit_f {
            Fit::Idle
        } else {
            Fit::Fit
        };
        (fit, Some(peak_bytes))
    }
}

impl Classifier for RuleClassifier {
    fn name(&self) -> &'static str {
        "rules"
    }

    fn classify(&self, signals: &Signals) -> Verdict {
        if signals.len() < self.rules.min_samples || signals.covered_ms() < self.rules.min_window_ms
        {
            return Verdict::not_enough_data(format!(
                "{} samples over {}s; a verdict needs {} over {}s",
                signals.len(),
                signals.covered_ms() / 1000,
                self.rules.min_samples,
                self.rules.min_window_ms / 1000
            ));
        }
        let mut evidence = Vec::new();
        let gpu = signals.mean(|s| s.gpu_utilization_percent);
        if let Some(gpu) = gpu {
            evidence.push(format!("GPU {gpu:.0}% busy"));
        }
        let (cpu, cpu_peak_millis) = self.cpu(signals, &mut evidence);
        let (memory, memory_peak_bytes) = self.memory(signals, &mut evidence);
        if let Some(io) = signals.mean(|s| s.io_wait_percent) {
            evidence.push(format!("waiting for I/O {io:.0}% of the time"));
        }
        let bottleneck = if memory == Fit::Short {
            Bottleneck::MemoryPressure
        } else if cpu == Fit::Short && gpu.is_some_and(|g| g < self.rules.gpu_waiting_percent) {
            Bottleneck::InputBound
        } else if gpu.is_some_and(|g| g >= self.rules.gpu_busy_percent) {
            Bottleneck::GpuBound
        } else if cpu == Fit::Short {
            Bottleneck::CpuBound
        } else if cpu == Fit::Idle || memory == Fit::Idle {
            Bottleneck::OverProvisioned
        } else {
            Bottleneck::Balanced
        };
        Verdict {
            bottleneck,
            cpu,
            memory,
            evidence,
            cpu_peak_millis,
            memory_peak_bytes,
        }
    }
}

fn cores(millis: f64) -> String {
    format!("{:.2}", millis / 1000.0)
}

fn bytes(value: f64) -> String {
    ByteSize::from_bytes(value as u64).to_string()
}

#[cfg(test)]
mod tests {
    use tacc_core::Timestamp;

    use super::*;
    use crate::Sample;

    const GIB: u64 = 1 << 30;

    /// A recorded series: one sample every 2 s for 40 s, each made by `shape`.
    fn series(shape: impl Fn(u64) -> Sample) -> Signals {
        let mut signals = Signals::new(60_000);
        for i in 0..=20 {
            signals.push(shape(i * 2));
        }
        signals
    }

    fn base(at_s: u64) -> Sample {
        Sample {
            at: Timestamp::from_millis(1_000_000 + at_s * 1000),
            cpu_quota_millis: 2000,
            cpu_used_millis: Some(1300),
            cpu_throttled_fraction: Some(0.0),
            memory_limit_bytes: 8 * GIB,
            memory_used_bytes: Some(5 * GIB),
            memory_pressure_percent: Some(0.0),
            gpu_utilization_percent: None,
            io_wait_percent: None,
        }
    }

    fn classify(signals: &Signals) -> Verdict {
        RuleClassifier::default().classify(signals)
    }

    #[test]
    fn a_short_window_gives_no_verdict() {
        let mut signals = Signals::new(60_000);
        signals.push(base(0));
        signals.push(base(2));
        signals.push(base(4));
        let verdict = classify(&signals);
        assert_eq!(verdict.bottleneck, Bottleneck::NotEnoughData);
        assert!(
            verdict.evidence[0].contains("3 samples over 4s"),
            "{verdict:?}"
        );
    }

    #[test]
    fn idle_gpus_beside_a_saturated_quota_are_input_bound() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(1980),
            cpu_throttled_fraction: Some(0.35),
            gpu_utilization_percent: Some(if t % 4 == 0 { 20.0 } else { 30.0 }),
            ..base(t)
        }));
        assert_eq!(verdict.bottleneck, Bottleneck::InputBound);
        assert_eq!(verdict.cpu, Fit::Short);
        assert_eq!(
            verdict.summary(),
            "input_bound: GPU 25% busy; CPU 1.98 of 2.00 cores used (busiest 1.98), throttled \
             35% of the time; memory 5GiB of 8GiB used (highest 5GiB), stalled 0% of the time"
        );
    }

    #[test]
    fn throttling_alone_marks_cpu_short() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(1500),
            cpu_throttled_fraction: Some(0.2),
            ..base(t)
        }));
        assert_eq!(verdict.cpu, Fit::Short);
        assert_eq!(verdict.bottleneck, Bottleneck::CpuBound);
    }

    #[test]
    fn busy_gpus_are_the_bottleneck_even_with_a_busy_cpu() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(1990),
            gpu_utilization_percent: Some(97.0),
            ..base(t)
        }));
        assert_eq!(verdict.bottleneck, Bottleneck::GpuBound);
    }

    #[test]
    fn memory_near_the_limit_wins_over_everything() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(1990),
            gpu_utilization_percent: Some(10.0),
            memory_used_bytes: Some(7 * GIB + GIB / 2),
            ..base(t)
        }));
        assert_eq!(verdict.bottleneck, Bottleneck::MemoryPressure);
        assert_eq!(verdict.memory, Fit::Short);
    }

    #[test]
    fn memory_stalls_count_as_pressure_below_the_limit() {
        let verdict = classify(&series(|t| Sample {
            memory_pressure_percent: Some(25.0),
            ..base(t)
        }));
        assert_eq!(verdict.bottleneck, Bottleneck::MemoryPressure);
    }

    #[test]
    fn sustained_low_use_is_over_provisioned_with_its_peaks() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(if t == 10 { 700 } else { 200 }),
            memory_used_bytes: Some(GIB),
            ..base(t)
        }));
        assert_eq!(verdict.bottleneck, Bottleneck::OverProvisioned);
        assert_eq!((verdict.cpu, verdict.memory), (Fit::Idle, Fit::Idle));
        assert_eq!(verdict.cpu_peak_millis, Some(700));
        assert_eq!(verdict.memory_peak_bytes, Some(GIB));
    }

    #[test]
    fn one_busy_sample_keeps_cpu_from_looking_idle() {
        let verdict = classify(&series(|t| Sample {
            cpu_used_millis: Some(if t == 10 { 1500 } else { 200 }),
            ..base(t)
        }));
        assert_eq!(verdict.cpu, Fit::Fit);
        assert_eq!(verdict.bottleneck, Bottleneck::Balanced);
    }

    #[test]
    fn no_quota_and_no_limit_leave_the_fit_unknown() {
        let verdict = classify(&series(|t| Sample {
            cpu_quota_millis: 0,
            memory_limit_bytes: 0,
            ..base(t)
        }));
        assert_eq!((verdict.cpu, verdict.memory), (Fit::Unknown, Fit::Unknown));
        assert_eq!(verdict.bottleneck, Bottleneck::Balanced);
    }
}
