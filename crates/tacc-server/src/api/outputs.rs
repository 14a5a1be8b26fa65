//! Output routes: listing and downloading a task's kept files, and the agents' uploads.
//!
//! Every rank of every attempt keeps its own files, under `outputs/<task>/<attempt>/`
//! for rank 0 (where earlier versions kept rank 0's, so those stay readable) and
//! `outputs/<task>/<attempt>-r<rank>/` for the others. A file is listed under its plain
//! path when it is the only one of its attempt with that path, and as `rank-R/path` when
//! several ranks wrote the same path (see [`listed_names`]).

use std::collections::BTreeMap;

use super::prelude::*;

/// An upload's file before its rename into place; removed when dropped before that.
struct Partial {
    path: PathBuf,
    renamed: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Numbers each output upload's partial file (see `put_output`).
static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A path inside an output or snapshot tree: relative, no `..`, no empty parts.
pub(super) fn safe_relative(path: &str) -> ApiResult<PathBuf> {
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

/// Where the kept files of one rank of one attempt lie.
pub(super) fn rank_dir(control: &Control, task: TaskId, attempt: AttemptNo, rank: u32) -> PathBuf {
    let dir = control.outputs_dir.join(task.to_string());
    if rank == 0 {
        dir.join(attempt.to_string())
    } else {
        dir.join(format!("{attempt}-r{rank}"))
    }
}

/// The name each output is listed and downloaded under: its path, unless another rank of
/// the same attempt kept the same path, in which case every such file is
/// `rank-R/path`.
pub(super) fn listed_names(outputs: &[OutputRecord]) -> Vec<String> {
    let mut writers: BTreeMap<(AttemptNo, &str), u32> = BTreeMap::new();
    for output in outputs {
        *writers
            .entry((output.attempt, output.path.as_str()))
            .or_default() += 1;
    }
    outputs
        .iter()
        .map(|o| {
            if writers[&(o.attempt, o.path.as_str())] > 1 {
                format!("rank-{}/{}", o.rank, o.path)
            } else {
                o.path.clone()
            }
        })
        .collect()
}

pub(super) async fn list_outputs(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    let task = TaskId(id);
    super::tasks::load(&app.control, task).await?;
    let outputs = app.control.query().outputs(task).await?;
    let names = listed_names(&outputs);
    let files: Vec<OutputFile> = outputs
        .into_iter()
        .zip(names)
        .map(|(o, name)| OutputFile {
            path: o.path,
            size: o.size,
            attempt: o.attempt,
            rank: o.rank,
            name,
        })
        .collect();
    let mut response = Json(files).into_response();
    let pending = app.control.node_attempts.unfinished_ranks(task);
    if !pending.is_empty() {
        let value = pending
            .iter()
            .map(|(attempt, rank)| format!("{attempt}:{rank}"))
            .collect::<Vec<_>>()
            .join(",");
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(tacc_proto::OUTPUTS_PENDING_HEADER, value);
        }
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub(super) struct RankQuery {
    /// The rank whose file is wanted (rank 0 when absent).
    #[serde(default)]
    rank: u32,
}

pub(super) async fn get_output(
    State(app): State<AppState>,
    Path((id, attempt, path)): Path<(u64, u32, String)>,
    Query(query): Query<RankQuery>,
) -> ApiResult<Response> {
    let relative = safe_relative(&path)?;
    let rank = query.rank;
    let file = rank_dir(&app.control, TaskId(id), AttemptNo(attempt), rank).join(relative);
    let opened = tokio::fs::File::open(&file).await.map_err(|_| {
        ServerError::NotFound(format!(
            "task {id} attempt {attempt} rank {rank} has no output `{path}` (list them with \
             `tcloud show {id}`)"
        ))
    })?;
    let length = opened.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(opened)).into_response();
    // A task chose these bytes and their name: saved, never rendered (see `headers`).
    super::headers::as_download(&mut response, &path);
    response.headers_mut().insert(
        axum::http::header::CONTENT_LENGTH,
        HeaderValue::from(length),
    );
    Ok(response)
}

/// The rank `node` ran `attempt` as, if it may upload that attempt's outputs: it holds
/// the attempt (until it reports its end, however the task moved on), or the attempt is
/// its task's current one and placed on the node.
async fn uploading_rank(
    control: &Control,
    node: NodeId,
    attempt: tacc_proto::AttemptRef,
) -> ApiResult<Option<u32>> {
    if let Some(rank) = control.node_attempts.rank_of(node, attempt) {
        return Ok(Some(rank));
    }
    let record = control.facts.task_record(attempt.task).await?;
    if !crate::agent_access::attempt_is_on_node(record.as_ref(), node, attempt, false) {
        return Ok(None);
    }
    let Some(record) = control.query().task(attempt.task).await? else {
        return Ok(None);
    };
    Ok(record
        .placements
        .iter()
        .position(|p| p.node == node)
        .map(|rank| rank as u32))
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
    let relative = match safe_relative(&path) {
        Ok(relative) => relative,
        Err(refused) => {
            super::drain::drain(body).await;
            return Err(refused);
        }
    };
    let attempt_ref = tacc_proto::AttemptRef {
        task: TaskId(task),
        attempt: AttemptNo(attempt),
    };
    let Some(rank) = uploading_rank(&app.control, NodeId(node), attempt_ref).await? else {
        app.control.audit.record_as(
            format!("node:{node}"),
            "output.rejected",
            format!("task:{task}/{attempt}"),
            false,
            format!("upload of `{path}` for an attempt this node does not run"),
        );
        super::drain::drain(body).await;
        return Err(ServerError::Forbidden(format!(
            "task {task} attempt {attempt} is not running on node {node}; its outputs cannot come from here"
        )));
    };
    let file = rank_dir(&app.control, TaskId(task), AttemptNo(attempt), rank).join(&relative);
    let internal = |e: std::io::Error| {
        ServerError::io(format!("cannot store output `{path}` of task {task}"), e)
    };
    if let Some(parent) = file.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(internal)?;
    }
    // Beside the file and named after all of its name: two outputs that differ only in
    // their extension never share one. Numbered per upload: two uploads of one file at
    // once (a retry while the server still handles the first) must never write into one
    // inode — one truncating the other's bytes would leave a recorded size over an
    // emptied file. The last complete upload's rename wins.
    let mut partial = file.clone().into_os_string();
    partial.push(format!(
        ".tacc-partial-{}",
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    // Removed however this ends short of its rename: an error, or the request dropped
    // mid-way (a half-written file holds space the disk may be short of; the agent sends
    // the whole file again).
    let mut partial = Partial {
        path: PathBuf::from(partial),
        renamed: false,
    };
    let size = async {
        let mut out = tokio::fs::File::create(&partial.path)
            .await
            .map_err(internal)?;
        let mut stream = body.into_data_stream();
        let mut size = 0u64;
        while let Some(chunk) = stream.try_next().await.map_err(|e| {
            ServerError::BadRequest(format!("the upload of `{path}` broke off: {e}"))
        })? {
            size += chunk.len() as u64;
            out.write_all(&chunk).await.map_err(internal)?;
        }
        out.sync_all().await.map_err(internal)?;
        Ok::<u64, ServerError>(size)
    }
    .await?;
    tokio::fs::rename(&partial.path, &file)
        .await
        .map_err(internal)?;
    partial.renamed = true;
    app.control
        .record_output(OutputRecord {
            task: TaskId(task),
            attempt: AttemptNo(attempt),
            rank,
            path,
            size,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(attempt: u32, rank: u32, path: &str) -> OutputRecord {
        OutputRecord {
            task: TaskId(1),
            attempt: AttemptNo(attempt),
            rank,
            path: path.into(),
            size: 1,
        }
    }

    #[test]
    fn only_paths_several_ranks_wrote_are_rank_qualified() {
        let outputs = [
            output(1, 0, "out/same.txt"),
            output(1, 1, "out/only1.txt"),
            output(1, 1, "out/same.txt"),
            // Another attempt's file of the same path is no collision.
            output(2, 0, "out/only1.txt"),
        ];
        assert_eq!(
            listed_names(&outputs),
            vec![
                "rank-0/out/same.txt",
                "out/only1.txt",
                "rank-1/out/same.txt",
                "out/only1.txt",
            ]
        );
    }
}
