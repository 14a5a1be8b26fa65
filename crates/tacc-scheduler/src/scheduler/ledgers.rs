//! The fair-share ledgers as values that outlive the scheduler: a server keeps them so a
//! restart (or a rebuild of the scheduler from the store) does not reset every group's
//! standing. A kept ledger says the value at one instant and the rate it accrued at then;
//! restoring advances it to now with that rate (the tasks that ran through a restart kept
//! running) and leaves the rate to the running tasks the scheduler is given back.

use tacc_core::Timestamp;

use super::Scheduler;
use super::accounts::Ledger;

/// One group's decaying usage: `value` as of `at`, accruing `rate` billing units a second.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerState {
    pub group: String,
    pub value: f64,
    pub rate: f64,
    pub at: Timestamp,
}

impl Scheduler {
    /// Every group's ledger as it stands (not advanced: exact as of its last change).
    pub fn fairshare_ledgers(&self) -> Vec<LedgerState> {
        self.groups
            .iter()
            .map(|g| LedgerState {
                group: g.account.name.clone(),
                value: g.ledger.value,
                rate: g.ledger.rate,
                at: Timestamp(g.ledger.last_ms),
            })
            .collect()
    }

    /// Take kept ledgers back as of `now`: each value advanced from its instant to `now`
    /// at its kept rate, then decaying from there with whatever rate the scheduler's own
    /// running tasks give it.
    pub fn restore_fairshare(&mut self, kept: &[LedgerState], now: Timestamp) {
        let half_life = self.config.fairshare.half_life_secs;
        let now = now.max(self.now);
        for state in kept {
            let mut then = Ledger {
                value: state.value,
                rate: state.rate,
                last_ms: state.at.as_millis(),
            };
            then.advance(now.as_millis(), half_life);
            let group = self.group_id(&state.group);
            let ledger = &mut self.groups[group].ledger;
            ledger.advance(now.as_millis(), half_life);
            ledger.value += then.value;
        }
        self.ranked_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SchedulerConfig;

    fn fairshare() -> Scheduler {
        Scheduler::by_name("fairshare", SchedulerConfig::default()).unwrap()
    }

    #[test]
    fn a_restored_ledger_continues_as_if_the_scheduler_had_never_stopped() {
        let hour = 3_600_000;
        let kept = vec![LedgerState {
            group: "vision".into(),
            value: 100.0,
            rate: 2.0,
            at: Timestamp(hour),
        }];
        // The same ledger left to run, and one rebuilt from the kept state an hour later.
        let mut running = fairshare();
        running.restore_fairshare(&kept, Timestamp(hour));
        let mut restarted = fairshare();
        restarted.restore_fairshare(&kept, Timestamp(2 * hour));
        let expected = {
            let mut ledger = Ledger {
                value: 100.0,
                rate: 2.0,
                last_ms: hour,
            };
            ledger.advance(
                2 * hour,
                SchedulerConfig::default().fairshare.half_life_secs,
            );
            ledger.value
        };
        let value = |s: &Scheduler| {
            s.standing(Timestamp(2 * hour))
                .groups
                .iter()
                .find(|g| g.group == "vision")
                .unwrap()
                .decayed_usage
        };
        assert!(
            (value(&restarted) - expected).abs() < 1e-9,
            "{}",
            value(&restarted)
        );
        assert!(expected > 100.0 * 0.5, "usage accrued while it ran");
        let state = &restarted.fairshare_ledgers()[0];
        assert_eq!((state.group.as_str(), state.rate), ("vision", 0.0));
        assert!(value(&running) > 0.0);
    }

    #[test]
    fn an_unknown_group_is_created_and_an_empty_list_changes_nothing() {
        let mut s = fairshare();
        s.restore_fairshare(&[], Timestamp(5));
        assert!(s.fairshare_ledgers().is_empty());
        s.restore_fairshare(
            &[LedgerState {
                group: "nlp".into(),
                value: 3.0,
                rate: 0.0,
                at: Timestamp(5),
            }],
            Timestamp(5),
        );
        assert_eq!(s.fairshare_ledgers()[0].value, 3.0);
    }
}
