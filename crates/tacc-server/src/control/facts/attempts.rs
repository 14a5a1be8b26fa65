//! What a running or restored attempt is made of: the ranks of a multi-node attempt that
//! already ended, the wait a retried task still serves, and the fair-share ledgers.
//!
//! What lets a restarted server carry on as if it had never stopped: facts that used to
//! live only in memory are kept in the store as they change — how each rank of a
//! multi-node attempt ended (with the change that records it), each group's fair-share
//! ledger and each node's last-seen time (at most once per liveness check, when they
//! changed: `handlers::liveness::RestartFacts`) — and read back here at start.

use std::collections::BTreeMap;

use tacc_core::Timestamp;
use tacc_proto::InputFile;
use tacc_store::{FairShareLedger, TaskRecord};

use super::Facts;
use crate::ServerError;
use crate::control::resume::resume_files;
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

    /// Every group's fair-share ledger as it was last kept (read back at a restart).
    pub(crate) async fn fairshare_ledgers(&self) -> Result<Vec<FairShareLedger>, ServerError> {
        Ok(self.store.load_fairshare().await?)
    }

    /// Every input of `record`'s current attempt: a pipeline stage's needed outputs, then
    /// the checkpoint it resumes from (`resume.rs`). The agent fetches them by their
    /// index here.
    pub(crate) async fn attempt_inputs(
        &self,
        record: &TaskRecord,
    ) -> Result<Vec<InputFile>, ServerError> {
        let mut inputs = self.stage_inputs(record).await?;
        if record.attempt.0 > 1 {
            let outputs = self.store.list_outputs(record.id).await?;
            inputs.extend(resume_files(record.attempt, outputs));
        }
        Ok(inputs)
    }
}
