//! The shell of the idle-GPU policy (`handlers::idle_gpus`): it reads the watched
//! attempts' records and their ranks' last busy GPU samples, then lets the handler warn
//! and act.

use super::effects::Effects;
use super::handlers::idle_gpus::{self, Watched};
use super::{Control, Core};
use crate::ServerError;

impl Control {
    /// Apply the idle-GPU policy now (nothing without one).
    pub(super) async fn apply_idle_gpu_policy(&self, inner: &mut Core) -> Result<(), ServerError> {
        let Some(policy) = self.config.idle_gpu.clone() else {
            return Ok(());
        };
        let mut watched = Vec::new();
        for attempt in idle_gpus::watched(inner) {
            if let Some(record) = self.facts.task_record(attempt.task).await? {
                watched.push(Watched {
                    attempt,
                    record,
                    busy_at: self.usage.gpu_busy_ranks(attempt),
                });
            }
        }
        if watched.is_empty() {
            return Ok(());
        }
        let mut fx = Effects::default();
        idle_gpus::on_idle_gpu_check(
            inner,
            &mut fx,
            &self.config,
            &policy,
            self.clock.now(),
            watched,
        );
        self.carry(inner, fx).await
    }
}
