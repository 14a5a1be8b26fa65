//! The attempts this agent has finished, so that none is ever started again here.
//!
//! The server lists an attempt in the node's desired work until it has taken in its end;
//! an attempt that ended here and is still listed must not start again. Forgetting it as
//! soon as a desired set no longer lists it is not enough: work can come from a server
//! that has not seen the end — after a failover, a replica that won the leadership back
//! and recovered from a store that lost the acknowledged end, or any stale answer — and
//! a finished task would then run a second time under the same attempt (CI of
//! 2026-11-28, `tests/ha.rs`: `run-marker 3 attempt 1` twice in one log). So an attempt
//! is remembered for as long as it is among the last [`REMEMBERED`] this agent finished,
//! whatever the server lists; a new run of a task is a new attempt number, never the same
//! one again.

use std::collections::{BTreeSet, VecDeque};

use tacc_proto::AttemptRef;

/// How many finished attempts are remembered: at a few hundred short tasks a second on a
/// node, minutes of them, in a few megabytes.
pub(crate) const REMEMBERED: usize = 1 << 16;

/// The last [`REMEMBERED`] attempts finished here (or more recently, the oldest first
/// forgotten).
#[derive(Debug)]
pub(crate) struct FinishedAttempts {
    known: BTreeSet<AttemptRef>,
    order: VecDeque<AttemptRef>,
    limit: usize,
}

impl Default for FinishedAttempts {
    fn default() -> Self {
        FinishedAttempts::with_limit(REMEMBERED)
    }
}

impl FinishedAttempts {
    fn with_limit(limit: usize) -> Self {
        FinishedAttempts {
            known: BTreeSet::new(),
            order: VecDeque::new(),
            limit,
        }
    }

    /// `attempt` ended here (or in a previous life of this agent).
    pub(crate) fn insert(&mut self, attempt: AttemptRef) {
        if !self.known.insert(attempt) {
            return;
        }
        self.order.push_back(attempt);
        while self.order.len() > self.limit {
            if let Some(oldest) = self.order.pop_front() {
                self.known.remove(&oldest);
            }
        }
    }

    /// Whether `attempt` ended here: it is never started again.
    pub(crate) fn contains(&self, attempt: &AttemptRef) -> bool {
        self.known.contains(attempt)
    }
}

impl FromIterator<AttemptRef> for FinishedAttempts {
    fn from_iter<I: IntoIterator<Item = AttemptRef>>(attempts: I) -> Self {
        let mut finished = FinishedAttempts::default();
        for attempt in attempts {
            finished.insert(attempt);
        }
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    fn attempt(task: u64, number: u32) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(number),
        }
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_limit_and_a_repeat_is_kept_once() {
        let mut finished = FinishedAttempts::with_limit(3);
        for task in 1..=3 {
            finished.insert(attempt(task, 1));
        }
        finished.insert(attempt(2, 1));
        assert_eq!(finished.order.len(), 3, "a repeat takes no room");
        finished.insert(attempt(4, 1));
        assert!(!finished.contains(&attempt(1, 1)), "the oldest went first");
        for task in 2..=4 {
            assert!(finished.contains(&attempt(task, 1)));
        }
        assert_eq!(finished.known.len(), 3);
    }

    #[test]
    fn the_ends_of_a_previous_life_are_remembered() {
        let finished: FinishedAttempts = [attempt(7, 2), attempt(8, 1)].into_iter().collect();
        assert!(finished.contains(&attempt(7, 2)) && finished.contains(&attempt(8, 1)));
    }
}
