//! The leader lease in either SQL store: the statements of [`crate::lease`] run on a pool.
//! The PostgreSQL store then remembers the epoch it holds for its fence; SQLite, one
//! process on one file, has no other replica to fence out.

use super::millis;
use crate::rows::lease_from_row;
use crate::statement::{Run, Statement};
use crate::{LeaderLease, LeaseClaim, Result};

pub(crate) async fn try_acquire(
    writer: &impl Run,
    claim: &LeaseClaim,
) -> Result<Option<LeaderLease>> {
    let acquire = Statement::new(crate::lease::ACQUIRE_SQL)
        .bind(&claim.holder)
        .bind(&claim.leader_url)
        .bind(millis(claim.expires_at()))
        .bind(millis(claim.now));
    let row = writer.fetch_optional(acquire).await?;
    row.as_ref().map(lease_from_row).transpose()
}

pub(crate) async fn renew(
    writer: &impl Run,
    claim: &LeaseClaim,
    epoch: u64,
) -> Result<Option<LeaderLease>> {
    let renew = Statement::new(crate::lease::RENEW_SQL)
        .bind(millis(claim.expires_at()))
        .bind(&claim.holder)
        .bind(epoch as i64);
    let row = writer.fetch_optional(renew).await?;
    row.as_ref().map(lease_from_row).transpose()
}

pub(crate) async fn current(reader: &impl Run) -> Result<Option<LeaderLease>> {
    let row = reader
        .fetch_optional(Statement::new(crate::lease::CURRENT_SQL))
        .await?;
    row.as_ref().map(lease_from_row).transpose()
}
