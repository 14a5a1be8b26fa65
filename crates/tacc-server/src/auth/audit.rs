//! The audit trail: user, token, node and admin actions and refused requests, with time
//! and identity. Entries are written by one background task through a bounded queue, so
//! a flood of refused requests costs the flooder, not the database writer everyone
//! shares; entries past the queue's capacity are counted and the count is logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tacc_store::{NewAuditEntry, Store};
use tokio::sync::mpsc;

use super::policy::Caller;

/// Entries that may wait for the writer.
const QUEUE: usize = 4096;

#[derive(Debug)]
pub struct AuditTrail {
    queue: mpsc::Sender<NewAuditEntry>,
    dropped: Arc<AtomicU64>,
}

impl AuditTrail {
    /// Start the writer; it ends when the trail is dropped.
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (queue, mut entries) = mpsc::channel::<NewAuditEntry>(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let lost = dropped.clone();
        tokio::spawn(async move {
            while let Some(entry) = entries.recv().await {
                if let Err(e) = store.append_audit(entry).await {
                    tracing::error!("cannot write the audit trail: {e}");
                }
                let skipped = lost.swap(0, Ordering::Relaxed);
                if skipped > 0 {
                    tracing::warn!(
                        "{skipped} audit entries were dropped: the trail's queue was full"
                    );
                }
            }
        });
        AuditTrail { queue, dropped }
    }

    /// Record that `caller` did (or was refused) `action` on `target`.
    pub fn record(&self, caller: &Caller, action: &str, target: String, ok: bool, detail: String) {
        self.record_as(caller.audit_name(), action, target, ok, detail);
    }

    pub fn record_as(&self, actor: String, action: &str, target: String, ok: bool, detail: String) {
        let entry = NewAuditEntry {
            at: crate::now(),
            actor,
            action: action.to_string(),
            target,
            outcome: if ok { "ok" } else { "denied" }.to_string(),
            detail,
        };
        if self.queue.try_send(entry).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
