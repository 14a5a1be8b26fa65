//! The log route: a task's log from a byte offset, streamed live with `follow`. Either
//! way the file is read in steps of [`LOG_READ_STEP`] as the client takes them, so a
//! reader costs the server one step of memory, however large the log.

use std::sync::Arc;

use super::prelude::*;

/// Bytes read from a log file per step while streaming.
const LOG_READ_STEP: usize = 256 * 1024;

#[derive(Debug, Deserialize)]
pub(super) struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
    /// Without `follow`: at most this many bytes (else to the end the log has now).
    #[serde(default)]
    limit: Option<u64>,
}

/// The task's log from a byte offset. With `follow`, the response streams new output
/// until the task has ended and everything was sent; a client that loses the
/// connection resumes by asking again from the offset it reached.
pub(super) async fn task_logs(
    State(app): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<LogQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // A follower is re-authenticated while it waits, so revoking its token ends it.
    let credential = headers.get(axum::http::header::AUTHORIZATION).cloned();
    let task = TaskId(id);
    super::tasks::load(&app.control, task).await?;
    let control = app.control.clone();
    if !query.follow {
        let size = control.logs.len(task).map_err(|e| {
            ServerError::Internal(format!("cannot read the log of task {task}: {e}"))
        })?;
        let start = query.offset.min(size);
        let end = query
            .limit
            .map_or(size, |limit| start.saturating_add(limit).min(size));
        let mut response = Body::from_stream(log_range(control, task, start, end)).into_response();
        super::headers::as_plain_text(&mut response);
        response
            .headers_mut()
            .insert(tacc_proto::LOG_OFFSET_HEADER, HeaderValue::from(end));
        return Ok(response);
    }
    let shutdown = app.shutdown.clone();
    let stream = futures::stream::unfold((query.offset, false), move |(offset, done)| {
        let control = control.clone();
        let shutdown = shutdown.clone();
        let credential = credential.clone();
        async move {
            if done {
                return None;
            }
            let watcher = control.logs.watcher(task);
            loop {
                let notified = watcher.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let data = match control.logs.read(task, offset, LOG_READ_STEP) {
                    Ok(data) => data,
                    Err(e) => return Some((Err(std::io::Error::other(e)), (offset, true))),
                };
                if !data.is_empty() {
                    let next = offset + data.len() as u64;
                    return Some((Ok(Bytes::from(data)), (next, false)));
                }
                let finished = match control.query().task(task).await {
                    Ok(Some(record)) => record.state.is_terminal(),
                    _ => true,
                };
                if finished {
                    // One last read: output may have landed between the read and the check.
                    let tail = control
                        .logs
                        .read(task, offset, LOG_READ_STEP)
                        .unwrap_or_default();
                    if tail.is_empty() {
                        return None;
                    }
                    let next = offset + tail.len() as u64;
                    return Some((Ok(Bytes::from(tail)), (next, false)));
                }
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => return None,
                }
                if control
                    .auth
                    .authenticate(credential.as_ref(), crate::now())
                    .await
                    .is_err()
                {
                    return None;
                }
            }
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    super::headers::as_plain_text(&mut response);
    response.headers_mut().insert(
        tacc_proto::LOG_OFFSET_HEADER,
        HeaderValue::from(query.offset),
    );
    Ok(response)
}

/// The bytes `start..end` of a task's log, a step at a time (read off the runtime).
fn log_range(
    control: Arc<Control>,
    task: TaskId,
    start: u64,
    end: u64,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> {
    futures::stream::try_unfold(start, move |offset| {
        let control = control.clone();
        async move {
            if offset >= end {
                return Ok(None);
            }
            let step =
                usize::try_from(end - offset).map_or(LOG_READ_STEP, |left| left.min(LOG_READ_STEP));
            let data = tokio::task::spawn_blocking(move || control.logs.read(task, offset, step))
                .await
                .map_err(std::io::Error::other)??;
            if data.is_empty() {
                // The file is shorter than it was a moment ago: it cannot be, but a
                // response that ends early is better than one that never ends.
                return Ok(None);
            }
            let next = offset + data.len() as u64;
            Ok(Some((Bytes::from(data), next)))
        }
    })
}
