//! A task's files as `tcloud ls` and `tcloud download ID PATH` see them: a running
//! attempt's live working directory on any of its nodes (asked of the node over its work
//! poll, see [`crate::node_requests`]), or, once it has ended, the outputs it kept. Also
//! the agents' answers to those questions.

use std::collections::BTreeMap;

use tacc_proto::{
    FileEntry, FileKind, FileListing, MAX_LISTING_ENTRIES, MAX_LIVE_FILE_BYTES, NodeAnswer,
    NodeRequestId, NodeRequestKind,
};

use super::outputs::{listed_names, rank_dir};
use super::prelude::*;
use crate::node_requests::{Answer, Unanswered};

/// How long a question waits for the node's answer.
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    /// Relative to the working directory; empty (or absent) for its root.
    #[serde(default)]
    path: String,
    /// The node rank to ask (live; 0 when absent), or whose kept outputs to list.
    rank: Option<u32>,
    /// An earlier attempt's kept outputs instead of the running attempt's live files.
    attempt: Option<u32>,
}

/// `path` normalised to `a/b` ("" for the root): relative, no `..`.
fn clean_path(path: &str) -> ApiResult<String> {
    let mut parts = Vec::new();
    for component in FsPath::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(ServerError::BadRequest(format!(
                    "path `{path}` must be relative to the task's working directory and may \
                     not contain `..`"
                )));
            }
        }
    }
    Ok(parts.join("/"))
}

/// The node and rank to ask when the task's current attempt runs and no earlier attempt
/// was asked for; `None` means the kept outputs.
async fn live_target(
    control: &Control,
    record: &TaskRecord,
    query: &FilesQuery,
) -> ApiResult<Option<(NodeId, String, u32)>> {
    let current = query.attempt.is_none_or(|a| a == record.attempt.0);
    if !record.state.is_active() || record.placements.is_empty() || !current {
        return Ok(None);
    }
    let rank = query.rank.unwrap_or(0);
    let count = record.placements.len();
    let Some(placement) = record.placements.get(rank as usize) else {
        return Err(ServerError::BadRequest(format!(
            "task {} runs on {count} node(s): --rank must be 0{}",
            record.id,
            if count > 1 {
                format!(" to {}", count - 1)
            } else {
                String::new()
            }
        )));
    };
    let name = control
        .node_names()
        .await
        .remove(&placement.node)
        .unwrap_or_else(|| format!("node-{}", placement.node));
    Ok(Some((placement.node, name, rank)))
}

/// Ask `node` about the task's running attempt, turning silence and refusals into errors
/// that say what happened.
async fn ask(
    control: &Control,
    record: &TaskRecord,
    node: NodeId,
    name: &str,
    kind: NodeRequestKind,
) -> ApiResult<Answer> {
    let attempt = tacc_proto::AttemptRef {
        task: record.id,
        attempt: record.attempt,
    };
    let answer = control
        .node_requests
        .ask(node, attempt, kind, ANSWER_DEADLINE)
        .await
        .map_err(|why| match why {
            Unanswered::Timeout => ServerError::NodeTimeout(format!(
                "node {name} did not answer within {} s (it may be overloaded or unreachable; \
                 `tcloud nodes` shows when it was last seen)",
                ANSWER_DEADLINE.as_secs()
            )),
            Unanswered::Busy => ServerError::TooManyRequests {
                message: format!(
                    "node {name} is already answering many questions about its files; try \
                     again in a moment"
                ),
                retry_after_secs: 1,
            },
        })?;
    match answer {
        Answer::Failed { code, message } => Err(match code.as_str() {
            "not_found" => ServerError::NotFound(message),
            "bad_request" | "too_large" => ServerError::BadRequest(message),
            _ => ServerError::Internal(format!("node {name}: {message}")),
        }),
        other => Ok(other),
    }
}

pub(super) async fn list_files(
    State(app): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<FilesQuery>,
) -> ApiResult<Json<FileListing>> {
    let record = super::tasks::load(&app.control, TaskId(id)).await?;
    let path = clean_path(&query.path)?;
    let Some((node, name, rank)) = live_target(&app.control, &record, &query).await? else {
        return Ok(Json(
            kept_listing(&app.control, &record, &path, &query).await?,
        ));
    };
    let kind = NodeRequestKind::List { path: path.clone() };
    match ask(&app.control, &record, node, &name, kind).await? {
        Answer::Listing { entries, truncated } => Ok(Json(FileListing {
            task: record.id,
            attempt: record.attempt,
            rank: Some(rank),
            node: Some(name),
            live: true,
            path,
            entries,
            truncated,
        })),
        _ => Err(ServerError::Internal(format!(
            "node {name} answered a listing with a file"
        ))),
    }
}

/// The directory `path` of the outputs an attempt kept: every rank's (rank-qualified
/// where paths collide, as `tcloud show` lists them) or one rank's under their own paths.
async fn kept_listing(
    control: &Control,
    record: &TaskRecord,
    path: &str,
    query: &FilesQuery,
) -> ApiResult<FileListing> {
    let id = record.id;
    let outputs = control.query().outputs(id).await?;
    let names = listed_names(&outputs);
    let attempt = match query.attempt {
        Some(attempt) => AttemptNo(attempt),
        None => outputs
            .iter()
            .map(|o| o.attempt)
            .max()
            .unwrap_or(record.attempt),
    };
    // Entry name → (kind, size, newest mtime).
    let mut children: BTreeMap<String, (FileKind, u64, Option<tacc_core::Timestamp>)> =
        BTreeMap::new();
    let mut matched = false;
    for (output, name) in outputs.iter().zip(&names) {
        if output.attempt != attempt || query.rank.is_some_and(|r| r != output.rank) {
            continue;
        }
        let listed = if query.rank.is_some() {
            &output.path
        } else {
            name
        };
        let rest = if path.is_empty() {
            listed.as_str()
        } else if listed == path {
            // The path names one file: list it alone.
            listed.rsplit('/').next().unwrap_or(listed)
        } else if let Some(rest) = listed.strip_prefix(path).and_then(|r| r.strip_prefix('/')) {
            rest
        } else {
            continue;
        };
        matched = true;
        let file = rank_dir(control, id, attempt, output.rank).join(&output.path);
        let mtime = tokio::fs::metadata(&file)
            .await
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| tacc_core::Timestamp(d.as_millis() as u64));
        let (head, kind) = match rest.split_once('/') {
            Some((dir, _)) => (dir, FileKind::Dir),
            None => (rest, FileKind::File),
        };
        let entry = children.entry(head.to_string()).or_insert((kind, 0, None));
        entry.1 += output.size;
        entry.2 = entry.2.max(mtime);
    }
    if !path.is_empty() && !matched {
        return Err(ServerError::NotFound(format!(
            "task {id} attempt {attempt} kept no output at `{path}`{} (list them with \
             `tcloud ls {id}`)",
            query
                .rank
                .map(|r| format!(" on rank {r}"))
                .unwrap_or_default()
        )));
    }
    let truncated = children.len() > MAX_LISTING_ENTRIES;
    let entries = children
        .into_iter()
        .take(MAX_LISTING_ENTRIES)
        .map(|(name, (kind, size, mtime))| FileEntry {
            name,
            kind,
            size,
            mtime,
        })
        .collect();
    Ok(FileListing {
        task: id,
        attempt,
        rank: query.rank,
        node: None,
        live: false,
        path: path.to_string(),
        entries,
        truncated,
    })
}

/// One file of a running attempt's live working directory, at most
/// [`MAX_LIVE_FILE_BYTES`] long.
pub(super) async fn get_file(
    State(app): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<FilesQuery>,
) -> ApiResult<Response> {
    let record = super::tasks::load(&app.control, TaskId(id)).await?;
    let path = clean_path(&query.path)?;
    if path.is_empty() {
        return Err(ServerError::BadRequest(
            "name the file to fetch: `tcloud download ID PATH` (see `tcloud ls ID`)".into(),
        ));
    }
    let Some((node, name, _)) = live_target(&app.control, &record, &query).await? else {
        return Err(ServerError::Conflict(format!(
            "task {id} is {} and this is not its running attempt: there is no live working \
             directory to fetch from; its kept outputs come with `tcloud download {id}`",
            record.state
        )));
    };
    let kind = NodeRequestKind::Fetch {
        path,
        max_bytes: MAX_LIVE_FILE_BYTES,
    };
    match ask(&app.control, &record, node, &name, kind).await? {
        Answer::File(bytes) => {
            let length = bytes.len() as u64;
            let mut response = Body::from(bytes).into_response();
            // A running task's file, by the name it chose: saved, never rendered.
            super::headers::as_download(&mut response, &query.path);
            response.headers_mut().insert(
                axum::http::header::CONTENT_LENGTH,
                HeaderValue::from(length),
            );
            Ok(response)
        }
        _ => Err(ServerError::Internal(format!(
            "node {name} answered a file request with a listing"
        ))),
    }
}

fn not_waited_for(node: u64, request: u64) -> ServerError {
    ServerError::NotFound(format!(
        "request {request} is not waiting for an answer from node {node} (answered already, \
         timed out, or asked of another node)"
    ))
}

/// A node answers a question with a listing or a refusal.
pub(super) async fn post_answer(
    State(app): State<AppState>,
    Path((node, request)): Path<(u64, u64)>,
    Json(answer): Json<NodeAnswer>,
) -> ApiResult<StatusCode> {
    let answer = match answer {
        NodeAnswer::Listing {
            mut entries,
            mut truncated,
        } => {
            // Never trust the other side with the size of what users are sent.
            if entries.len() > MAX_LISTING_ENTRIES {
                entries.truncate(MAX_LISTING_ENTRIES);
                truncated = true;
            }
            Answer::Listing { entries, truncated }
        }
        NodeAnswer::Failed { code, message } => Answer::Failed { code, message },
    };
    if app
        .control
        .node_requests
        .answer(NodeId(node), NodeRequestId(request), answer)
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_waited_for(node, request))
    }
}

/// A node answers a fetch with the file's bytes (the body, bounded by the route's limit).
pub(super) async fn put_answer_file(
    State(app): State<AppState>,
    Path((node, request)): Path<(u64, u64)>,
    body: Body,
) -> ApiResult<StatusCode> {
    let (node_id, id) = (NodeId(node), NodeRequestId(request));
    // Checked before the body is read: only the asked node's answer is worth reading.
    if !app.control.node_requests.is_waiting(node_id, id) {
        super::drain::drain(body).await;
        return Err(not_waited_for(node, request));
    }
    let bytes = axum::body::to_bytes(body, MAX_LIVE_FILE_BYTES as usize)
        .await
        .map_err(|e| ServerError::BadRequest(format!("the file's upload broke off: {e}")))?;
    if app
        .control
        .node_requests
        .answer(node_id, id, Answer::File(bytes))
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_waited_for(node, request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_confined() {
        assert_eq!(clean_path("").unwrap(), "");
        assert_eq!(clean_path(".").unwrap(), "");
        assert_eq!(clean_path("./out/").unwrap(), "out");
        assert_eq!(clean_path("out//a.txt").unwrap(), "out/a.txt");
        for bad in ["..", "../x", "out/../../x", "/etc/passwd"] {
            assert!(clean_path(bad).is_err(), "{bad}");
        }
    }
}
