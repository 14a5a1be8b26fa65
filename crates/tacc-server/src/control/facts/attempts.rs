//! What a running or restored attempt is made of: the ranks of a multi-node attempt that
//! already ended, and the wait a retried task still serves.

use std::collections::BTreeMap;

use tacc_core::Timestamp;
use tacc_store::TaskRecord;

use super::Facts;
use crate::ServerError;
use crate::control::retry::{RetrySettings, not_before};

impl Facts {
    /// The node ranks of `record`'s attempt that already ended successfully, and when
    /// (multi-node attempts only; a single rank's end ends the attempt).
    pub(crate) async fn finished_ranks_of(
        &self,
        record: &TaskRecord,
    ) -> Result<BTreeMap<u32, Timestamp>, ServerError> {
        if record.placements.len() < 2 {
            return Ok(BTreeMap::new());
        }
        Ok(self
            .store
            .rank_ends(record.id, record.attempt)
            .await?
            .into_iter()
            .filter(|end| end.failure.is_none())
            .map(|end| (end.rank, end.at))
            .collect())
    }

    /// The wait a queued task restored after a restart still has to serve, if any.
    pub(crate) async fn retry_wait(
        &self,
        record: &TaskRecord,
        settings: &RetrySettings,
    ) -> Result<Option<Timestamp>, ServerError> {
        if record.attempt.0 < 2 {
            return Ok(None);
        }
        Ok(not_before(
            &self.store.task_events(record.id).await?,
            settings,
        ))
    }
}
