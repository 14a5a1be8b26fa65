//! Wire types of a task's files: listings of a running attempt's live working directory
//! (`tcloud ls`), one file fetched from it, and the requests that carry both to the node
//! over the agent's long poll — agents only ever call the server, so the server cannot
//! call them; it queues a [`NodeRequest`] in the node's next [`crate::DesiredWork`] and
//! the agent answers with a POST.

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, TaskId, Timestamp};

use crate::AttemptRef;

/// Entries one listing holds at most; a longer directory is cut and says so.
pub const MAX_LISTING_ENTRIES: usize = 10_000;
/// Largest file fetched from a live working directory (`tcloud download ID PATH` on a
/// running task); bigger files are declared in `outputs:` and kept when the task ends.
pub const MAX_LIVE_FILE_BYTES: u64 = 32 << 20;

/// Response header of `GET /v1/tasks/{id}/outputs`: the `ATTEMPT:RANK` pairs (comma
/// separated) whose node has not yet reported the end of its share of the attempt, so
/// its outputs may still be arriving. Absent when none.
pub const OUTPUTS_PENDING_HEADER: &str = "x-tacc-outputs-pending";

/// Identifies one request the server put to a node, until it is answered or times out.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeRequestId(pub u64);

impl std::fmt::Display for NodeRequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Server → agent, in [`crate::DesiredWork::requests`]: something about one of the
/// node's running attempts that only the node can answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRequest {
    pub id: NodeRequestId,
    pub attempt: AttemptRef,
    pub kind: NodeRequestKind,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeRequestKind {
    /// The entries of a directory (or the one entry of a file) of the working directory;
    /// `path` is relative to it, empty for the directory itself.
    List { path: String },
    /// One regular file of the working directory, at most `max_bytes` long.
    Fetch { path: String, max_bytes: u64 },
    /// Open an interactive session into node rank `rank` of the attempt: the agent
    /// connects back to `GET /v1/agents/{node}/sessions/{id}` (the request's id) and
    /// speaks [`crate::Frame`]s there.
    Session {
        rank: u32,
        session: crate::SessionKind,
    },
}

/// Agent → server, for a [`NodeRequestKind::List`] or for any request that failed. A
/// fetched file's bytes travel as the raw body of their own route instead.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeAnswer {
    Listing {
        entries: Vec<FileEntry>,
        truncated: bool,
    },
    /// `code` is `not_found`, `bad_request` (the path is not allowed) or `too_large`;
    /// `message` says it for people.
    Failed { code: String, message: String },
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    /// A symbolic link: listed, never followed.
    Link,
    /// A FIFO, socket or device.
    Other,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Link => "link",
            FileKind::Other => "other",
        }
    }
}

/// One entry of a listing.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The entry's name within the listed directory (a file listed by its own path: its
    /// file name).
    pub name: String,
    pub kind: FileKind,
    /// Bytes of a file; a directory's entries' total for kept outputs, 0 live.
    pub size: u64,
    /// Last modification, when known.
    pub mtime: Option<Timestamp>,
}

/// `GET /v1/tasks/{id}/files`: a directory of a task, live or kept.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileListing {
    pub task: TaskId,
    pub attempt: AttemptNo,
    /// The rank listed: live listings are one node's; kept outputs are every rank's
    /// (rank-qualified where paths collide) unless one was asked for.
    pub rank: Option<u32>,
    /// The node a live listing comes from.
    pub node: Option<String>,
    /// True for the running attempt's working directory, false for kept outputs.
    pub live: bool,
    /// The directory listed, relative to the working directory ("" for its root).
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// More entries existed than [`MAX_LISTING_ENTRIES`].
    pub truncated: bool,
}
