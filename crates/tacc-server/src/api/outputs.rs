//! Output routes: listing and downloading a task's kept files, and the agent's upload.

use super::prelude::*;

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

pub(super) async fn list_outputs(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<Vec<OutputFile>>> {
    super::tasks::load(&app.control, TaskId(id)).await?;
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

pub(super) async fn get_output(
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
pub(super) async fn put_output(
    State(app): State<AppState>,
    Path((node, task, attempt, path)): Path<(u64, u64, u32, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    use futures::TryStreamExt;
    use tokio::io::AsyncWriteExt;

    app.control.touch(NodeId(node)).await;
    let relative = safe_relative(&path)?;
    let attempt_ref = tacc_proto::AttemptRef {
        task: TaskId(task),
        attempt: AttemptNo(attempt),
    };
    if !app
        .control
        .attempt_is_on_node(NodeId(node), attempt_ref, false)
        .await?
    {
        app.control.audit.record_as(
            format!("node:{node}"),
            "output.rejected",
            format!("task:{task}/{attempt}"),
            false,
            format!("upload of `{path}` for an attempt this node does not run"),
        );
        return Err(ServerError::Forbidden(format!(
            "task {task} attempt {attempt} is not running on node {node}; its outputs cannot come from here"
        )));
    }
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
