//! How far a job has got when its speed can change while it runs. Progress is kept as
//! the time still to run *at the current speed*: with a constant speed that is exactly
//! the trace duration (so a static replay keeps the trace's numbers to the
//! millisecond), and a speed change rescales what is left — a job at half speed that
//! has 600 s left at that speed has 300 s left at full speed.

/// One job's progress. `version` changes whenever a scheduled end becomes stale, so the
/// replay can drop old timers lazily.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Time still to run at `speed`, counted from `since`.
    remaining_ms: u64,
    /// Fraction of full speed in force.
    speed: f64,
    /// When `remaining_ms` was last brought up to date.
    since: u64,
    pub version: u32,
}

impl Progress {
    /// A job that takes `duration_ms` at `speed` (its speed at its static request: the
    /// trace's duration is its run time at that allocation).
    pub fn new(duration_ms: u64, speed: f64) -> Progress {
        Progress {
            remaining_ms: duration_ms,
            speed,
            since: 0,
            version: 0,
        }
    }

    pub fn remaining_ms(&self) -> u64 {
        self.remaining_ms
    }

    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// Starts (or restarts) at `now` at `speed`; returns when it will end.
    pub fn start(&mut self, now: u64, speed: f64) -> u64 {
        self.since = now;
        self.rescale(speed);
        self.end()
    }

    /// The speed changes at `now` while it runs; returns the new end. The old end is
    /// stale from here (the version moves).
    pub fn change_speed(&mut self, now: u64, speed: f64) -> u64 {
        let ran = now.saturating_sub(self.since);
        self.remaining_ms = self.remaining_ms.saturating_sub(ran);
        self.since = now;
        self.rescale(speed);
        self.version += 1;
        self.end()
    }

    /// Told to stop at `now` with `grace_ms` to checkpoint: the work up to the signal is
    /// kept, the grace period is lost. Returns false (and changes nothing) when it will
    /// finish within the grace period anyway, so its end stands.
    pub fn preempt(&mut self, now: u64, grace_ms: u64) -> bool {
        let ran = now.saturating_sub(self.since);
        if self.remaining_ms <= ran + grace_ms {
            return false;
        }
        self.remaining_ms -= ran;
        self.since = now;
        self.version += 1;
        true
    }

    /// When it ends at the current speed.
    pub fn end(&self) -> u64 {
        self.since + self.remaining_ms
    }

    fn rescale(&mut self, speed: f64) {
        if speed != self.speed && self.remaining_ms > 0 {
            let scaled = (self.remaining_ms as f64 * self.speed / speed).round() as u64;
            // Work left is never rounded away: an end at `now` would fire twice.
            self.remaining_ms = scaled.max(1);
        }
        self.speed = speed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_a_constant_speed_a_job_takes_its_trace_duration() {
        let mut p = Progress::new(3_600_000, 0.5);
        assert_eq!(p.start(1000, 0.5), 3_601_000);
        assert_eq!(p.version, 0);
    }

    #[test]
    fn doubling_the_speed_halves_what_is_left() {
        let mut p = Progress::new(1_000_000, 0.5);
        p.start(0, 0.5);
        // 400 s run at half speed, 600 s left at half speed = 300 s at full speed.
        assert_eq!(p.change_speed(400_000, 1.0), 700_000);
        assert_eq!(p.remaining_ms(), 300_000);
        assert_eq!(p.version, 1);
        // Slowing down again stretches it back.
        assert_eq!(p.change_speed(500_000, 0.5), 500_000 + 400_000);
    }

    #[test]
    fn a_restart_at_another_speed_rescales_the_work_left() {
        let mut p = Progress::new(1_000_000, 0.5);
        p.start(0, 0.5);
        assert!(p.preempt(200_000, 30_000));
        assert_eq!(p.remaining_ms(), 800_000);
        // It was grown before the preemption; the new attempt runs at 0.8.
        assert_eq!(p.start(1_000_000, 0.8), 1_000_000 + 500_000);
    }

    #[test]
    fn a_job_that_ends_within_the_grace_period_keeps_its_end() {
        let mut p = Progress::new(100_000, 1.0);
        p.start(0, 1.0);
        assert!(!p.preempt(80_000, 30_000));
        assert_eq!(p.end(), 100_000);
        assert_eq!(p.version, 0);
    }
}
