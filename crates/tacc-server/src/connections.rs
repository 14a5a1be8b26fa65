//! The HTTP listener and the bounds on its connections, for plain HTTP and HTTPS alike.
//!
//! `axum::serve` keeps a connection open for as long as its client likes: a client that
//! connects and says nothing, or sends its request head one byte a minute (slowloris),
//! holds a task and a file descriptor forever, and enough of them exhaust the server. Here
//! every connection is bounded:
//!
//! - **header timeout**: once the first byte of a request arrives, its head (request line
//!   and headers) must be complete within [`ConnectionLimits::header_timeout`];
//! - **idle timeout**: a connection with no request in progress — a fresh one, or a
//!   kept-alive one between requests — is closed after [`ConnectionLimits::idle_timeout`];
//! - **maximum connections**: at most [`ConnectionLimits::max_connections`] are open at
//!   once (TLS handshakes in progress included); past it the listener stops accepting
//!   until one closes, and the kernel's backlog holds the newcomers.
//!
//! A request being handled (a long poll, a followed log, an upload) is bounded by neither
//! timeout. The phases are seen from the bytes the connection reads ([`Watched`]) and the
//! requests the service is handling ([`Phase`]); the limits are the same semantics as Go's
//! `ReadHeaderTimeout` and `IdleTimeout`. Each request carries the peer's address as
//! axum's `ConnectInfo`, for per-source limits.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::tls::TlsConfig;

/// How long, how idle and how many connections the listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From a request's first byte to the end of its head.
    pub header_timeout: Duration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// Connections open at once (TLS handshakes included).
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
        }
    }
}

/// Serve `app` on `listener` (in TLS when `tls` is given) within `limits` until `shutdown`
/// is cancelled; then stop accepting, let each connection finish the request it is
/// handling, and return once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsConfig>,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let acceptor = tls.map(|tls| tls.acceptor());
    loop {
        // Forget the connections that ended (a join set keeps them until asked).
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::error!("cannot accept a connection: {e}");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        crate::set_nodelay(&tcp);
        let app = app.clone();
        let shutdown = shutdown.clone();
        let acceptor = acceptor.clone();
        connections.spawn(async move {
            let _permit = permit;
            match acceptor {
                None => connection(tcp, peer, app, limits, shutdown).await,
                Some(acceptor) => match crate::tls::handshake(&acceptor, tcp).await {
                    Ok(Some(tls)) => connection(tls, peer, app, limits, shutdown).await,
                    Ok(None) => {}
                    Err(e) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                },
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One connection, until it ends, breaks a limit, or the server shuts down.
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let watched = TokioIo::new(Watched {
        inner: io,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let busy = activity.begin_request();
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(axum::body::Body::new)).await;
                // The request counts as in progress until its response body is written.
                response.map(|response| {
                    response.map(|body| axum::body::Body::new(Tracked { body, _busy: busy }))
                })
            }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        // Ours above, with Go's semantics; hyper's would also count idle time.
        .header_read_timeout(None)
        .serve_connection(watched, service)
        .with_upgrades();
    tokio::pin!(served);
    let mut closing = false;
    loop {
        tokio::select! {
            ended = served.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!("connection from {peer} ended: {e}");
                }
                return;
            }
            why = activity.limit_reached(limits) => {
                tracing::debug!("closing the connection from {peer}: {why}");
                return;
            }
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Where a connection stands, as far as its timeouts go.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// No request in progress since then.
    Idle(Instant),
    /// A request's first byte arrived then; its head is not complete yet.
    Head(Instant),
    /// This many requests are being handled (their responses not yet written).
    Busy(usize),
}

#[derive(Debug)]
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().expect("phase lock poisoned") = phase;
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection has started a request.
    fn bytes_read(&self) {
        let mut phase = self.phase.lock().expect("phase lock poisoned");
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A request's head was read; it is in progress until the guard is dropped.
    fn begin_request(self: &Arc<Self>) -> Busy {
        let phase = *self.phase.lock().expect("phase lock poisoned");
        self.set(match phase {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Idle(_) | Phase::Head(_) => Phase::Busy(1),
        });
        Busy(self.clone())
    }

    fn end_request(&self) {
        let phase = *self.phase.lock().expect("phase lock poisoned");
        self.set(match phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }

    /// When the current phase's limit runs out, and which limit it is.
    fn deadline(&self, limits: ConnectionLimits) -> Option<(Instant, &'static str)> {
        match *self.phase.lock().expect("phase lock poisoned") {
            Phase::Idle(since) => Some((since + limits.idle_timeout, "idle timeout")),
            Phase::Head(since) => Some((
                since + limits.header_timeout,
                "the request head took longer than the header timeout",
            )),
            Phase::Busy(_) => None,
        }
    }

    /// Resolves once the connection has broken one of its limits.
    async fn limit_reached(&self, limits: ConnectionLimits) -> &'static str {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the phase is read, so no change is missed in between.
            changed.as_mut().enable();
            match self.deadline(limits) {
                None => changed.await,
                Some((at, why)) => {
                    if at <= Instant::now() {
                        return why;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changed => {}
                    }
                }
            }
        }
    }
}

/// Marks a request in progress while it lives.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// A response body that keeps its request marked in progress until it is written.
struct Tracked {
    body: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's byte stream, telling its [`Activity`] when bytes arrive.
struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time, in milliseconds: a limit may not run out before its time (exact) and
    // must run out soon after (generous, for loaded machines).
    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(400),
            max_connections: 10,
        }
    }

    fn about(elapsed: Duration, limit: Duration) -> bool {
        elapsed >= limit && elapsed < limit + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn an_idle_connection_runs_out_after_the_idle_timeout() {
        let activity = Activity::new();
        let started = Instant::now();
        assert_eq!(activity.limit_reached(limits()).await, "idle timeout");
        assert!(about(started.elapsed(), limits().idle_timeout));
    }

    #[tokio::test]
    async fn a_started_head_runs_out_after_the_header_timeout() {
        let activity = Activity::new();
        let started = Instant::now();
        activity.bytes_read();
        let why = activity.limit_reached(limits()).await;
        assert!(why.contains("header timeout"), "{why}");
        assert!(about(started.elapsed(), limits().header_timeout));
    }

    #[tokio::test]
    async fn a_request_in_progress_is_bounded_by_neither_and_idles_after() {
        let activity = Arc::new(Activity::new());
        activity.bytes_read();
        let busy = activity.begin_request();
        let waiting = {
            let activity = activity.clone();
            tokio::spawn(async move { activity.limit_reached(limits()).await })
        };
        tokio::time::sleep(limits().idle_timeout * 3).await;
        assert!(!waiting.is_finished(), "a busy connection timed out");
        let ended = Instant::now();
        drop(busy);
        assert_eq!(waiting.await.unwrap(), "idle timeout");
        assert!(about(ended.elapsed(), limits().idle_timeout));
    }
}
