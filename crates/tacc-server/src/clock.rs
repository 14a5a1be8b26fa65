//! The control plane's time, behind one trait: wall-clock timestamps for what is stored
//! (submitted, started, ended) and a monotonic instant for what is measured between events
//! (heartbeat silence, backoffs, flapping windows). The server runs on [`SystemClock`];
//! the lifecycle tests run on a [`ManualClock`] they move forward by hand, so a heartbeat
//! timeout, a stalled server or a retry backoff is a step of a test, not a wait.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tacc_core::Timestamp;

pub trait Clock: Send + Sync + Debug {
    /// Wall-clock time, as stored.
    fn now(&self) -> Timestamp;
    /// Monotonic time, for durations between events.
    fn instant(&self) -> Instant;
    /// Monotonic time passed since `earlier`.
    fn since(&self, earlier: Instant) -> Duration {
        self.instant().saturating_duration_since(earlier)
    }
}

/// The machine's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        wall_now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

pub(crate) fn wall_now() -> Timestamp {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Timestamp(millis)
}

/// A clock that moves only when told to: both its times advance together.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    wall_start: Timestamp,
    passed: Mutex<Duration>,
}

impl ManualClock {
    pub fn new(wall_start: Timestamp) -> ManualClock {
        ManualClock {
            start: Instant::now(),
            wall_start,
            passed: Mutex::new(Duration::ZERO),
        }
    }

    pub fn advance(&self, by: Duration) {
        *self.passed.lock().expect("clock lock") += by;
    }

    fn passed(&self) -> Duration {
        *self.passed.lock().expect("clock lock")
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.wall_start.0 + self.passed().as_millis() as u64)
    }

    fn instant(&self) -> Instant {
        self.start + self.passed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_both_times_together() {
        let clock = ManualClock::new(Timestamp(1_000));
        let (wall, mono) = (clock.now(), clock.instant());
        assert_eq!((clock.now(), clock.instant()), (wall, mono));
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), Timestamp(2_500));
        assert_eq!(clock.since(mono), Duration::from_millis(1_500));
    }

    #[test]
    fn the_system_clock_is_monotonic_and_near_the_wall() {
        let clock = SystemClock;
        let before = clock.instant();
        assert!(clock.instant() >= before);
        assert!(clock.now().0.abs_diff(wall_now().0) < 60_000);
    }
}
