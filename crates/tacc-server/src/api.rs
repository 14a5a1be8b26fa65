//! HTTP routes of API v1. Handlers translate between wire types (`tacc-proto`) and the
//! control plane; they hold no state of their own.

use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use tacc_compiler::{ChunkHash, Manifest};
use tacc_core::{AttemptNo, NodeId, SnapshotId, TaskId, TaskState};
use tacc_proto::{
    AgentRegistered, AgentReports, ApiError, CancelReply, Health, OutputFile, RegisterAgent,
    SnapshotCommitted, SnapshotOffer, SnapshotOfferReply, SubmitReply, SubmitTask, TaskEventView,
    TaskView, WorkPoll,
};
use tacc_schema::TaskSpec;
use tacc_store::{OutputRecord, TaskFilter, TaskRecord};
use tokio_util::sync::CancellationToken;

use crate::{Control, ServerError};

/// Longest a work poll is held open before answering "no change".
const MAX_POLL_WAIT: Duration = Duration::from_secs(30);
/// Bytes read from a log file per step while streaming.
const LOG_READ_STEP: usize = 256 * 1024;
/// Largest chunk accepted (the chunker's maximum is far below this).
const MAX_CHUNK_BYTES: usize = 16 << 20;

#[derive(Clone)]
struct AppState {
    control: Arc<Control>,
    shutdown: CancellationToken,
}

pub fn router(control: Arc<Control>, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/tasks", post(submit).get(list_tasks))
        .route("/v1/tasks/{id}", get(get_task))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/tasks/{id}/cancel", post(cancel_task))
        .route("/v1/tasks/{id}/logs", get(task_logs))
        .route("/v1/tasks/{id}/instruction", get(task_instruction))
        .route("/v1/tasks/{id}/why", get(explain_task))
        .route("/v1/tasks/{id}/outputs", get(list_outputs))
        .route("/v1/tasks/{id}/outputs/{attempt}/{*path}", get(get_output))
        .route("/v1/snapshots/offer", post(offer_snapshot))
        .route("/v1/snapshots/commit", post(commit_snapshot))
        .route("/v1/snapshots/{id}", get(get_snapshot))
        .route("/v1/chunks/{hash}", put(put_chunk).get(get_chunk))
        .route("/v1/tasks/{id}/rerun", post(rerun_task))
        .route("/v1/datasets", get(list_datasets))
        .route("/v1/admin/gc", post(collect_garbage))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/agents/register", post(register_agent))
        .route("/v1/agents/{node}/work", post(agent_work))
        .route("/v1/agents/{node}/reports", post(agent_reports))
        .route(
            "/v1/agents/{node}/outputs/{task}/{attempt}/{*path}",
            put(put_output),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_CHUNK_BYTES))
        .with_state(AppState { control, shutdown })
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ServerError::TaskNotFound(_)
            | ServerError::NodeNotFound(_)
            | ServerError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ServerError::NodeNotRegistered(_) => (StatusCode::CONFLICT, "node_not_registered"),
            ServerError::InvalidTask(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_task"),
            ServerError::Unsupported(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unsupported"),
            ServerError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ServerError::Store(_) | ServerError::Internal(_) | ServerError::Config(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        let body = ApiError {
            code: code.into(),
            message: self.to_string(),
        };
        (status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ServerError>;

fn user_of(_headers: &HeaderMap) -> String {
    "anonymous".to_string()
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn task_view(control: &Control, record: TaskRecord) -> TaskView {
    let names = control.node_names().await;
    let spec: Option<TaskSpec> = serde_json::from_value(record.spec.clone()).ok();
    TaskView {
        id: record.id,
        name: record.name,
        user: record.user,
        state: record.state,
        reason: record.reason,
        exit_code: record.exit_code,
        attempt: record.attempt,
        max_attempts: spec.as_ref().map_or(1, |s| s.retry.max_attempts),
        nodes: record
            .placements
            .iter()
            .map(|p| {
                names
                    .get(&p.node)
                    .cloned()
                    .unwrap_or_else(|| format!("node-{}", p.node))
            })
            .collect(),
        gpus: record
            .placements
            .iter()
            .map(|p| p.gpu_indices.clone())
            .collect(),
        snapshot: record.snapshot,
        per_node: spec
            .as_ref()
            .map(|s| s.resources.per_node())
            .unwrap_or_default(),
        num_nodes: spec.as_ref().map_or(1, |s| s.resources.nodes),
        time_limit_secs: spec
            .as_ref()
            .and_then(|s| s.resources.time_limit.map(|t| t.as_secs())),
        submitted_at: record.submitted_at,
        started_at: record.started_at,
        finished_at: record.finished_at,
        cancel_requested: record.cancel_requested,
        source: record.source,
        estimated_start: if record.state == TaskState::Queued {
            control.estimated_start(record.id).await
        } else {
            None
        },
        spec: record.spec,
    }
}

async fn load(control: &Control, id: TaskId) -> ApiResult<TaskRecord> {
    control
        .store
        .get_task(id)
        .await?
        .ok_or(ServerError::TaskNotFound(id))
}

async fn submit(
    State(app): State<AppState>,
    headers: HeaderMap,
    Json(body): Json<SubmitTask>,
) -> ApiResult<(StatusCode, Json<SubmitReply>)> {
    let spec: TaskSpec = serde_json::from_value(body.spec)
        .map_err(|e| ServerError::InvalidTask(format!("the task spec is not valid: {e}")))?;
    let record = app
        .control
        .submit(&user_of(&headers), spec, body.snapshot, body.source)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitReply {
            task_id: record.id,
            state: record.state,
        }),
    ))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    /// Comma-separated states.
    state: Option<String>,
    user: Option<String>,
    limit: Option<u32>,
}

async fn list_tasks(
    State(app): State<AppState>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<TaskView>>> {
    let states = match &query.state {
        None => Vec::new(),
        Some(text) => text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<TaskState>()
                    .map_err(|e| ServerError::BadRequest(e.to_string()))
            })
            .collect::<Result<_, _>>()?,
    };
    let filter = TaskFilter {
        states,
        user: query.user,
        limit: query.limit,
    };
    let records = app.control.store.list_tasks(&filter).await?;
    let mut views = Vec::with_capacity(records.len());
    for record in records {
        views.push(task_view(&app.control, record).await);
    }
    Ok(Json(views))
}

async fn get_task(State(app): State<AppState>, Path(id): Path<u64>) -> ApiResult<Json<TaskView>> {
    let record = load(&app.control, TaskId(id)).await?;
    Ok(Json(task_view(&app.control, record).await))
}

async fn task_events(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<Vec<TaskEventView>>> {
    load(&app.control, TaskId(id)).await?;
    let events = app.control.store.task_events(TaskId(id)).await?;
    Ok(Json(
        events
            .into_iter()
            .map(|e| TaskEventView {
                at: e.at,
                attempt: e.attempt,
                state: e.state,
                reason: e.reason,
            })
            .collect(),
    ))
}

async fn cancel_task(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<CancelReply>> {
    let before = load(&app.control, TaskId(id)).await?;
    let after = app.control.cancel(TaskId(id)).await?;
    Ok(Json(CancelReply {
        task_id: after.id,
        state: after.state,
        changed: !before.state.is_terminal(),
    }))
}

async fn explain_task(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<tacc_proto::TaskExplanation>> {
    Ok(Json(app.control.explain(TaskId(id)).await?))
}

async fn task_instruction(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<serde_json::Value>> {
    let record = load(&app.control, TaskId(id)).await?;
    let spec: TaskSpec = serde_json::from_value(record.spec.clone())
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    let instruction = tacc_compiler::compile(
        record.id,
        record.attempt,
        &record.user,
        &spec,
        record.snapshot,
    );
    Ok(Json(
        serde_json::to_value(instruction).map_err(|e| ServerError::Internal(e.to_string()))?,
    ))
}

#[derive(Debug, Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
}

/// The task's log from a byte offset. With `follow`, the response streams new output
/// until the task has ended and everything was sent; a client that loses the
/// connection resumes by asking again from the offset it reached.
async fn task_logs(
    State(app): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<LogQuery>,
) -> ApiResult<Response> {
    let task = TaskId(id);
    load(&app.control, task).await?;
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

/// A path inside an output or snapshot tree: relative, no `..`, no empty parts.
fn safe_relative(path: &str) -> ApiResult<PathBuf> {
    let candidate = FsPath::new(path);
    let ok = !path.is_empty()
        && candidate
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(candidate.to_path_buf())
    } else {
        Err(ServerError::BadRequest(format!(
            "path `{path}` must be relative and stay inside the task's directory"
        )))
    }
}

async fn list_outputs(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<Vec<OutputFile>>> {
    load(&app.control, TaskId(id)).await?;
    let outputs = app.control.store.list_outputs(TaskId(id)).await?;
    Ok(Json(
        outputs
            .into_iter()
            .map(|o| OutputFile {
                path: o.path,
                size: o.size,
                attempt: o.attempt,
            })
            .collect(),
    ))
}

async fn get_output(
    State(app): State<AppState>,
    Path((id, attempt, path)): Path<(u64, u32, String)>,
) -> ApiResult<Response> {
    let relative = safe_relative(&path)?;
    let file = app
        .control
        .outputs_dir
        .join(id.to_string())
        .join(attempt.to_string())
        .join(relative);
    let opened = tokio::fs::File::open(&file).await.map_err(|_| {
        ServerError::NotFound(format!(
            "task {id} attempt {attempt} has no output `{path}`"
        ))
    })?;
    let length = opened.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(opened)).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_LENGTH,
        HeaderValue::from(length),
    );
    Ok(response)
}

/// Store one output file, streamed to disk (outputs such as checkpoints can be large).
async fn put_output(
    State(app): State<AppState>,
    Path((node, task, attempt, path)): Path<(u64, u64, u32, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    use futures::TryStreamExt;
    use tokio::io::AsyncWriteExt;

    app.control.touch(NodeId(node)).await;
    let relative = safe_relative(&path)?;
    load(&app.control, TaskId(task)).await?;
    let dir = app
        .control
        .outputs_dir
        .join(task.to_string())
        .join(attempt.to_string());
    let file = dir.join(&relative);
    let internal = |e: std::io::Error| {
        ServerError::Internal(format!("cannot store output `{path}` of task {task}: {e}"))
    };
    if let Some(parent) = file.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(internal)?;
    }
    let partial = file.with_extension("tacc-partial");
    let mut out = tokio::fs::File::create(&partial).await.map_err(internal)?;
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| ServerError::BadRequest(format!("the upload of `{path}` broke off: {e}")))?
    {
        size += chunk.len() as u64;
        out.write_all(&chunk).await.map_err(internal)?;
    }
    out.sync_all().await.map_err(internal)?;
    tokio::fs::rename(&partial, &file).await.map_err(internal)?;
    app.control
        .record_output(OutputRecord {
            task: TaskId(task),
            attempt: AttemptNo(attempt),
            path,
            size,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

fn manifest_of(value: serde_json::Value) -> ApiResult<Manifest> {
    let manifest: Manifest = serde_json::from_value(value)
        .map_err(|e| ServerError::BadRequest(format!("malformed manifest: {e}")))?;
    manifest
        .validate()
        .map_err(|e| ServerError::BadRequest(format!("rejected manifest: {e}")))?;
    Ok(manifest)
}

async fn offer_snapshot(
    State(app): State<AppState>,
    Json(offer): Json<SnapshotOffer>,
) -> ApiResult<Json<SnapshotOfferReply>> {
    let manifest = manifest_of(offer.manifest)?;
    let chunks = manifest.chunk_set();
    let store = app.control.chunk_store();
    // Touching what is present restarts its retention: the client will not send it, so
    // garbage collection must leave it for the commit that follows.
    let missing: Vec<String> = chunks
        .iter()
        .filter(|h| !store.touch(h))
        .map(|h| h.to_string())
        .collect();
    Ok(Json(SnapshotOfferReply {
        snapshot: manifest.id(),
        missing,
        chunks_total: chunks.len() as u64,
        total_bytes: manifest.total_bytes().as_bytes(),
    }))
}

/// Make a snapshot visible, only once every chunk it names is stored and verified.
async fn commit_snapshot(
    State(app): State<AppState>,
    Json(offer): Json<SnapshotOffer>,
) -> ApiResult<Json<SnapshotCommitted>> {
    let manifest = manifest_of(offer.manifest)?;
    let _no_gc_meanwhile = crate::artifacts::COMMIT_OR_COLLECT.read().await;
    check_chunks_stored(&app.control, &manifest)?;
    let id = manifest.id();
    // A resubmission of unchanged code commits a snapshot the server already has.
    if app.control.store.get_snapshot(&id).await?.is_some() {
        return Ok(Json(SnapshotCommitted { snapshot: id }));
    }
    let value =
        serde_json::to_value(&manifest).map_err(|e| ServerError::Internal(e.to_string()))?;
    app.control
        .store
        .put_snapshot(&id, &value, manifest.total_bytes().as_bytes(), crate::now())
        .await?;
    Ok(Json(SnapshotCommitted { snapshot: id }))
}

/// Every chunk the manifest names is stored (and so was verified against its hash when it
/// was written) and has the size the manifest claims for it.
fn check_chunks_stored(control: &Control, manifest: &Manifest) -> ApiResult<()> {
    let store = control.chunk_store();
    let mut missing = 0usize;
    for entry in &manifest.entries {
        let tacc_compiler::EntryKind::File { chunks, .. } = &entry.kind else {
            continue;
        };
        for chunk in chunks {
            match store.stored_size(&chunk.hash) {
                None => missing += 1,
                Some(size) if size != u64::from(chunk.size) => {
                    return Err(ServerError::BadRequest(format!(
                        "rejected manifest: file `{}` lists chunk {} as {} bytes, but that \
                         chunk is {size} bytes; the manifest is corrupt, scan the code again",
                        entry.path, chunk.hash, chunk.size
                    )));
                }
                Some(_) => {}
            }
        }
    }
    if missing > 0 {
        return Err(ServerError::BadRequest(format!(
            "{missing} chunk(s) of the snapshot have not been uploaded; offer the snapshot \
             again, upload the chunks it lists as missing, and commit again"
        )));
    }
    Ok(())
}

async fn get_snapshot(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let id: SnapshotId = id
        .parse()
        .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))?;
    let manifest = app.control.store.get_snapshot(&id).await?;
    manifest
        .map(Json)
        .ok_or_else(|| ServerError::NotFound(format!("snapshot {id} does not exist")))
}

fn chunk_hash(text: &str) -> ApiResult<ChunkHash> {
    text.parse()
        .map_err(|e| ServerError::BadRequest(format!("{e}")))
}

/// Store one chunk. A body sent with `Content-Encoding: zstd` is decompressed first; the
/// bytes must hash to the name, or nothing is stored.
async fn put_chunk(
    State(app): State<AppState>,
    Path(hash): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let hash = chunk_hash(&hash)?;
    let compressed = headers
        .get(axum::http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"zstd"));
    let bytes = if compressed {
        zstd::bulk::decompress(&body, MAX_CHUNK_BYTES)
            .map_err(|e| ServerError::BadRequest(format!("chunk {hash}: bad zstd data: {e}")))?
    } else {
        body.to_vec()
    };
    let control = app.control.clone();
    let stored = tokio::task::spawn_blocking(move || control.chunk_store().put(&hash, &bytes))
        .await
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    stored.map_err(|e| ServerError::BadRequest(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_chunk(State(app): State<AppState>, Path(hash): Path<String>) -> ApiResult<Vec<u8>> {
    let hash = chunk_hash(&hash)?;
    let path = app.control.chunk_store().path_of(&hash);
    tokio::fs::read(&path)
        .await
        .map_err(|_| ServerError::NotFound(format!("chunk {hash} does not exist")))
}

/// Submit a task again: same snapshot, spec, environment and datasets; a new task id.
async fn rerun_task(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> ApiResult<(StatusCode, Json<SubmitReply>)> {
    let record = app.control.rerun(TaskId(id), &user_of(&headers)).await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitReply {
            task_id: record.id,
            state: record.state,
        }),
    ))
}

async fn list_datasets(State(app): State<AppState>) -> Json<Vec<tacc_proto::DatasetView>> {
    Json(
        app.control
            .config
            .datasets
            .iter()
            .map(|(name, source)| tacc_proto::DatasetView {
                name: name.clone(),
                source: source.clone(),
            })
            .collect(),
    )
}

/// Run one chunk garbage-collection pass now (it also runs periodically).
async fn collect_garbage(State(app): State<AppState>) -> ApiResult<Json<tacc_proto::GcReport>> {
    let stats = app.control.collect_garbage().await?;
    Ok(Json(tacc_proto::GcReport {
        chunks_kept: stats.chunks_kept,
        chunks_removed: stats.chunks_removed,
        bytes_removed: stats.bytes_removed,
        temp_files_removed: stats.temp_files_removed,
    }))
}

async fn list_nodes(State(app): State<AppState>) -> Json<Vec<tacc_proto::NodeView>> {
    Json(app.control.node_views().await)
}

async fn register_agent(
    State(app): State<AppState>,
    Json(body): Json<RegisterAgent>,
) -> ApiResult<Json<AgentRegistered>> {
    let record = app.control.register_agent(body).await?;
    Ok(Json(AgentRegistered {
        node_id: record.id,
        heartbeat_timeout_ms: app.control.config.heartbeat_timeout.as_millis() as u64,
        node_token: None,
    }))
}

/// Long poll: answers at once when the node's work changed since `after`, otherwise when
/// it changes or the wait is over.
async fn agent_work(
    State(app): State<AppState>,
    Path(node): Path<u64>,
    Json(poll): Json<WorkPoll>,
) -> ApiResult<Json<tacc_proto::DesiredWork>> {
    let node = NodeId(node);
    let (work, mut changes) = app.control.desired_work(node, &poll.running).await?;
    if poll.after != Some(work.version) {
        return Ok(Json(work));
    }
    let wait = Duration::from_millis(poll.wait_ms).min(MAX_POLL_WAIT);
    tokio::select! {
        _ = changes.changed() => {}
        _ = tokio::time::sleep(wait) => {}
        _ = app.shutdown.cancelled() => {}
    }
    let (work, _) = app.control.desired_work(node, &poll.running).await?;
    Ok(Json(work))
}

async fn agent_reports(
    State(app): State<AppState>,
    Path(node): Path<u64>,
    Json(body): Json<AgentReports>,
) -> ApiResult<StatusCode> {
    app.control
        .agent_reports(NodeId(node), body.reports)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
