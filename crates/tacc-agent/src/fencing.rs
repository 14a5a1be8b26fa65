//! Self-fencing: a node cut off from the server stops its attempts itself before the
//! server may place them elsewhere, so an attempt never runs twice at once.
//!
//! The server declares a node lost after its heartbeat timeout `T` without contact and
//! only then retries the node's attempts. The agent renews its lease on every answer from
//! the server, polls at least every `T/4`, starts stopping its attempts after `T/3`
//! without an answer, and gives them at most `T/3` between SIGTERM and SIGKILL — so they
//! are gone before `T` has passed on the server's side.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The agent's side of the server's heartbeat lease.
#[derive(Debug)]
pub(crate) struct Lease {
    state: Mutex<LeaseState>,
}

#[derive(Debug, Clone, Copy)]
struct LeaseState {
    last_contact: Instant,
    /// The server's heartbeat timeout, once registered.
    term: Option<Duration>,
}

impl Lease {
    pub fn new(now: Instant) -> Lease {
        Lease {
            state: Mutex::new(LeaseState {
                last_contact: now,
                term: None,
            }),
        }
    }

    /// The server registered this node with heartbeat timeout `term`.
    pub fn granted(&self, term: Duration, now: Instant) {
        let mut state = self.state.lock().unwrap();
        state.term = Some(term);
        state.last_contact = now;
    }

    /// The server answered.
    pub fn renewed(&self, now: Instant) {
        self.state.lock().unwrap().last_contact = now;
    }

    /// How long the server has been silent, when that is long enough to fence.
    pub fn expired(&self, now: Instant) -> Option<Duration> {
        let state = *self.state.lock().unwrap();
        let silence = now.saturating_duration_since(state.last_contact);
        let term = state.term?;
        (silence > term / 3).then_some(silence)
    }

    /// The longest a poll may wait, so that a healthy node renews well within `T/3`.
    pub fn poll_wait(&self, configured: Duration) -> Duration {
        match self.state.lock().unwrap().term {
            Some(term) => configured.min(term / 4),
            None => configured,
        }
    }

    /// The longest grace between SIGTERM and SIGKILL an attempt may get, so that a fenced
    /// attempt is dead before the server retries it.
    pub fn cap_grace(&self, grace: Duration) -> Duration {
        match self.state.lock().unwrap().term {
            Some(term) => grace.min(term / 3),
            None => grace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_a_third_of_the_term_without_contact() {
        let start = Instant::now();
        let lease = Lease::new(start);
        // Before registration there is nothing to fence against.
        assert_eq!(lease.expired(start + Duration::from_secs(3600)), None);
        lease.granted(Duration::from_secs(30), start);
        assert_eq!(lease.expired(start + Duration::from_secs(9)), None);
        assert_eq!(
            lease.expired(start + Duration::from_secs(11)),
            Some(Duration::from_secs(11))
        );
        lease.renewed(start + Duration::from_secs(11));
        assert_eq!(lease.expired(start + Duration::from_secs(15)), None);
    }

    #[test]
    fn polls_and_grace_fit_in_the_term() {
        let lease = Lease::new(Instant::now());
        assert_eq!(
            lease.poll_wait(Duration::from_secs(20)),
            Duration::from_secs(20)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        lease.granted(Duration::from_secs(30), Instant::now());
        assert_eq!(
            lease.poll_wait(Duration::from_secs(20)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(60)),
            Duration::from_secs(10)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        // Fencing starts after T/3 and ends T/3 later at the latest: before T.
        let fenced_by = Duration::from_secs(30) / 3 + lease.cap_grace(Duration::from_secs(600));
        assert!(fenced_by < Duration::from_secs(30));
    }
}
