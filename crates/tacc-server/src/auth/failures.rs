//! Failed authentications, limited per source address: a token bucket per IP that holds
//! `--auth-failure-limit` failures and refills at that many per minute. Past it, a failed
//! authentication is answered 429 with `Retry-After` instead of 401.
//!
//! Only failures draw from the bucket: a request whose credential is valid is served
//! whatever its address did, so an attacker behind the same NAT as real users cannot
//! lock them out. (Tokens are 256-bit random values: the limit is about the cost of a
//! flood, not about guessing.) The table is bounded: past [`CAPACITY`] addresses, those
//! whose buckets have refilled are forgotten, and while it is still full a new address
//! is not tracked (it is still audited, aggregated, by the audit trail).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Source addresses tracked at most.
const CAPACITY: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct FailureLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl FailureLimiter {
    pub fn new(per_minute: u32) -> Self {
        FailureLimiter {
            per_minute: per_minute.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn capacity(&self) -> f64 {
        f64::from(self.per_minute)
    }

    fn rate_per_sec(&self) -> f64 {
        f64::from(self.per_minute) / 60.0
    }

    fn refilled(&self, bucket: Bucket, now: Instant) -> Bucket {
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        Bucket {
            tokens: (bucket.tokens + elapsed * self.rate_per_sec()).min(self.capacity()),
            at: now,
        }
    }

    /// Count one failed authentication from `source` at `now`: `Ok` while it is within
    /// the limit, else how long until the next one would be.
    pub fn fail(&self, source: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().expect("failure limiter poisoned");
        if !buckets.contains_key(&source) && buckets.len() >= CAPACITY {
            let full = self.capacity();
            buckets.retain(|_, bucket| self.refilled(*bucket, now).tokens < full);
            if buckets.len() >= CAPACITY {
                return Ok(());
            }
        }
        let bucket = buckets.entry(source).or_insert(Bucket {
            tokens: self.capacity(),
            at: now,
        });
        *bucket = self.refilled(*bucket, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / self.rate_per_sec();
        Err(Duration::from_secs_f64(wait.ceil().max(1.0)))
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.buckets.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn a_source_gets_its_limit_then_waits_and_others_are_not_affected() {
        let limiter = FailureLimiter::new(60);
        let start = Instant::now();
        for _ in 0..60 {
            limiter.fail(ip(1), start).unwrap();
        }
        assert_eq!(limiter.fail(ip(1), start), Err(Duration::from_secs(1)));
        limiter.fail(ip(2), start).unwrap();
        limiter
            .fail(ip(1), start + Duration::from_secs(1))
            .expect("one failure a second refills");
        assert!(limiter.fail(ip(1), start + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn the_table_stays_bounded_and_forgets_refilled_sources_first() {
        let limiter = FailureLimiter::new(2);
        let start = Instant::now();
        for n in 0..CAPACITY as u32 {
            limiter.fail(ip(n), start).unwrap();
        }
        // Still full of recent failures: a new source is not tracked.
        limiter.fail(ip(u32::MAX), start).unwrap();
        assert_eq!(limiter.tracked(), CAPACITY);
        // A minute later every bucket has refilled: they make room.
        limiter
            .fail(ip(u32::MAX), start + Duration::from_secs(60))
            .unwrap();
        assert_eq!(limiter.tracked(), 1);
    }
}
