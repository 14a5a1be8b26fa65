//! The decisions of asynchronous successive halving (ASHA), apart from any I/O: given the
//! metric values trials reported at each rung, in the order they arrived, which trials
//! are stopped, where and why. Rung `k` is at `min_steps · η^k` reported steps (below
//! `max_steps`). When a trial reaches a rung, its value joins the values of the trials
//! that reached that rung before it; it continues only when it is among the best
//! ⌈n/η⌉ of those n values (ties continue), so the first trial at a rung always
//! continues and later ones must beat what came before. Judging each arrival only
//! against earlier ones makes the result the same however often it is recomputed from the
//! stored points, so a restarted server stops the same trials.

use std::collections::BTreeMap;

use tacc_schema::{AshaSpec, Goal};

/// The rungs and the comparison of one sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Asha {
    /// The step of each rung, increasing.
    pub rungs: Vec<u64>,
    pub eta: u32,
    pub goal: Goal,
}

/// A trial's value of the metric at a rung: the first point it reported at or past the
/// rung's step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    pub trial: u32,
    pub rung: usize,
    pub value: f64,
}

/// Why a trial was stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stopped {
    pub rung: usize,
    pub value: f64,
    /// The value it had to match or beat.
    pub cutoff: f64,
}

impl Asha {
    pub fn new(spec: &AshaSpec, goal: Goal) -> Asha {
        let eta = u64::from(spec.reduction_factor.max(2));
        let mut rungs = Vec::new();
        let mut step = spec.min_steps.max(1);
        while step < spec.max_steps {
            rungs.push(step);
            step = step.saturating_mul(eta);
        }
        Asha {
            rungs,
            eta: eta as u32,
            goal,
        }
    }

    /// The trial's observations from its points (step, value) in arrival order: for each
    /// rung, the first point at or past it.
    pub fn observe(&self, trial: u32, points: &[(u64, f64)]) -> Vec<Observation> {
        self.rungs
            .iter()
            .enumerate()
            .filter_map(|(rung, step)| {
                points
                    .iter()
                    .find(|(at, _)| at >= step)
                    .map(|(_, value)| Observation {
                        trial,
                        rung,
                        value: *value,
                    })
            })
            .collect()
    }

    /// The trials stopped by these observations (in arrival order), each at the first
    /// rung that stopped it; a stopped trial's later observations are ignored.
    pub fn decide(&self, observations: &[Observation]) -> BTreeMap<u32, Stopped> {
        let mut reached: Vec<Vec<f64>> = vec![Vec::new(); self.rungs.len()];
        let mut stopped = BTreeMap::new();
        for observation in observations {
            if stopped.contains_key(&observation.trial) || observation.rung >= reached.len() {
                continue;
            }
            let values = &mut reached[observation.rung];
            values.push(observation.value);
            let mut ranked = values.clone();
            ranked.sort_by(|a, b| {
                let order = a.total_cmp(b);
                match self.goal {
                    Goal::Minimize => order,
                    Goal::Maximize => order.reverse(),
                }
            });
            let keep = ranked.len().div_ceil(self.eta as usize);
            let cutoff = ranked[keep - 1];
            if self.goal.better(cutoff, observation.value) {
                stopped.insert(
                    observation.trial,
                    Stopped {
                        rung: observation.rung,
                        value: observation.value,
                        cutoff,
                    },
                );
            }
        }
        stopped
    }

    /// The reason a stopped trial ends with, e.g.
    /// `early_stopped: rung 0 (val_loss 0.52, top 1/3 needed ≤ 0.31)`.
    pub fn reason(&self, metric: &str, stopped: &Stopped) -> String {
        format!(
            "early_stopped: rung {} (step {}, {metric} {}, top 1/{} needed {} {})",
            stopped.rung,
            self.rungs[stopped.rung],
            shown(stopped.value),
            self.eta,
            self.goal.at_least_as_good(),
            shown(stopped.cutoff)
        )
    }
}

fn shown(value: f64) -> String {
    let rounded: f64 = format!("{value:.4e}").parse().unwrap_or(value);
    format!("{rounded}")
}

/// The prefix of every early-stop reason.
pub const EARLY_STOPPED: &str = "early_stopped:";

#[cfg(test)]
mod tests {
    use super::*;

    fn asha(goal: Goal) -> Asha {
        Asha::new(
            &AshaSpec {
                min_steps: 2,
                reduction_factor: 3,
                max_steps: 40,
            },
            goal,
        )
    }

    fn at(trial: u32, rung: usize, value: f64) -> Observation {
        Observation { trial, rung, value }
    }

    #[test]
    fn rungs_grow_by_eta_below_max_steps() {
        assert_eq!(asha(Goal::Minimize).rungs, [2, 6, 18]);
        let one = Asha::new(
            &AshaSpec {
                min_steps: 5,
                reduction_factor: 2,
                max_steps: 6,
            },
            Goal::Minimize,
        );
        assert_eq!(one.rungs, [5]);
    }

    #[test]
    fn observations_take_the_first_point_at_or_past_each_rung() {
        let points = [(1, 0.9), (3, 0.8), (6, 0.7), (7, 0.6), (30, 0.1)];
        let seen = asha(Goal::Minimize).observe(4, &points);
        assert_eq!(seen, [at(4, 0, 0.8), at(4, 1, 0.7), at(4, 2, 0.1)]);
        assert!(asha(Goal::Minimize).observe(4, &[(1, 0.5)]).is_empty());
    }

    #[test]
    fn the_first_at_a_rung_continues_and_worse_later_arrivals_stop() {
        let asha = asha(Goal::Minimize);
        let stopped = asha.decide(&[
            at(0, 0, 0.30),
            at(1, 0, 0.50), // 2 values, keep 1: 0.50 is worse than 0.30
            at(2, 0, 0.20), // better than all: continues
            at(3, 0, 0.30), // 4 values, keep 2 (0.20, 0.30): a tie continues
            at(4, 0, 0.90),
        ]);
        assert_eq!(stopped.keys().copied().collect::<Vec<_>>(), [1, 4]);
        assert_eq!(
            stopped[&1],
            Stopped {
                rung: 0,
                value: 0.5,
                cutoff: 0.3
            }
        );
        assert_eq!(
            asha.reason("val_loss", &stopped[&4]),
            "early_stopped: rung 0 (step 2, val_loss 0.9, top 1/3 needed ≤ 0.3)"
        );
    }

    #[test]
    fn maximize_keeps_the_largest_and_later_rungs_judge_alone() {
        let asha = asha(Goal::Maximize);
        let stopped = asha.decide(&[
            at(0, 0, 0.9),
            at(1, 0, 0.5),
            at(0, 1, 0.95),
            at(2, 0, 0.99),
            at(2, 1, 0.90), // second at rung 1, worse than 0.95: stopped there
            at(1, 1, 0.99), // already stopped at rung 0: ignored
        ]);
        assert_eq!(stopped.len(), 2);
        assert_eq!(stopped[&1].rung, 0);
        assert_eq!(stopped[&2].rung, 1);
        assert_eq!(stopped[&2].cutoff, 0.95);
    }

    #[test]
    fn the_same_observations_give_the_same_decisions() {
        let asha = asha(Goal::Minimize);
        let observations: Vec<Observation> = (0..30)
            .map(|i| at(i, (i % 3) as usize, f64::from((i * 7919) % 13)))
            .collect();
        assert_eq!(asha.decide(&observations), asha.decide(&observations));
    }
}
