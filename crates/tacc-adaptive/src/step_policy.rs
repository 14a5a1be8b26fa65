//! The default re-allocation policy: grow a short resource by a step, shrink an idle one
//! to its peak plus headroom, with hysteresis — a resource changes at most once per
//! cooldown, and never reverses direction within a longer window — so an allocation
//! never oscillates. Memory is never set below the highest use seen.

use serde::{Deserialize, Serialize};

use crate::policy::Situation;
use crate::{Allocation, Bottleneck, Change, Direction, Fit, Reallocator};

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepPolicyConfig {
    /// A resource changes at most once per this long.
    pub cooldown_ms: u64,
    /// A resource that grew is not shrunk (nor the reverse) within this long.
    pub reverse_after_ms: u64,
    /// A grow multiplies the allocation by this …
    pub grow_factor: f64,
    /// … and adds at least this much CPU …
    pub min_cpu_step_millis: u64,
    /// … or memory.
    pub min_memory_step_bytes: u64,
    /// A shrink leaves this multiple of the busiest CPU use seen.
    pub cpu_headroom: f64,
    /// A shrink leaves this multiple of the highest memory use seen.
    pub memory_headroom: f64,
    /// Changes smaller than this fraction of the allocation are not worth making.
    pub min_change_fraction: f64,
}

impl Default for StepPolicyConfig {
    fn default() -> StepPolicyConfig {
        StepPolicyConfig {
            cooldown_ms: 60_000,
            reverse_after_ms: 300_000,
            grow_factor: 1.5,
            min_cpu_step_millis: 500,
            min_memory_step_bytes: 256 * MIB,
            cpu_headroom: 1.25,
            memory_headroom: 1.3,
            min_change_fraction: 0.10,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct StepPolicy {
    config: StepPolicyConfig,
}

/// One resource's figures, so CPU and memory share the arithmetic.
struct Resource {
    current: u64,
    min: u64,
    max: u64,
    room: u64,
    min_step: u64,
    headroom: f64,
    /// The unit allocations are rounded up to.
    granule: u64,
    fit: Fit,
    /// The highest use seen in the window.
    peak: Option<u64>,
    last: Option<(tacc_core::Timestamp, Direction)>,
}

impl StepPolicy {
    pub fn new(config: StepPolicyConfig) -> StepPolicy {
        StepPolicy { config }
    }

    pub fn config(&self) -> &StepPolicyConfig {
        &self.config
    }

    fn may_move(&self, now: tacc_core::Timestamp, r: &Resource, direction: Direction) -> bool {
        match r.last {
            None => true,
            Some((at, last)) => {
                let since = now.millis_since(at);
                since >= self.config.cooldown_ms
                    && (last == direction || since >= self.config.reverse_after_ms)
            }
        }
    }

    /// The new amount of one resource, if it should change.
    fn target(&self, now: tacc_core::Timestamp, r: &Resource, grow: bool) -> Option<u64> {
        if r.current < r.min || r.current > r.max {
            return None; // the bounds moved under it: leave it to the owner
        }
        let wanted = if grow && r.fit == Fit::Short {
            if !self.may_move(now, r, Direction::Grow) {
                return None;
            }
            let step =
                ((r.current as f64 * self.config.grow_factor) as u64).max(r.current + r.min_step);
            round_up(step, r.granule).min(r.max).min(r.current + r.room)
        } else if r.fit == Fit::Idle {
            if !self.may_move(now, r, Direction::Shrink) {
                return None;
            }
            let peak = r.peak?;
            let keep = round_up((peak as f64 * r.headroom).ceil() as u64, r.granule);
            let keep = keep.max(r.min).max(peak);
            if keep >= r.current {
                return None; // a shrink never grows
            }
            keep
        } else {
            return None;
        };
        let worth = (r.current as f64 * self.config.min_change_fraction).max(1.0) as u64;
        (wanted.abs_diff(r.current) >= worth).then_some(wanted)
    }
}

fn round_up(value: u64, granule: u64) -> u64 {
    value.div_ceil(granule) * granule
}

impl Reallocator for StepPolicy {
    fn name(&self) -> &'static str {
        "step"
    }

    fn decide(&self, s: &Situation<'_>) -> Option<Change> {
        let verdict = s.verdict;
        let cpu = Resource {
            current: s.current.cpu_millis,
            min: s.bounds.min.cpu_millis,
            max: s.bounds.max.cpu_millis,
            room: s.room.cpu_millis,
            min_step: self.config.min_cpu_step_millis,
            headroom: self.config.cpu_headroom,
            granule: 100,
            fit: verdict.cpu,
            peak: verdict.cpu_peak_millis,
            last: s.history.cpu,
        };
        let memory = Resource {
            current: s.current.memory_bytes,
            min: s.bounds.min.memory_bytes,
            max: s.bounds.max.memory_bytes,
            room: s.room.memory_bytes,
            min_step: self.config.min_memory_step_bytes,
            headroom: self.config.memory_headroom,
            granule: MIB,
            fit: verdict.memory,
            peak: verdict.memory_peak_bytes,
            last: s.history.memory,
        };
        // More CPU helps only where CPU is what it waits for; more memory wherever it
        // is short (the kernel would otherwise reclaim, then kill).
        let grow_cpu = matches!(
            verdict.bottleneck,
            Bottleneck::InputBound | Bottleneck::CpuBound
        );
        let to = Allocation {
            cpu_millis: self.target(s.now, &cpu, grow_cpu).unwrap_or(cpu.current),
            memory_bytes: self.target(s.now, &memory, true).unwrap_or(memory.current),
        };
        if to == s.current {
            return None;
        }
        let mut moves = Vec::new();
        if to.cpu_millis != s.current.cpu_millis {
            moves.push(format!(
                "CPU {:.2} → {:.2}",
                s.current.cpu_millis as f64 / 1000.0,
                to.cpu_millis as f64 / 1000.0
            ));
        }
        if to.memory_bytes != s.current.memory_bytes {
            moves.push(format!(
                "memory {} → {}",
                tacc_core::ByteSize::from_bytes(s.current.memory_bytes),
                tacc_core::ByteSize::from_bytes(to.memory_bytes)
            ));
        }
        Some(Change {
            from: s.current,
            to,
            reason: format!(
                "{} ({}): {}",
                verdict.bottleneck,
                verdict.evidence.join("; "),
                moves.join(", ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tacc_core::Timestamp;

    use super::*;
    use crate::{Bounds, ChangeHistory, Room, Verdict};

    const GIB: u64 = 1 << 30;

    fn verdict(bottleneck: Bottleneck, cpu: Fit, memory: Fit) -> Verdict {
        Verdict {
            bottleneck,
            cpu,
            memory,
            evidence: vec!["evidence".into()],
            cpu_peak_millis: Some(500),
            memory_peak_bytes: Some(2 * GIB),
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            min: Allocation {
                cpu_millis: 1000,
                memory_bytes: GIB,
            },
            max: Allocation {
                cpu_millis: 8000,
                memory_bytes: 32 * GIB,
            },
        }
    }

    fn situation(verdict: &Verdict, history: ChangeHistory) -> Situation<'_> {
        Situation {
            now: Timestamp::from_millis(10_000_000),
            current: Allocation {
                cpu_millis: 2000,
                memory_bytes: 8 * GIB,
            },
            bounds: bounds(),
            room: Room {
                cpu_millis: 16_000,
                memory_bytes: 64 * GIB,
            },
            verdict,
            history,
        }
    }

    #[test]
    fn an_input_bound_attempt_gets_half_as_many_cpus_again() {
        let v = verdict(Bottleneck::InputBound, Fit::Short, Fit::Fit);
        let change = StepPolicy::default()
            .decide(&situation(&v, ChangeHistory::default()))
            .unwrap();
        assert_eq!(change.to.cpu_millis, 3000);
        assert_eq!(change.to.memory_bytes, 8 * GIB);
        assert_eq!(change.reason, "input_bound (evidence): CPU 2.00 → 3.00");
        assert_eq!(change.cpu_direction(), Some(Direction::Grow));
    }

    #[test]
    fn a_grow_stops_at_the_room_and_the_bounds() {
        let v = verdict(Bottleneck::CpuBound, Fit::Short, Fit::Fit);
        let mut s = situation(&v, ChangeHistory::default());
        s.room.cpu_millis = 400;
        assert_eq!(
            StepPolicy::default().decide(&s).unwrap().to.cpu_millis,
            2400
        );
        s.room.cpu_millis = 100; // less than a tenth: not worth it
        assert_eq!(StepPolicy::default().decide(&s), None);
        s.room.cpu_millis = 100_000;
        s.current.cpu_millis = 7000;
        assert_eq!(
            StepPolicy::default().decide(&s).unwrap().to.cpu_millis,
            8000
        );
    }

    #[test]
    fn a_gpu_bound_attempt_gets_no_more_cpu() {
        let v = verdict(Bottleneck::GpuBound, Fit::Short, Fit::Fit);
        assert_eq!(
            StepPolicy::default().decide(&situation(&v, ChangeHistory::default())),
            None
        );
    }

    #[test]
    fn an_idle_allocation_shrinks_to_its_peak_plus_headroom() {
        let v = verdict(Bottleneck::OverProvisioned, Fit::Idle, Fit::Idle);
        let change = StepPolicy::default()
            .decide(&situation(&v, ChangeHistory::default()))
            .unwrap();
        // CPU peak 0.5 × 1.25 = 0.63 → the bound's 1.00; memory 2 GiB × 1.3 = 2.6 GiB.
        assert_eq!(change.to.cpu_millis, 1000);
        assert_eq!(
            change.to.memory_bytes,
            round_up((2.0 * 1.3 * GIB as f64) as u64, MIB)
        );
        assert!(change.frees_capacity());
    }

    #[test]
    fn memory_under_pressure_grows() {
        let v = verdict(Bottleneck::MemoryPressure, Fit::Fit, Fit::Short);
        let change = StepPolicy::default()
            .decide(&situation(&v, ChangeHistory::default()))
            .unwrap();
        assert_eq!(change.to.memory_bytes, 12 * GIB);
        assert_eq!(change.to.cpu_millis, 2000);
    }

    #[test]
    fn nothing_changes_twice_within_the_cooldown_nor_reverses_within_the_longer_window() {
        let policy = StepPolicy::default();
        let v = verdict(Bottleneck::OverProvisioned, Fit::Idle, Fit::Fit);
        let now = Timestamp::from_millis(10_000_000);
        let grew = |ago_ms: u64| ChangeHistory {
            cpu: Some((Timestamp::from_millis(now.0 - ago_ms), Direction::Grow)),
            memory: None,
        };
        assert_eq!(policy.decide(&situation(&v, grew(30_000))), None);
        assert_eq!(policy.decide(&situation(&v, grew(120_000))), None);
        assert!(policy.decide(&situation(&v, grew(400_000))).is_some());
        let short = verdict(Bottleneck::CpuBound, Fit::Short, Fit::Fit);
        assert!(policy.decide(&situation(&short, grew(120_000))).is_some());
    }

    fn fit() -> impl Strategy<Value = Fit> {
        prop_oneof![
            Just(Fit::Unknown),
            Just(Fit::Short),
            Just(Fit::Fit),
            Just(Fit::Idle)
        ]
    }

    fn bottleneck() -> impl Strategy<Value = Bottleneck> {
        prop_oneof![
            Just(Bottleneck::MemoryPressure),
            Just(Bottleneck::InputBound),
            Just(Bottleneck::CpuBound),
            Just(Bottleneck::GpuBound),
            Just(Bottleneck::OverProvisioned),
            Just(Bottleneck::Balanced),
        ]
    }

    proptest! {
        /// Whatever the verdict: a change stays within the bounds, grows by no more than
        /// the room, never sets memory below the highest use, and respects the cooldown.
        #[test]
        fn changes_stay_within_bounds_room_use_and_cooldown(
            b in bottleneck(), cpu_fit in fit(), memory_fit in fit(),
            cpu in 1000u64..=8000, memory in GIB..=32 * GIB,
            room_cpu in 0u64..20_000, room_memory in 0u64..64 * GIB,
            cpu_peak in 0u64..9000, memory_fraction in 0.0f64..1.0,
            since_ms in 0u64..1_000_000, last_grew in any::<bool>(),
        ) {
            let memory_peak = (memory as f64 * memory_fraction) as u64;
            let v = Verdict {
                bottleneck: b, cpu: cpu_fit, memory: memory_fit, evidence: vec![],
                cpu_peak_millis: Some(cpu_peak), memory_peak_bytes: Some(memory_peak),
            };
            let now = Timestamp::from_millis(10_000_000);
            let direction = if last_grew { Direction::Grow } else { Direction::Shrink };
            let last = Some((Timestamp::from_millis(now.0 - since_ms), direction));
            let s = Situation {
                now,
                current: Allocation { cpu_millis: cpu, memory_bytes: memory },
                bounds: bounds(),
                room: Room { cpu_millis: room_cpu, memory_bytes: room_memory },
                verdict: &v,
                history: ChangeHistory { cpu: last, memory: last },
            };
            if let Some(change) = StepPolicy::default().decide(&s) {
                prop_assert!(bounds().contains(change.to));
                prop_assert!(change.to.cpu_millis <= cpu + room_cpu);
                prop_assert!(change.to.memory_bytes <= memory + room_memory);
                if change.to.memory_bytes < memory {
                    prop_assert!(change.to.memory_bytes >= memory_peak);
                }
                prop_assert!(since_ms >= StepPolicyConfig::default().cooldown_ms);
                if change.cpu_direction().is_some_and(|d| d != direction)
                    || change.memory_direction().is_some_and(|d| d != direction)
                {
                    prop_assert!(since_ms >= StepPolicyConfig::default().reverse_after_ms);
                }
            }
        }
    }
}
