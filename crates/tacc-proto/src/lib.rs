//! `tacc-proto`: the wire types of TACC's HTTP API (`/v1/...`), spoken between `tcloud`,
//! the control plane and node agents.
//!
//! These are not domain types: the server and clients convert at the edge, so the API can
//! stay stable while internals change. It depends on `tacc-core` only (ids, resources,
//! states) and must not depend on the schema, scheduler, store or any runtime crate.

mod accounting;
mod adaptive;
mod cluster_stop;
pub mod estimate_text;
mod files;
mod groups;
mod pipelines;
mod sessions;

use std::collections::BTreeMap;

pub use accounting::*;
pub use adaptive::*;
pub use cluster_stop::*;
pub use files::*;
pub use groups::*;
pub use pipelines::*;
use serde::{Deserialize, Serialize};
pub use sessions::*;
use tacc_core::{AttemptNo, NodeId, Resources, Role, SnapshotId, TaskId, TaskState, Timestamp};

/// Prefix of every API token TACC issues (users, agent join tokens, node credentials), so
/// a leaked token is recognisable by secret scanners.
pub const TOKEN_PREFIX: &str = "tacc_";
/// Response header of the log endpoint: the byte offset just past the returned data.
pub const LOG_OFFSET_HEADER: &str = "x-tacc-log-offset";
/// Largest body the server accepts on an agent's reports route
/// (`POST /v1/agents/{node}/reports`). Agents size their batches well below it, so a
/// batch is never refused for its size, however much a task prints.
pub const MAX_REPORTS_BODY_BYTES: usize = 16 << 20;
/// API version prefix.
pub const API_PREFIX: &str = "/v1";

/// Every error response body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable machine-readable code, e.g. `not_found`, `invalid_task`, `conflict`.
    pub code: String,
    /// What went wrong, for people, including how to fix it.
    pub message: String,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub version: String,
}

// ---------------------------------------------------------------- snapshots

/// Client → server: "here is a snapshot manifest; which chunks do you lack?"
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotOffer {
    /// The manifest as produced by the compiler (opaque to this crate).
    pub manifest: serde_json::Value,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotOfferReply {
    pub snapshot: SnapshotId,
    /// Chunk hashes the server does not have yet; upload them, then commit.
    pub missing: Vec<String>,
    pub chunks_total: u64,
    pub total_bytes: u64,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotCommitted {
    pub snapshot: SnapshotId,
}

// ---------------------------------------------------------------- tasks

/// `POST /v1/estimate`: when a task with `spec` would start on this cluster if it were
/// submitted now; nothing is stored (`tcloud why` asks the other clusters of the user's
/// profiles).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EstimateQuery {
    /// The normalised task spec, as a submission carries it.
    pub spec: serde_json::Value,
}

/// The answer to an [`EstimateQuery`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitEstimate {
    /// Why this cluster would refuse it (no node can ever hold it, a hard limit), if it
    /// would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// It would start at once.
    pub starts_now: bool,
    /// Otherwise, the scheduler's projection of its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<StartEstimateView>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitTask {
    /// The normalised task spec (JSON form of the schema crate's `TaskSpec`).
    pub spec: serde_json::Value,
    pub snapshot: SnapshotId,
    /// Where the task file came from, for `tcloud show` (informational).
    pub source: Option<String>,
    /// Accept a request no node of the cluster can hold today, on purpose, for a cluster
    /// that will grow (`tcloud submit --wait-for-capacity`); without it such a request is
    /// refused at submit with the reason. Requests above a hard limit are refused either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_capacity: bool,
    /// What the client changed of the task file while translating it (a legacy
    /// `tuxiv.conf` option it could not honour as written): kept with the task as
    /// overrides, first, and answered back like the server's own. At most
    /// [`MAX_TRANSLATED`], each text at most [`MAX_TRANSLATED_BYTES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub translated: Vec<Override>,
}

/// Most client-declared translations a submission may carry.
pub const MAX_TRANSLATED: usize = 64;
/// Longest text of one client-declared translation (each of its fields).
pub const MAX_TRANSLATED_BYTES: usize = 2048;

/// Something the platform changed of what a task asked for, said at submit (tcloud prints
/// each as a warning) and kept with the task (`tcloud show`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The task file's field, dotted as in the file: `priority`, `resources.time_limit`.
    pub field: String,
    /// What the task asked for; `None` when it left the field out.
    pub asked: Option<String>,
    /// What applies instead.
    pub applied: String,
    /// Why, and what would change it.
    pub why: String,
}

impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.asked {
            Some(asked) => write!(
                f,
                "`{}: {asked}` was changed to `{}`: {}",
                self.field, self.applied, self.why
            ),
            None => write!(
                f,
                "`{}` was not set; `{}` applies: {}",
                self.field, self.applied, self.why
            ),
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitReply {
    /// For an array, its first element.
    pub task_id: TaskId,
    pub state: TaskState,
    /// Set when the task file had `array:`: the group made of its elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupSubmitted>,
    /// What the platform changed of what the task asked for (every element alike).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<Override>,
}

/// A task as shown to users.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    pub id: TaskId,
    pub name: String,
    pub user: String,
    pub state: TaskState,
    /// Why it is in this state: pending reason while queued, failure reason when failed.
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub attempt: AttemptNo,
    pub max_attempts: u32,
    /// Names of the nodes it runs (or ran) on.
    pub nodes: Vec<String>,
    pub gpus: Vec<Vec<u32>>,
    pub snapshot: SnapshotId,
    pub per_node: Resources,
    pub num_nodes: u32,
    pub time_limit_secs: Option<u64>,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub cancel_requested: bool,
    pub source: Option<String>,
    /// While queued: when the scheduler expects it to start, if it can tell.
    pub estimated_start: Option<Timestamp>,
    pub spec: serde_json::Value,
    /// The group it is an element of, and its index there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<tacc_core::GroupId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_index: Option<u32>,
    /// What the platform changed of what the task asked for: `spec` is what was asked,
    /// each override what applies instead.
    #[serde(default)]
    pub overrides: Vec<Override>,
    /// It was accepted to wait for a cluster that will grow (`--wait-for-capacity`).
    #[serde(default)]
    pub wait_for_capacity: bool,
}

/// Why a task is where it is: `GET /v1/tasks/{id}/why`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExplanation {
    pub task_id: TaskId,
    pub state: TaskState,
    /// The pending reason while queued; why it ended otherwise.
    pub reason: Option<String>,
    /// Place in the scheduling order among queued tasks (0 = considered first).
    pub queue_position: Option<u64>,
    /// The latest start of `start_estimate` when it has one (kept for older clients).
    pub estimated_start: Option<Timestamp>,
    /// While queued: the scheduler's projection of its start (absent from older servers,
    /// and while no node can run it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_estimate: Option<StartEstimateView>,
    /// While queued and asking for 2 or more GPUs per node: when it would start with
    /// half of them (the same projection with the task reshaped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fewer_gpus: Option<ShapeWhatIf>,
    /// While queued and selecting nodes by label (a partition, a pool): when it would
    /// start selecting another value of that label that nodes up now carry (a few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_nodes: Vec<NodesWhatIf>,
    /// The scheduling policy in force.
    pub policy: String,
    /// Further facts for people: the task's group, the limits that apply, what to change.
    pub details: Vec<String>,
    /// What holds the running task back and how its allocation moved (adaptive
    /// allocation); absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveView>,
}

/// When a queued task is expected to start, from a projection of the scheduler itself:
/// every task ahead runs to its time limit and the scheduler makes the decisions it would
/// make (quotas, fair share, reservations, node shapes, CPUs, memory and GPUs). It holds
/// while nothing is submitted ahead of the task and no node is lost.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartEstimateView {
    /// No earlier than this: now (a task ahead may end at any moment), or the end of a
    /// retry's backoff.
    pub earliest: Timestamp,
    pub latest: LatestStartView,
    /// The tasks at whose end (by their time limits) it starts, first few.
    pub after: Vec<TaskEndView>,
    /// What the estimate rests on, for people (`task 41 ends at its time limit …`,
    /// `bob may run 1 task at a time`).
    pub basis: Vec<String>,
    /// When it likely starts if the tasks ahead end after their users' usual run times
    /// (where their history gives one) rather than at their limits; absent when no task
    /// ahead has such a history, or it changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likely: Option<LikelyStartView>,
}

/// A likelier start than the latest: see [`StartEstimateView::likely`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LikelyStartView {
    pub at: Timestamp,
    /// The usual run times it rests on (`task 41 usually runs 20m (median of alice's
    /// last 8 runs of train)`).
    pub because: Vec<String>,
}

/// The latest start of a [`StartEstimateView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LatestStartView {
    /// Starts no later than `at`.
    At { at: Timestamp },
    /// Unknown: it waits for tasks without a time limit (these, the first few).
    Unknown { no_time_limit: Vec<TaskId> },
    /// The projection's step cap or horizon came first: later than `after`.
    BeyondHorizon { after: Timestamp },
}

/// A task's end at its time limit that a start estimate waits for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEndView {
    pub task: TaskId,
    pub at: Timestamp,
}

/// What-if: the same projection with the task asking for another shape.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeWhatIf {
    pub gpus_per_node: u32,
    pub latest: LatestStartView,
    /// True when that is sooner than the estimate for the shape asked.
    pub sooner: bool,
}

/// What-if: the same projection with the task selecting nodes labelled `label=value`
/// instead of its own value of that label.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesWhatIf {
    pub label: String,
    pub value: String,
    pub latest: LatestStartView,
    /// True when that is sooner than the estimate for the nodes asked.
    pub sooner: bool,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEventView {
    pub at: Timestamp,
    pub attempt: AttemptNo,
    pub state: TaskState,
    pub reason: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Path relative to the working directory of the rank that wrote it.
    pub path: String,
    pub size: u64,
    pub attempt: AttemptNo,
    /// The node rank that wrote it (0 from servers that kept rank 0's outputs only).
    #[serde(default)]
    pub rank: u32,
    /// How it is listed and downloaded: `path` when no other rank of the attempt wrote
    /// the same path, else `rank-R/path` (empty from servers before per-rank outputs).
    #[serde(default)]
    pub name: String,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelReply {
    pub task_id: TaskId,
    pub state: TaskState,
    /// False when the task had already finished.
    pub changed: bool,
}

// ---------------------------------------------------------------- nodes and agents

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterAgent {
    /// Stable node name (host name by default); re-registering under it resumes the node.
    pub name: String,
    pub capacity: Resources,
    pub gpu_type: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Attempts this agent is still running, and those that ended on it whose end it has
    /// not delivered yet (after an agent restart: none).
    pub running: Vec<AttemptRef>,
    /// Address other nodes can reach this one at, for multi-node tasks.
    pub address: String,
    /// The node's GPUs as found (NVML) or faked (`--gpus N --gpu-type T`), by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuDevice>,
    /// Tells this agent process from an earlier one on the node (random per start): the
    /// offsets of its output reports count from zero in each life, so the server keeps
    /// what it applied of a life across its own restarts. 0 (an older agent) is a new
    /// life at every registration.
    #[serde(default)]
    pub life: u64,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRegistered {
    pub node_id: NodeId,
    /// The agent must poll at least this often or it is considered lost.
    pub heartbeat_timeout_ms: u64,
    /// The node's own credential, issued when the agent registered with a join token:
    /// keep it (mode 0600) and present it from now on, also after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_token: Option<String>,
    /// The server is one of several replicas (`taccd server --replicated`): another may
    /// take over while this one is stalled, so the agent fences on silence even when the
    /// server's host still accepts connections.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicated: bool,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptRef {
    pub task: TaskId,
    pub attempt: AttemptNo,
}

/// Everything an agent needs to run its part of one attempt.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub attempt: AttemptRef,
    /// The compiled instruction (JSON form of the compiler's `Instruction`).
    pub instruction: serde_json::Value,
    pub node_rank: u32,
    pub gpu_indices: Vec<u32>,
    pub master_addr: String,
    pub master_port: u16,
    /// `environment.secrets` of the task, decrypted for this node only: the agent puts
    /// each into the task's environment under its name and masks the exact values in
    /// the task's log. Sent only on the node's own authenticated work poll.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// The per-node CPU and memory in force when adaptive allocation changed them since
    /// the start (the instruction keeps what the task asked for): a running attempt is
    /// re-limited live to this. GPUs never change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<Resources>,
    /// A pipeline stage's files from the stages it needs, placed read-only under
    /// `inputs/<stage>/` before the task starts; then the previous attempt's checkpoint
    /// files, restored into the checkpoint directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<InputFile>,
    /// The uid (and gid) the task's processes run as on a root agent, allocated by the
    /// server once per user and the same on every node, so no two users share one. `None`
    /// when the operator mapped the user to a Unix account (the instruction's
    /// `unix_user`), or from a server that allocates none (a root agent refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_uid: Option<u32>,
}

/// Agent → server long poll for work.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkPoll {
    /// The version of the desired work the agent has; the answer waits until it changes.
    pub after: Option<u64>,
    pub wait_ms: u64,
    /// Attempts the agent is running right now.
    pub running: Vec<AttemptRef>,
}

/// The long-poll answer: the complete set of attempts this node should be running.
/// Anything the agent runs that is not listed must be stopped.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesiredWork {
    /// Changes whenever the set changes; pass it back to wait for the next change.
    pub version: u64,
    pub assignments: Vec<Assignment>,
    /// Questions about the node's running attempts (`tcloud ls`, a live file), each
    /// answered once with a POST to `/v1/agents/{node}/answers/{id}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<NodeRequest>,
}

/// Agent → server, in the order things happened.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentReport {
    /// Output of the user's processes (whole lines, `\n`-terminated).
    Log {
        attempt: AttemptRef,
        text: String,
        /// Where `text` starts in this node's output of the attempt, in bytes: a report
        /// the server already applied (its answer was lost, the batch sent again) is
        /// recognised and dropped. Absent on the agent's own notes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    Started {
        attempt: AttemptRef,
        at: Timestamp,
    },
    Finished {
        attempt: AttemptRef,
        at: Timestamp,
        outcome: AttemptOutcome,
        /// Of a node that starts several processes (`resources.processes`): the `RANK` of
        /// the process whose end decided the outcome (the first to fail).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    /// The runtime the node runs the attempt in (`process`, `container`, …) and why,
    /// saying so when it switched away from a better one; shown as the task's reason.
    RuntimeChosen {
        attempt: AttemptRef,
        runtime: String,
        why: String,
    },
    /// What one rank of a running attempt uses now (sampled every few seconds).
    Usage(UsageSample),
    /// The agent applied (or could not apply: `error`) a new allocation to a running
    /// attempt. Not retried by the agent.
    Resized {
        attempt: AttemptRef,
        cpu_millis: u64,
        memory_bytes: u64,
        #[serde(default)]
        error: Option<String>,
    },
    /// Lines the task appended to `$TACC_METRICS`, parsed and bounded by the agent.
    Metrics {
        attempt: AttemptRef,
        #[serde(default)]
        points: Vec<MetricLine>,
    },
}

/// One line of `$TACC_METRICS`: `{"step": 10, "val_loss": 0.31}`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricLine {
    pub step: u64,
    /// Every other numeric field of the line, by name.
    #[serde(default)]
    pub values: std::collections::BTreeMap<String, f64>,
}

impl AgentReport {
    /// The attempt the report is about.
    pub fn attempt(&self) -> AttemptRef {
        match self {
            AgentReport::Log { attempt, .. }
            | AgentReport::Started { attempt, .. }
            | AgentReport::Finished { attempt, .. }
            | AgentReport::RuntimeChosen { attempt, .. }
            | AgentReport::Resized { attempt, .. }
            | AgentReport::Metrics { attempt, .. } => *attempt,
            AgentReport::Usage(sample) => sample.attempt,
        }
    }

    /// A one-word name of the report's kind, for logs and audit records.
    pub fn kind(&self) -> &'static str {
        match self {
            AgentReport::Log { .. } => "log",
            AgentReport::Started { .. } => "started",
            AgentReport::Finished { .. } => "finished",
            AgentReport::RuntimeChosen { .. } => "runtime",
            AgentReport::Usage(_) => "usage",
            AgentReport::Resized { .. } => "resized",
            AgentReport::Metrics { .. } => "metrics",
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttemptOutcome {
    Exited {
        code: i32,
    },
    Signalled {
        signal: i32,
    },
    TimeLimit,
    Cancelled,
    /// The platform could not start it; `reason` is a snake_case code such as
    /// `snapshot_fetch_failed` or `launch_failed`.
    LaunchFailed {
        reason: String,
        message: String,
    },
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentReports {
    pub reports: Vec<AgentReport>,
    /// Asks the answer to carry the node's desired work when it changed since the
    /// version the agent has, so a task's end and the node's next task take one exchange
    /// (its held work poll is then not answered for that version again). Absent from
    /// agents that take their work only from the poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<WorkSince>,
}

/// What the agent has of its work when it sends a report batch: the version of its
/// desired work it applied last, and the attempts it ran then (taken together).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkSince {
    pub after: Option<u64>,
    pub running: Vec<AttemptRef>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    pub capacity: Resources,
    pub allocated: Resources,
    pub gpu_type: Option<String>,
    /// What the node offers (`tacc.io/runtime.*`, `tacc.io/slurm-partition`) and the
    /// operator's `--label`s: what a task's `runtime` and `placement` select on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub state: String,
    pub last_seen: Timestamp,
    pub running_tasks: Vec<TaskId>,
    /// The GPUs its agent registered (index, UUID, model, memory, health).
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
}

// ---------------------------------------------------------------- compiler layer

/// A dataset an administrator registered (`taccd server --dataset NAME=SOURCE`); task
/// files name it as `source: NAME`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetView {
    pub name: String,
    /// An absolute path on shared storage or an http(s) URL.
    pub source: String,
}

/// What one chunk garbage-collection pass did (`POST /v1/admin/gc`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    pub chunks_kept: u64,
    pub chunks_removed: u64,
    pub bytes_removed: u64,
    pub temp_files_removed: u64,
}

// ---------------------------------------------------------------- identities

/// `GET /v1/whoami`: the identity the presented token stands for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI {
    pub name: String,
    pub group: Option<String>,
    pub role: Role,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    pub name: String,
    pub group: Option<String>,
    pub role: Role,
    pub created_at: Timestamp,
}

/// `POST /v1/admin/users` (admin only).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUser {
    pub name: String,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default = "default_role")]
    pub role: Role,
    /// Lifetime of the first token; none = until revoked.
    #[serde(default)]
    pub token_ttl_secs: Option<u64>,
}

fn default_role() -> Role {
    Role::User
}

/// `POST /v1/admin/tokens` (admin only): a new API token for an existing user.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateToken {
    pub user: String,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// A token as issued: the secret appears here once and is never shown again.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenIssued {
    pub id: u64,
    pub token: String,
    pub expires_at: Option<Timestamp>,
}

/// `POST /v1/admin/users` answer: the user and their first token.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCreated {
    pub user: UserView,
    pub token: TokenIssued,
}

/// A token as listed: never its secret.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: u64,
    /// `user`, `agent_join`, `node` or `metrics`.
    pub kind: String,
    pub user: Option<String>,
    pub node: Option<NodeId>,
    pub label: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    pub id: u64,
    pub at: Timestamp,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub outcome: String,
    pub detail: String,
}

/// A secret as listed: its name, never its value. The value is set with
/// `PUT /v1/secrets/{name}` (the raw bytes as the body) and never read back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretView {
    pub name: String,
    pub updated_at: Timestamp,
}

/// The answer to an agent's report batch: reports that did not belong to one of the
/// node's current attempts (another node's, a stale attempt's, a replayed ending) are
/// rejected one by one, audited, and counted here; the rest were applied.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ReportsAck {
    pub accepted: u32,
    pub rejected: u32,
    /// The node's desired work after the batch, when the batch asked for it
    /// ([`AgentReports::work`]) and it is not the version the agent has: the same answer
    /// a work poll would give then (without the questions, which the poll carries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<DesiredWork>,
}

// ---------------------------------------------------------------- monitoring

/// One GPU of a node, as its agent found it (through NVML) or faked it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The index tasks see it under (`CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// NVML's UUID (`GPU-…`); `fake-N` for a GPU offered with `--gpus N`.
    pub uuid: String,
    /// The model as NVML names it (`NVIDIA H100 80GB HBM3`), or the `--gpu-type` of a fake.
    pub model: String,
    #[serde(default)]
    pub memory_total_bytes: u64,
    /// `ok`, `retired pages pending`, `unreadable: …`, or `fake`.
    pub health: String,
}

/// What one GPU of an attempt used at a sample.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    /// Percent of the last sample period a kernel ran on it.
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    #[serde(default)]
    pub memory_total_bytes: u64,
}

/// Agent → server: one rank of a running attempt at one moment. Times are the agent's
/// clock; the server compares them with `at`, never with its own clock.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageSample {
    pub attempt: AttemptRef,
    pub node_rank: u32,
    pub at: Timestamp,
    /// When this rank's execution started on the node.
    pub started_at: Timestamp,
    /// When it last wrote a line of output; `None`: not yet.
    #[serde(default)]
    pub last_output_at: Option<Timestamp>,
    /// Thousandths of a CPU used on average since the previous sample; `None` where the
    /// runtime does not account CPU per execution.
    #[serde(default)]
    pub cpu_millis_used: Option<u64>,
    /// Time the CPU quota held the execution back since it started.
    #[serde(default)]
    pub cpu_throttled_ms: Option<u64>,
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// The most memory the current execution used so far.
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    #[serde(default)]
    pub gpus: Vec<GpuSample>,
    /// The CPU quota in force (thousandths of a CPU); `None`: no quota or not measured.
    #[serde(default)]
    pub cpu_quota_millis: Option<u64>,
    /// Share (0–1) of the CFS periods since the previous sample the quota throttled.
    #[serde(default)]
    pub cpu_throttled_fraction: Option<f64>,
    /// The memory limit in force; `None`: no limit or not measured.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Percent of time some of its tasks stalled on memory (cgroup v2 PSI `some avg10`).
    #[serde(default)]
    pub memory_pressure_percent: Option<f64>,
    /// How often its memory use hit the limit so far (cgroup v1 `memory.failcnt`).
    #[serde(default)]
    pub memory_failcnt: Option<u64>,
    /// Percent of time some of its tasks waited for I/O (cgroup v2 PSI), where known.
    #[serde(default)]
    pub io_wait_percent: Option<f64>,
}

/// `GET /v1/tasks/{id}/usage`: what a task's ranks use now, the peaks of every attempt,
/// and what looks wrong.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskUsage {
    pub task_id: TaskId,
    pub name: String,
    pub state: TaskState,
    pub attempt: AttemptNo,
    /// What each rank may use now: the task's per-node resources, or the allocation a
    /// resize (adaptive allocation) gave it since.
    pub allocated: Resources,
    /// The latest sample of each rank of the current attempt, while it runs.
    pub ranks: Vec<RankUsage>,
    /// The highest use seen of each rank of each attempt (kept after the task ends).
    pub peaks: Vec<UsagePeakView>,
    /// The first failed rank, and ranks silent for longer than the server's threshold.
    pub flags: Vec<UsageFlag>,
    /// A rank with no output (and no CPU use) for this long is flagged silent.
    pub silent_after_secs: u64,
    /// The classifier's verdict, the allocation in force, its changes and the recorded
    /// signal history; absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveView>,
    /// Node ranks of the current multi-node attempt that already finished their part
    /// (the attempt succeeds once every rank has); kept across server restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finished_ranks: Vec<u32>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankUsage {
    pub node_rank: u32,
    pub node: String,
    /// When the sample was taken (the server's clock).
    pub at: Timestamp,
    pub cpu_millis_used: Option<u64>,
    pub cpu_throttled_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub gpus: Vec<GpuSample>,
    /// When the rank last wrote output (the server's clock); `None`: not yet.
    pub last_output_at: Option<Timestamp>,
    /// How long the rank has written nothing and (where measured) used no CPU.
    pub quiet_secs: u64,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsagePeakView {
    pub attempt: AttemptNo,
    pub node_rank: u32,
    pub node: String,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpu_utilization_percent: u32,
    pub gpu_memory_bytes: u64,
    /// When a peak last rose.
    pub at: Timestamp,
}

/// Something about a rank that a person should look at.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageFlag {
    /// `failed` (the first rank that failed) or `silent`.
    pub kind: String,
    pub attempt: AttemptNo,
    pub node_rank: u32,
    pub node: String,
    /// Since when: the failure, or the last sign of life.
    pub since: Timestamp,
    /// `rank 2 on n3 silent for 5m`, `rank 1 on n2 failed first: exit code 3`.
    pub message: String,
}
