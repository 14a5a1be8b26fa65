//! The audit trail: user, token, node and admin actions and refused requests, with time
//! and identity. Three kinds of entry, three ways in:
//!
//! - **Actions** ([`AuditTrail::commit`]): a secret set, a token created, a node
//!   registered… Their record is written, and awaited, *before* the action is done; when
//!   it cannot be written the action is not done and the request fails with a 5xx that
//!   blames the server. An action never takes effect without its record. (Should the
//!   action itself then fail, a second record says so.)
//! - **Refusals** ([`AuditTrail::refused`]): failed authentications and denied requests,
//!   the noise a flood makes. The first from each source in a window (`--audit-window`)
//!   is written at once, the rest are counted and written as one row when the window
//!   closes, so a flood of any size adds a bounded number of rows.
//! - **Best-effort notes** ([`AuditTrail::record_as`]): refused agent traffic. These go
//!   through a bounded queue to one background writer, so a flood costs the flooder, not
//!   the database writer everyone shares; entries past the queue's capacity are counted
//!   and the count is logged.
//!
//! Entries older than `--audit-retention` are deleted by a background loop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tacc_store::{NewAuditEntry, StorageFault, Store, StoreError};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::failures::FailureLimiter;
use super::policy::Caller;
use crate::ServerError;

/// Entries that may wait for the writer.
const QUEUE: usize = 4096;
/// Sources (address or identity) × action with an open window, at most.
const OPEN_WINDOWS: usize = 10_000;
/// The longest wait between two retention passes.
const PRUNE_AT_MOST_EVERY: Duration = Duration::from_secs(3600);

/// `taccd server --audit-retention/--auth-failure-limit/--audit-window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSettings {
    /// Entries older than this are deleted.
    pub retention: Duration,
    /// Failed authentications one source address may make per minute before 429.
    pub failures_per_minute: u32,
    /// The window over which refusals from one source are aggregated into one row.
    pub window: Duration,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            retention: Duration::from_secs(90 * 86_400),
            failures_per_minute: 60,
            window: Duration::from_secs(60),
        }
    }
}

/// Refusals of one source and action since the first of its window.
#[derive(Debug)]
struct Window {
    opened: Instant,
    actor: String,
    target: String,
    detail: String,
    /// Refusals after the first.
    more: u64,
}

#[derive(Debug, Default)]
struct Refusals {
    open: HashMap<(String, &'static str), Window>,
    /// Refusals not counted in any window because the table was full.
    untracked: u64,
}

#[derive(Debug)]
pub struct AuditTrail {
    store: Arc<dyn Store>,
    queue: mpsc::Sender<NewAuditEntry>,
    dropped: Arc<AtomicU64>,
    refusals: Arc<Mutex<Refusals>>,
    /// The per-address limit on failed authentications.
    failures: FailureLimiter,
    _stop: DropGuard,
}

impl AuditTrail {
    /// Start the writer, the window closer and the retention loop; they end when the
    /// trail is dropped.
    pub fn start(store: Arc<dyn Store>, settings: AuditSettings) -> Self {
        let (queue, entries) = mpsc::channel::<NewAuditEntry>(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let refusals = Arc::new(Mutex::new(Refusals::default()));
        let stop = CancellationToken::new();
        tokio::spawn(write_queued(store.clone(), entries, dropped.clone()));
        tokio::spawn(close_windows(
            refusals.clone(),
            queue.clone(),
            dropped.clone(),
            settings.window,
            stop.clone(),
        ));
        tokio::spawn(prune(store.clone(), settings.retention, stop.clone()));
        AuditTrail {
            store,
            queue,
            dropped,
            refusals,
            failures: FailureLimiter::new(settings.failures_per_minute),
            _stop: stop.drop_guard(),
        }
    }

    /// Write the record of `caller` doing `action` on `target`, before doing it: an error
    /// (which the handler returns, so the action is not done) when it cannot be written.
    pub async fn commit(
        &self,
        caller: &Caller,
        action: &str,
        target: String,
        detail: String,
    ) -> Result<(), ServerError> {
        self.commit_as(caller.audit_name(), action, target, detail)
            .await
    }

    pub async fn commit_as(
        &self,
        actor: String,
        action: &str,
        target: String,
        detail: String,
    ) -> Result<(), ServerError> {
        let entry = entry(actor, action, target, "ok", detail);
        self.store
            .append_audit(entry)
            .await
            .map_err(|e| unrecorded(action, e))
    }

    /// Commit the record of `caller` doing `action`, then do it (`run`); a failure of
    /// the action is noted in a second record.
    pub async fn audited<T>(
        &self,
        caller: &Caller,
        action: &str,
        target: String,
        detail: String,
        run: impl std::future::Future<Output = Result<T, ServerError>>,
    ) -> Result<T, ServerError> {
        self.commit(caller, action, target.clone(), detail).await?;
        let done = run.await;
        if let Err(error) = &done {
            self.failed(caller, action, target, error);
        }
        done
    }

    /// Note that an action whose record was committed then failed (best effort).
    pub fn failed(&self, caller: &Caller, action: &str, target: String, error: &ServerError) {
        self.enqueue(entry(
            caller.audit_name(),
            action,
            target,
            "failed",
            error.to_string(),
        ));
    }

    /// A refused request from `source` (an address, or an authenticated identity),
    /// aggregated per source and action over the window.
    pub fn refused(
        &self,
        source: &str,
        actor: String,
        action: &'static str,
        target: String,
        detail: String,
    ) {
        let mut refusals = self.refusals.lock().expect("refusals lock poisoned");
        if let Some(window) = refusals.open.get_mut(&(source.to_string(), action)) {
            window.more += 1;
            window.target = target;
            window.detail = detail;
            return;
        }
        if refusals.open.len() >= OPEN_WINDOWS {
            refusals.untracked += 1;
            return;
        }
        refusals.open.insert(
            (source.to_string(), action),
            Window {
                opened: Instant::now(),
                actor: actor.clone(),
                target: target.clone(),
                detail: detail.clone(),
                more: 0,
            },
        );
        drop(refusals);
        self.enqueue(entry(
            actor,
            action,
            target,
            "denied",
            format!("{detail} (from {source})"),
        ));
    }

    /// A presented credential was refused: audited (aggregated) per source address, and
    /// counted against the address's limit; `Err` with the wait once past it (429).
    pub fn failed_authentication(
        &self,
        peer: Option<IpAddr>,
        target: String,
        why: String,
    ) -> Result<(), Duration> {
        let source = peer.map_or_else(|| "an unknown address".to_string(), |ip| ip.to_string());
        self.refused(&source, "anonymous".into(), "auth.failed", target, why);
        match peer {
            Some(ip) => self.failures.fail(ip, Instant::now()),
            None => Ok(()),
        }
    }

    /// Record that `caller` did (or was refused) `action` on `target`, best effort.
    pub fn record(&self, caller: &Caller, action: &str, target: String, ok: bool, detail: String) {
        self.record_as(caller.audit_name(), action, target, ok, detail);
    }

    pub fn record_as(&self, actor: String, action: &str, target: String, ok: bool, detail: String) {
        let outcome = if ok { "ok" } else { "denied" };
        self.enqueue(entry(actor, action, target, outcome, detail));
    }

    fn enqueue(&self, entry: NewAuditEntry) {
        enqueue(&self.queue, &self.dropped, entry);
    }
}

fn entry(
    actor: String,
    action: &str,
    target: String,
    outcome: &str,
    detail: String,
) -> NewAuditEntry {
    NewAuditEntry {
        at: crate::now(),
        actor,
        action: action.to_string(),
        target,
        outcome: outcome.to_string(),
        detail,
    }
}

fn enqueue(queue: &mpsc::Sender<NewAuditEntry>, dropped: &AtomicU64, entry: NewAuditEntry) {
    if queue.try_send(entry).is_err() {
        dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The error of an action whose audit record could not be written: the server's fault.
fn unrecorded(action: &str, error: StoreError) -> ServerError {
    let why = format!("the audit record of `{action}` could not be written, so it was not done");
    match error.storage_fault() {
        Some(StorageFault::Full) => ServerError::StorageFull(format!("{why}: {error}")),
        _ => ServerError::Unavailable(format!(
            "{why} ({error}); this is the server's fault, not your request's: retry, and \
             tell its operator if it persists"
        )),
    }
}

async fn write_queued(
    store: Arc<dyn Store>,
    mut entries: mpsc::Receiver<NewAuditEntry>,
    dropped: Arc<AtomicU64>,
) {
    while let Some(entry) = entries.recv().await {
        if let Err(e) = store.append_audit(entry).await {
            tracing::error!("cannot write the audit trail: {e}");
        }
        let skipped = dropped.swap(0, Ordering::Relaxed);
        if skipped > 0 {
            tracing::warn!("{skipped} audit entries were dropped: the trail's queue was full");
        }
    }
}

/// Write one row for each window that closed with refusals after its first.
async fn close_windows(
    refusals: Arc<Mutex<Refusals>>,
    queue: mpsc::Sender<NewAuditEntry>,
    dropped: Arc<AtomicU64>,
    window: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(
        (window / 4).clamp(Duration::from_millis(100), Duration::from_secs(15)),
    );
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let (closed, untracked) = {
            let mut refusals = refusals.lock().expect("refusals lock poisoned");
            let now = Instant::now();
            let mut closed = Vec::new();
            refusals.open.retain(|(source, action), open| {
                if now.duration_since(open.opened) < window {
                    return true;
                }
                if open.more > 0 {
                    closed.push(entry(
                        std::mem::take(&mut open.actor),
                        action,
                        std::mem::take(&mut open.target),
                        "denied",
                        format!(
                            "{} more from {source} within {}s of the first (the last: {})",
                            open.more,
                            window.as_secs(),
                            open.detail
                        ),
                    ));
                }
                false
            });
            (closed, std::mem::take(&mut refusals.untracked))
        };
        for row in closed {
            enqueue(&queue, &dropped, row);
        }
        if untracked > 0 {
            enqueue(
                &queue,
                &dropped,
                entry(
                    "anonymous".into(),
                    "refused",
                    "(many sources)".into(),
                    "denied",
                    format!(
                        "{untracked} refused request(s) from sources past the {OPEN_WINDOWS} \
                         the audit tracks at once"
                    ),
                ),
            );
        }
    }
}

/// Delete entries older than `retention`, at start and then regularly.
async fn prune(store: Arc<dyn Store>, retention: Duration, stop: CancellationToken) {
    let every = (retention / 10).clamp(Duration::from_secs(1), PRUNE_AT_MOST_EVERY);
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = crate::now();
        let cutoff = tacc_core::Timestamp(
            now.0
                .saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)),
        );
        match store.prune_audit(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "deleted {n} audit entries older than {}s (--audit-retention)",
                retention.as_secs()
            ),
            Err(e) => tracing::warn!("cannot prune the audit trail: {e}"),
        }
    }
}
