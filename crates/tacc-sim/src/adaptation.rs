//! The simulator's side of adaptive allocation: it synthesises the sample a node agent
//! would report for a running job from the speed model (CPU used = the least of the
//! allocation and what the job would use, throttled the rest of the time, GPU busy in
//! proportion to the speed, memory used per its class), and hands the window to the
//! same classifier and re-allocation policy as the live cluster (`tacc-adaptive`).
//! Applying a decision is the replay's business (`nodes.rs`): it goes to the scheduler
//! as `Event::TaskResized`.

use tacc_adaptive::{
    Allocation, Bounds, Change, ChangeHistory, Classifier, Reallocator, Room, RuleClassifier,
    Sample, Signals, Situation, StepPolicy,
};
use tacc_core::{Resources, Timestamp};

use crate::speed::{ClassId, SpeedModel};

/// What the live cluster decides with, configured from the model file.
#[derive(Debug)]
pub struct Adapter {
    classifier: Box<dyn Classifier>,
    policy: Box<dyn Reallocator>,
    window_ms: u64,
}

/// One running job's adaptation state.
#[derive(Debug, Clone)]
pub struct JobAdaptation {
    signals: Signals,
    history: ChangeHistory,
    bounds: Bounds,
}

impl Adapter {
    pub fn new(model: &SpeedModel) -> Adapter {
        Adapter {
            classifier: Box::new(RuleClassifier::new(model.rules.clone())),
            policy: Box::new(StepPolicy::new(model.policy.clone())),
            window_ms: model.adaptive.window_s * 1000,
        }
    }

    /// A fresh state for a job that requested `request` per node.
    pub fn job(&self, model: &SpeedModel, request: Resources) -> JobAdaptation {
        JobAdaptation {
            signals: Signals::new(self.window_ms),
            history: ChangeHistory::default(),
            bounds: bounds(model, request),
        }
    }

    /// Samples the job at `now` and decides whether its allocation should change.
    pub fn step(
        &self,
        now: u64,
        model: &SpeedModel,
        class: ClassId,
        state: &mut JobAdaptation,
        current: Resources,
        room: Resources,
    ) -> Option<Change> {
        state.signals.push(sample(now, model, class, current));
        let verdict = self.classifier.classify(&state.signals);
        self.policy.decide(&Situation {
            now: Timestamp(now),
            current: Allocation {
                cpu_millis: current.cpu_millis,
                memory_bytes: current.memory_bytes,
            },
            bounds: state.bounds,
            room: Room {
                cpu_millis: room.cpu_millis,
                memory_bytes: room.memory_bytes,
            },
            verdict: &verdict,
            history: state.history,
        })
    }
}

impl JobAdaptation {
    /// The change was applied at `now`: what was sampled measured the old allocation.
    pub fn applied(&mut self, change: &Change, now: u64) {
        self.history.record(change, Timestamp(now));
        self.signals.clear();
    }

    /// A new attempt starts: its samples start afresh (the history stays, so a restart
    /// does not reset the cooldown).
    pub fn restarted(&mut self) {
        self.signals.clear();
    }
}

/// The cluster's default bounds around a request (per node): never below
/// `min_cpus_per_gpu` per GPU (or the request, if that is less) nor above
/// `max_cpu_factor` × the request; memory between its two factors of the request.
pub fn bounds(model: &SpeedModel, request: Resources) -> Bounds {
    let a = &model.adaptive;
    let gpus = f64::from(request.gpus.max(1));
    let cpu = request.cpu_millis as f64;
    let memory = request.memory_bytes as f64;
    let min_cpu = (a.min_cpus_per_gpu * gpus * 1000.0).min(cpu);
    Bounds {
        min: Allocation {
            cpu_millis: min_cpu.round() as u64,
            memory_bytes: (memory * a.min_memory_factor).round() as u64,
        },
        max: Allocation {
            cpu_millis: (cpu * a.max_cpu_factor).round() as u64,
            memory_bytes: (memory * a.max_memory_factor).round() as u64,
        },
    }
}

/// What a node agent would report for the job at `now`, per the model.
pub fn sample(now: u64, model: &SpeedModel, class: ClassId, allocation: Resources) -> Sample {
    let demand = model.cpu_demand(class, allocation.gpus);
    let used = allocation.cpu_millis.min(demand);
    let throttled = if demand > allocation.cpu_millis && demand > 0 {
        1.0 - allocation.cpu_millis as f64 / demand as f64
    } else {
        0.0
    };
    let speed = model.speed(class, allocation.cpu_millis, allocation.gpus);
    Sample {
        at: Timestamp(now),
        cpu_quota_millis: allocation.cpu_millis,
        cpu_used_millis: Some(used),
        cpu_throttled_fraction: Some(throttled),
        memory_limit_bytes: allocation.memory_bytes,
        memory_used_bytes: Some(model.memory_use(class, allocation.gpus)),
        memory_pressure_percent: Some(0.0),
        gpu_utilization_percent: (allocation.gpus > 0).then_some(speed * 100.0),
        io_wait_percent: None,
    }
}

#[cfg(test)]
mod tests {
    use tacc_adaptive::Direction;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn run(model: &SpeedModel, class: &str, mut allocation: Resources, room: u64) -> Vec<u64> {
        let adapter = Adapter::new(model);
        let class = model.class_named(class).unwrap();
        let request = model.request(class, allocation.gpus);
        let mut state = adapter.job(model, request);
        let mut cpus = vec![allocation.cpu_millis];
        for minute in 1..=30 {
            let now = minute * 60_000;
            let room = Resources::new(room, 256 * GIB, 0);
            if let Some(change) = adapter.step(now, model, class, &mut state, allocation, room) {
                allocation.cpu_millis = change.to.cpu_millis;
                allocation.memory_bytes = change.to.memory_bytes;
                state.applied(&change, now);
                cpus.push(allocation.cpu_millis);
            }
        }
        cpus
    }

    #[test]
    fn an_input_heavy_job_grows_until_its_loader_is_fed_then_stays() {
        let model = SpeedModel::default_model();
        let class = model.class_named("input_heavy").unwrap();
        let cpus = run(&model, "input_heavy", model.request(class, 4), 64_000);
        // 4 → 6 → 9 CPUs per GPU (c_sat is 8): full speed, then no further change.
        assert_eq!(cpus, vec![16_000, 24_000, 36_000]);
    }

    #[test]
    fn an_over_provisioned_job_gives_back_cpu_and_memory() {
        let model = SpeedModel::default_model();
        let class = model.class_named("over_provisioned").unwrap();
        let request = model.request(class, 4);
        let adapter = Adapter::new(&model);
        let mut state = adapter.job(&model, request);
        let mut change = None;
        for minute in 1..=3 {
            change = adapter.step(
                minute * 60_000,
                &model,
                class,
                &mut state,
                request,
                Resources::ZERO,
            );
        }
        let change = change.expect("a shrink after three samples");
        // Uses 1 CPU per GPU: kept at 1.25 × 4 = 5 CPUs; memory to the 0.5 × floor.
        assert_eq!(change.to.cpu_millis, 5000);
        assert_eq!(change.to.memory_bytes, 128 * GIB);
        assert_eq!(change.cpu_direction(), Some(Direction::Shrink));
        assert!(
            change.reason.contains("CPU 32.00 → 5.00"),
            "{}",
            change.reason
        );
    }

    #[test]
    fn a_job_whose_request_fits_is_left_alone() {
        let model = SpeedModel::default_model();
        let class = model.class_named("balanced").unwrap();
        assert_eq!(
            run(&model, "balanced", model.request(class, 8), 64_000),
            vec![32_000]
        );
    }

    #[test]
    fn the_sample_reports_the_models_figures() {
        let model = SpeedModel::default_model();
        let class = model.class_named("input_heavy").unwrap();
        let s = sample(5, &model, class, model.request(class, 2));
        assert_eq!(s.cpu_quota_millis, 8000);
        assert_eq!(s.cpu_used_millis, Some(8000));
        assert_eq!(s.cpu_throttled_fraction, Some(0.5));
        assert_eq!(s.gpu_utilization_percent, Some(50.0));
        assert_eq!(s.memory_used_bytes, Some((64.0 * 0.7 * GIB as f64) as u64));
    }
}
