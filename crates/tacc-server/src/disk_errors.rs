//! The one place where a failed read or write of the server's own files (task logs,
//! outputs, chunks, key and token files) becomes a [`ServerError`]: a full disk or an
//! exhausted quota is [`ServerError::StorageFull`] (507 Insufficient Storage, with what
//! to do), anything else an internal error (500). The store maps its own errors the same
//! way ([`tacc_store::StoreError::storage_fault`]), so every write route answers 507 for
//! a full disk, never 500 and never an empty reply.

use std::fmt::Display;
use std::io;

use crate::ServerError;

/// `ENOSPC` and `EDQUOT` (the same numbers on every Linux architecture).
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// Whether `error` says the disk (or the account's quota on it) is full.
pub(crate) fn is_disk_full(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || matches!(error.raw_os_error(), Some(ENOSPC | EDQUOT))
}

impl ServerError {
    /// The error of an I/O failure while doing `what` (e.g. "cannot store output
    /// `model.pt` of task 7").
    pub(crate) fn io(what: impl Display, error: io::Error) -> ServerError {
        if is_disk_full(&error) {
            ServerError::StorageFull(format!("{what}: {error}"))
        } else {
            ServerError::Internal(format!("{what}: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn a_full_disk_is_507_and_other_failures_500() {
        let full = ServerError::io("cannot store x", io::Error::from_raw_os_error(ENOSPC));
        assert_eq!(full.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert!(full.to_string().contains("out of disk space"), "{full}");
        let quota = ServerError::io("x", io::Error::from_raw_os_error(EDQUOT));
        assert_eq!(quota.status(), StatusCode::INSUFFICIENT_STORAGE);
        let denied = ServerError::io("x", io::Error::from_raw_os_error(13));
        assert_eq!(denied.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
