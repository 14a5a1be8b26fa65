//! The shell of the hang check (`handlers::hangs`): it reads the watched attempts'
//! records and their ranks' last signs of life, then lets the handler end the hung ones.

use super::effects::Effects;
use super::handlers::hangs::{self, Watched};
use super::{Control, Core};
use crate::ServerError;

impl Control {
    /// End the attempts found hung now.
    pub(super) async fn end_hung_attempts(&self, inner: &mut Core) -> Result<(), ServerError> {
        let mut watched = Vec::new();
        for attempt in hangs::watched(inner, &self.config) {
            if let Some(record) = self.facts.task_record(attempt.task).await? {
                watched.push(Watched {
                    attempt,
                    record,
                    alive_at: self.usage.alive_ranks(attempt),
                });
            }
        }
        if watched.is_empty() {
            return Ok(());
        }
        let mut fx = Effects::default();
        hangs::on_hang_check(inner, &mut fx, &self.config, self.clock.now(), watched);
        self.carry(inner, fx).await
    }
}
