//! Idempotency keys: the reply a mutating request got, kept under the key its client chose,
//! so that a retried request gets the same reply instead of doing the work again. A key is
//! committed in the same transaction as the work it acknowledges (`*_keyed` methods of
//! [`Store`](crate::Store)): a reply is never lost and work is never committed without its
//! key. Keys live [`KEY_LIFETIME_MS`]; an expired key may be used again.

use tacc_core::Timestamp;

use crate::{GroupRecord, StageRecord, TaskRecord};

/// How long a key is kept: 24 hours. A retry later than that is a new request.
pub const KEY_LIFETIME_MS: u64 = 24 * 3600 * 1000;

/// Who used which key on which route, for which request (its body's hash), and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    pub user: String,
    pub key: String,
    /// The route as declared, with the method (`POST /v1/tasks`).
    pub route: String,
    /// A hash of what identifies the request (its body, and path parameters).
    pub request_hash: String,
    pub created_at: Timestamp,
}

impl IdempotencyKey {
    /// Whether the key has outlived [`KEY_LIFETIME_MS`] at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.created_at.0.saturating_add(KEY_LIFETIME_MS) <= now.0
    }
}

/// A reply as sent: HTTP status and JSON body (opaque to the store).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReply {
    pub status: u16,
    pub body: serde_json::Value,
}

/// A key with the reply kept under it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptReply {
    pub key: IdempotencyKey,
    pub reply: StoredReply,
}

/// What the keyed work made, for the reply to name (ids are assigned inside the
/// transaction, so the reply is rendered there too).
#[derive(Debug, Clone, Copy)]
pub enum Created<'a> {
    Task(&'a TaskRecord),
    Group(&'a GroupRecord, &'a [TaskRecord]),
    /// The pipeline group, its stages by position, and every task made.
    Pipeline(&'a GroupRecord, &'a [StageRecord], &'a [TaskRecord]),
}

/// Renders the reply from what the work made; called once, inside the transaction.
pub type RenderReply = Box<dyn for<'a> FnOnce(Created<'a>) -> StoredReply + Send>;

/// A key to commit with some work, and how to render the reply kept under it.
pub struct Keyed {
    pub key: IdempotencyKey,
    pub render: RenderReply,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed").field("key", &self.key).finish()
    }
}

impl Keyed {
    /// The key with the reply rendered for what its request created.
    pub(crate) fn kept(self, created: crate::Created<'_>) -> KeptReply {
        KeptReply {
            reply: (self.render)(created),
            key: self.key,
        }
    }
}

pub(crate) fn key_taken(key: &IdempotencyKey) -> crate::StoreError {
    crate::StoreError::AlreadyExists {
        what: "idempotency key",
        name: key.key.clone(),
    }
}
