//! No answer before what it says is durable: every response — to users, agents and the
//! dashboard, reads included — waits for a store sync that began after its handler ran.
//!
//! This is the group commit of the control plane's shell. Handlers commit their changes
//! as they decide (each commit atomic, and safe from a crash of the process), but the
//! store does not `fsync` each one; the sync here makes everything committed so far
//! survive a power loss, and requests that finish while one sync runs share the next
//! ([`tacc_store::Store::sync`]). A read waits too: what it shows (a task's end, a node's
//! work) may have been committed by another request an instant before and must not be
//! seen, then lost. A sync with nothing new to sync returns at once.
//!
//! When the sync fails the answer is replaced by the storage fault (a 503 that names the
//! server's disk, never the request): the change may not survive, so it is not
//! acknowledged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use tacc_store::Store;

use crate::ServerError;
use crate::metrics::Metrics;

/// A sync in flight.
type Syncing<'a> = Pin<Box<dyn Future<Output = Result<(), ServerError>> + Send + 'a>>;

/// What makes the changes committed so far durable: the control plane's store, or a fake.
pub(crate) trait Durable: Send + Sync {
    fn sync(&self) -> Syncing<'_>;
}

/// The control plane's store, its syncs timed in the metrics.
pub(crate) struct StoreSync {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl StoreSync {
    pub(crate) fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> StoreSync {
        StoreSync { store, metrics }
    }
}

impl Durable for StoreSync {
    fn sync(&self) -> Syncing<'_> {
        Box::pin(async move {
            let syncing = Instant::now();
            let synced = self.store.sync().await;
            self.metrics.committed("sync", syncing.elapsed());
            Ok(synced?)
        })
    }
}

pub(super) async fn durable_answers(
    State(durable): State<Arc<dyn Durable>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    match durable.sync().await {
        Ok(()) => response,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use axum::Router;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    /// Holds every sync until `open` is notified; fails them when `fail` is set.
    #[derive(Default)]
    struct Gate {
        open: tokio::sync::Notify,
        fail: AtomicBool,
        syncs: AtomicU32,
    }

    impl Durable for Gate {
        fn sync(&self) -> Syncing<'_> {
            Box::pin(async move {
                self.open.notified().await;
                self.syncs.fetch_add(1, Ordering::SeqCst);
                if self.fail.load(Ordering::SeqCst) {
                    return Err(ServerError::StorageFull(
                        "no space left on the data volume".into(),
                    ));
                }
                Ok(())
            })
        }
    }

    fn app(gate: Arc<Gate>, handled: Arc<AtomicBool>) -> Router {
        Router::new()
            .route(
                "/v1/tasks",
                post(move || async move {
                    handled.store(true, Ordering::SeqCst);
                    "submitted"
                }),
            )
            .layer(axum::middleware::from_fn_with_state(
                gate as Arc<dyn Durable>,
                durable_answers,
            ))
    }

    fn submit() -> Request {
        Request::post("/v1/tasks").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn an_answer_waits_for_the_sync_after_its_handler() {
        let gate = Arc::new(Gate::default());
        let handled = Arc::new(AtomicBool::new(false));
        let answer = tokio::spawn(app(gate.clone(), handled.clone()).oneshot(submit()));
        // The handler has run (its change is committed) but nothing is answered yet.
        while !handled.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!answer.is_finished(), "answered before the sync");
        gate.open.notify_one();
        let response = answer.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(gate.syncs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_sync_acknowledges_nothing_and_blames_the_disk() {
        let gate = Arc::new(Gate::default());
        gate.fail.store(true, Ordering::SeqCst);
        gate.open.notify_one();
        let response = app(gate, Arc::new(AtomicBool::new(false)))
            .oneshot(submit())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INSUFFICIENT_STORAGE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("submitted"), "{text}");
    }
}
