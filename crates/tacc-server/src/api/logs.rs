//! The log route: a task's log from a byte offset, streamed live with `follow`.

use super::prelude::*;

/// Bytes read from a log file per step while streaming.
const LOG_READ_STEP: usize = 256 * 1024;

#[derive(Debug, Deserialize)]
pub(super) struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
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
        let data = control
            .logs
            .read(task, query.offset, usize::MAX)
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        let end = query.offset + data.len() as u64;
        let mut response = Body::from(data).into_response();
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
                let finished = match control.store.get_task(task).await {
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
    response.headers_mut().insert(
        tacc_proto::LOG_OFFSET_HEADER,
        HeaderValue::from(query.offset),
    );
    Ok(response)
}
