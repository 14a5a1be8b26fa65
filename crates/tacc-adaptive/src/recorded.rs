//! The rules and the policy on signal series recorded from real runs
//! (`bench/adaptive.sh` on a 2-CPU cgroup v1 machine, `--adaptive-window 6s`; the
//! server's recorded points, one per 2 s, in `fixtures/`): a trainer starved at half a
//! CPU, an idle task holding two, and the trainer once grown to two.

use tacc_core::Timestamp;

use crate::{
    Allocation, Bottleneck, Bounds, ChangeHistory, Classifier, Fit, Reallocator, Room,
    RuleClassifier, Rules, Sample, Signals, Situation, StepPolicy, StepPolicyConfig, Verdict,
};

const GIB: u64 = 1 << 30;

fn recorded(json: &str) -> Vec<Sample> {
    serde_json::from_str(json).expect("a fixture of samples")
}

/// The verdict after each sample: a 6 s window over the last 20 s of points (the points
/// are the ones the server kept, about one per 3 s).
fn verdicts(samples: &[Sample]) -> Vec<Verdict> {
    let classifier = RuleClassifier::new(Rules {
        min_window_ms: 6_000,
        ..Rules::default()
    });
    let mut signals = Signals::new(20_000);
    samples
        .iter()
        .map(|sample| {
            signals.push(sample.clone());
            classifier.classify(&signals)
        })
        .collect()
}

fn decide(verdict: &Verdict, current: Allocation, now: Timestamp) -> Option<crate::Change> {
    StepPolicy::new(StepPolicyConfig {
        cooldown_ms: 4_000,
        reverse_after_ms: 20_000,
        ..StepPolicyConfig::default()
    })
    .decide(&Situation {
        now,
        current,
        bounds: Bounds {
            min: Allocation {
                cpu_millis: 500,
                memory_bytes: current.memory_bytes,
            },
            max: Allocation {
                cpu_millis: 2000,
                memory_bytes: current.memory_bytes,
            },
        },
        room: Room {
            cpu_millis: 2500,
            memory_bytes: 4 * GIB,
        },
        verdict,
        history: ChangeHistory::default(),
    })
}

#[test]
fn a_trainer_throttled_at_its_quota_is_cpu_bound_and_grows_a_step() {
    let samples = recorded(include_str!("fixtures/trainer_starved_at_half_a_cpu.json"));
    let verdicts = verdicts(&samples);
    // Not before the window is full, then CPU-bound on every sample.
    assert_eq!(verdicts[0].bottleneck, Bottleneck::NotEnoughData);
    assert!(
        verdicts[3..]
            .iter()
            .all(|v| v.bottleneck == Bottleneck::CpuBound && v.cpu == Fit::Short),
        "{verdicts:#?}"
    );
    let last = verdicts.last().unwrap();
    let current = Allocation {
        cpu_millis: 500,
        memory_bytes: GIB / 2,
    };
    let change = decide(last, current, samples.last().unwrap().at).expect("a grow");
    assert_eq!(change.to.cpu_millis, 1000, "×1.5, at least +0.5 CPU");
    assert_eq!(
        change.to.memory_bytes,
        GIB / 2,
        "memory stays in its bounds"
    );
}

#[test]
fn an_idle_task_is_over_provisioned_and_shrinks_to_its_minimum() {
    let samples = recorded(include_str!("fixtures/idle_holding_two_cpus.json"));
    let verdicts = verdicts(&samples);
    assert!(
        verdicts[3..]
            .iter()
            .all(|v| v.bottleneck == Bottleneck::OverProvisioned && v.cpu == Fit::Idle),
        "{verdicts:#?}"
    );
    let current = Allocation {
        cpu_millis: 2000,
        memory_bytes: GIB / 2,
    };
    let change = decide(
        verdicts.last().unwrap(),
        current,
        samples.last().unwrap().at,
    )
    .expect("a shrink");
    assert_eq!(change.to.cpu_millis, 500);
    assert!(
        change.reason.starts_with("over_provisioned"),
        "{}",
        change.reason
    );
}

#[test]
fn a_trainer_grown_to_its_maximum_is_left_there() {
    let samples = recorded(include_str!("fixtures/trainer_grown_to_two_cpus.json"));
    let verdicts = verdicts(&samples);
    // The last samples: the quota is 2 CPUs and no longer holds it back.
    let tail = samples.last().unwrap();
    assert_eq!(tail.cpu_quota_millis, 2000);
    let last = verdicts.last().unwrap();
    assert_eq!(last.cpu, Fit::Fit, "{last:#?}");
    let current = Allocation {
        cpu_millis: 2000,
        memory_bytes: GIB / 2,
    };
    assert_eq!(decide(last, current, tail.at), None, "{last:#?}");
}
