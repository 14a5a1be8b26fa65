//! Refusing a request whose body has not been read. A server that answers before reading
//! an upload and then closes the connection races the client still sending it: the client
//! may see the connection reset instead of the answer (`connection closed before message
//! completed`), and a clear refusal becomes a network error. So a refused request's body is
//! read and dropped first — a bounded amount, for a bounded time, so a refusal cannot be
//! made to read a large upload.

use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;

/// Most of a refused body read before answering anyway.
const MAX_DRAINED_BYTES: usize = 1 << 20;
/// Longest a refusal waits for the body.
const MAX_DRAIN_TIME: Duration = Duration::from_secs(1);

/// Read and drop what `body` sends, up to the bounds above.
pub(super) async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut read = 0usize;
    let _ = tokio::time::timeout(MAX_DRAIN_TIME, async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > MAX_DRAINED_BYTES {
                break;
            }
        }
    })
    .await;
}
