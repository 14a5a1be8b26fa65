//! Per-user limits that keep one user's flood from slowing anyone else: a token bucket
//! on submissions (429 with `Retry-After` when empty) and a cap on queued tasks. The
//! buckets live in memory; a restart refills them, which errs on the side of the user.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tacc_core::TaskState;
use tacc_store::{Store, TaskFilter};

use crate::auth::UserCaller;
use crate::{Control, ServerError};

/// What each user may do; `taccd server --submit-rate/--submit-burst/--max-queued/--max-log`.
#[derive(Debug, Clone, PartialEq)]
pub struct UserLimits {
    /// Submissions per second a user may sustain.
    pub submit_rate: f64,
    /// Submissions a user may make at once after being idle.
    pub submit_burst: u32,
    /// Queued tasks a user may have at once.
    pub max_queued: u32,
    /// Bytes of log kept per task; past it the log says it was truncated.
    pub max_log_bytes: u64,
}

impl Default for UserLimits {
    fn default() -> Self {
        UserLimits {
            submit_rate: 500.0,
            submit_burst: 5_000,
            max_queued: 10_000,
            max_log_bytes: 1 << 30,
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets per user.
#[derive(Debug, Default)]
pub struct SubmitBuckets {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl SubmitBuckets {
    /// Take one submission from `user`'s bucket, or say when to try again.
    pub fn take(&self, user: &str, limits: &UserLimits, now: Instant) -> Result<(), ServerError> {
        let mut buckets = self.buckets.lock().unwrap();
        let burst = f64::from(limits.submit_burst.max(1));
        let bucket = buckets.entry(user.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * limits.submit_rate).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = if limits.submit_rate > 0.0 {
            ((1.0 - bucket.tokens) / limits.submit_rate).ceil() as u64
        } else {
            60
        };
        Err(ServerError::TooManyRequests {
            message: format!(
                "user {user} submits faster than {} task(s)/s (bursts of {}); slow down, or \
                 submit an array of tasks in one request",
                limits.submit_rate, limits.submit_burst
            ),
            retry_after_secs: wait.max(1),
        })
    }
}

/// The per-user gate in front of every submission: the rate limit, then the cap on
/// queued tasks.
#[derive(Debug, Clone)]
pub(crate) struct SubmissionGate {
    store: Arc<dyn Store>,
    limits: UserLimits,
    buckets: Arc<SubmitBuckets>,
}

impl SubmissionGate {
    /// The gate of `control`'s store and configured limits, with full buckets.
    pub(crate) fn of(control: &Control) -> SubmissionGate {
        SubmissionGate {
            store: control.store.clone(),
            limits: control.config.limits.clone(),
            buckets: Arc::default(),
        }
    }

    /// One submission of one task.
    pub(crate) async fn admit(&self, user: &UserCaller) -> Result<(), ServerError> {
        self.admit_tasks(user, 1).await
    }

    /// Admit one submission of `tasks` tasks (an array is one submission of many).
    pub(crate) async fn admit_tasks(
        &self,
        user: &UserCaller,
        tasks: u64,
    ) -> Result<(), ServerError> {
        let limits = &self.limits;
        self.buckets.take(&user.name, limits, Instant::now())?;
        let queued = self
            .store
            .count_tasks(&TaskFilter {
                states: vec![TaskState::Queued],
                user: Some(user.name.clone()),
                ..Default::default()
            })
            .await?;
        if queued + tasks > u64::from(limits.max_queued) {
            let message = if tasks > 1 {
                format!(
                    "user {} has {queued} queued tasks; {tasks} more would pass the {} this \
                     cluster allows: submit a smaller array, or wait for some to start",
                    user.name, limits.max_queued
                )
            } else {
                format!(
                    "user {} already has {queued} queued tasks, the most this cluster allows; \
                     wait for some to start or cancel some",
                    user.name
                )
            };
            return Err(ServerError::TooManyRequests {
                message,
                retry_after_secs: 30,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate_per_user() {
        let limits = UserLimits {
            submit_rate: 2.0,
            submit_burst: 3,
            ..UserLimits::default()
        };
        let buckets = SubmitBuckets::default();
        let start = Instant::now();
        for _ in 0..3 {
            buckets.take("alice", &limits, start).unwrap();
        }
        let refused = buckets.take("alice", &limits, start).unwrap_err();
        assert!(matches!(
            refused,
            ServerError::TooManyRequests {
                retry_after_secs: 1,
                ..
            }
        ));
        buckets.take("bob", &limits, start).unwrap();
        buckets
            .take("alice", &limits, start + Duration::from_millis(500))
            .unwrap();
        assert!(
            buckets
                .take("alice", &limits, start + Duration::from_millis(500))
                .is_err()
        );
    }
}
