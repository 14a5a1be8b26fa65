//! `tacc-store`: durable state of the control plane behind the [`Store`] trait — tasks and
//! every state transition with its timestamp, nodes, code snapshots and task outputs.
//!
//! It is a side-effect crate beside the four layers: [`SqliteStore`] is the embedded
//! default (sqlx, migrations, WAL, synchronous commits), [`PostgresStore`] the same tables
//! on a PostgreSQL server, and [`MemoryStore`] the fake for tests of the layers above; one
//! contract suite ([`contract`]) runs against all three. It depends on `tacc-core` only: no scheduler, no
//! HTTP, no wire types. Callers pass time in; the store never reads a clock.

mod access;
mod adaptive;
mod groups;
mod idempotency;
mod lease;
mod memory;
mod metrics;
mod pipelines;
mod postgres;
mod records;
mod restart_facts;
mod rows;
mod sql;
mod sqlite;
mod statement;

pub mod contract;
pub mod test_database;

pub use access::{
    AuditEntry, Enrolment, JoinScope, NewAuditEntry, NewToken, SecretRecord, SnapshotOwner,
    TokenKind, TokenRecord, UserRecord,
};
pub use adaptive::{ResizeRecord, SignalRecord};
pub use idempotency::{
    Created, IdempotencyKey, KEY_LIFETIME_MS, KeptReply, Keyed, RenderReply, StoredReply,
};
pub use lease::{LeaderLease, LeaseClaim};
pub use memory::{MemoryStore, apply_transition};
pub use metrics::{MAX_METRIC_POINTS_PER_ATTEMPT, MetricPoint};
pub use pipelines::{NewStage, NewStageRun, StageRecord, StageSource};

pub use groups::{
    DeliveryOutcome, DeliveryRecord, GroupFilter, GroupKind, GroupRecord, HistoryFilter,
    NewDelivery, NewGroup,
};
pub use postgres::{PostgresStore, redacted};
pub use records::{
    NewNode, NewTask, NodeEnrolment, NodeRecord, OutputRecord, StoredPlacement, TaskChange,
    TaskEvent, TaskFilter, TaskHistory, TaskRecord, Transition, UsagePeak,
};
pub use restart_facts::{DashboardSession, FairShareLedger, RankEnd};
pub use sqlite::SqliteStore;

use std::collections::BTreeMap;

use tacc_core::{GroupId, NodeId, SnapshotId, TaskId, TaskState, Timestamp};

/// The crate's errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("task {0} does not exist")]
    TaskNotFound(TaskId),
    #[error("group {0} does not exist")]
    GroupNotFound(GroupId),
    #[error("task {task} is {actual}, not {expected}: it changed concurrently")]
    Conflict {
        task: TaskId,
        expected: String,
        actual: String,
    },
    #[error("cannot open the database at {path}: {source} ({hint})")]
    Open {
        path: String,
        #[source]
        source: sqlx::Error,
        /// What to check, for this kind of database.
        hint: &'static str,
    },
    #[error(
        "database migration failed: {0} (a database written by a newer TACC version, or a \
         role that may not create tables in it)"
    )]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "the database is unavailable: {0} (check that the database server is running and reachable)"
    )]
    Unavailable(#[source] sqlx::Error),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("{what} `{name}` already exists")]
    AlreadyExists { what: &'static str, name: String },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The SQLite file's pages are damaged: the server refuses to start on it.
    #[error(
        "the database file {path} is damaged ({detail}); taccd will not start on it. \
         Restore it from a backup (stop taccd, copy the backup over {path}, remove \
         {path}-wal and {path}-shm), or salvage what SQLite can still read: \
         `sqlite3 {path} .recover > salvaged.sql` (or `.dump` with an older sqlite3), \
         `sqlite3 fresh.db < salvaged.sql`, then move fresh.db to {path}"
    )]
    Damaged { path: String, detail: String },
    #[error(
        "this server no longer leads: the leadership lease moved past epoch {held:?} to another \
         replica, so it may not change task state (send the request to the current leader)"
    )]
    Fenced { held: Option<u64> },
}

/// A lost or refused connection is [`StoreError::Unavailable`] (the request may succeed
/// once the database is back), anything else [`StoreError::Database`].
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if is_unavailable(&error) {
            StoreError::Unavailable(error)
        } else {
            StoreError::Database(error)
        }
    }
}

/// A fault of the server's storage rather than of the request: what callers answer with a
/// 5xx, never with "invalid input".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// The disk holding the database is full (`SQLITE_FULL`, `ENOSPC`).
    Full,
    /// The database is locked or cannot be reached for now (`SQLITE_BUSY`, a lost connection).
    Unavailable,
}

impl StoreError {
    /// Whether the error is the storage's fault (full, locked, gone), and which.
    pub fn storage_fault(&self) -> Option<StorageFault> {
        let error = match self {
            StoreError::Database(error) => error,
            // Another replica leads now: the request may succeed there, or here later.
            StoreError::Fenced { .. } => return Some(StorageFault::Unavailable),
            StoreError::Unavailable(sqlx::Error::Io(io)) if io.raw_os_error() == Some(28) => {
                return Some(StorageFault::Full);
            }
            StoreError::Unavailable(_) => return Some(StorageFault::Unavailable),
            _ => return None,
        };
        match error {
            sqlx::Error::Database(db)
                if db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some() =>
            {
                // PostgreSQL's disk_full and out_of_memory; lost connections are
                // `Unavailable` already (see `is_unavailable`).
                match db.code()?.as_ref() {
                    "53100" => Some(StorageFault::Full),
                    "53200" | "53300" => Some(StorageFault::Unavailable),
                    _ => None,
                }
            }
            sqlx::Error::Database(db) => {
                // SQLite's primary result code is the low byte of the extended one.
                let code = db.code()?.parse::<i64>().ok()? & 0xff;
                match code {
                    // SQLITE_FULL; SQLITE_IOERR carries ENOSPC when a write fails for space.
                    13 => Some(StorageFault::Full),
                    10 if db.message().contains("disk") => Some(StorageFault::Full),
                    // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_CANTOPEN.
                    5 | 6 | 10 | 14 => Some(StorageFault::Unavailable),
                    _ => None,
                }
            }
            sqlx::Error::Io(io) if io.raw_os_error() == Some(28) => Some(StorageFault::Full),
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Some(StorageFault::Unavailable),
            _ => None,
        }
    }
}

/// Whether `error` says the database cannot be reached now rather than that a statement
/// failed: the connection broke or could not be had, the server is shutting down or
/// starting, or it lets no more connections in (SQLSTATE class 08, 57P01 to 57P03, 53300).
fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Durable control-plane state. Every method is one transaction: when it returns `Ok`, the
/// change survives a crash of the process, and once a later [`Store::sync`] returns `Ok`
/// it survives a power loss too.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Returns once every change made before the call survives a power loss. The server
    /// answers no request before its sync (group commit: one sync serves every request
    /// waiting, instead of one per transaction). PostgreSQL commits are durable when they
    /// return (the server groups their WAL flushes itself), and the memory store keeps
    /// nothing, so both return at once; SQLite syncs its write-ahead log.
    async fn sync(&self) -> Result<()>;

    /// Insert a queued task (attempt 1) and its first event; assigns the id.
    async fn create_task(&self, task: NewTask) -> Result<TaskRecord>;
    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>>;
    /// Tasks matching the filter, newest first.
    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>>;
    /// How many tasks match the filter (its `limit` is ignored).
    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64>;
    async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>>;
    /// Apply all changes atomically, or none.
    async fn apply(&self, changes: &[TaskChange]) -> Result<()>;

    /// Insert the node or, when its name is known, update it and keep its id.
    async fn register_node(&self, node: NewNode) -> Result<NodeRecord>;
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>>;
    /// Mark a node drained (or not); false when the node is unknown. A re-registration
    /// keeps the mark.
    async fn set_node_drained(&self, node: NodeId, drained: bool) -> Result<bool>;
    /// Forget a node; false when it is unknown. Its name registers afresh later.
    async fn remove_node(&self, node: NodeId) -> Result<bool>;
    /// An administrator approves a pending node; false when the node is unknown.
    async fn approve_node(&self, node: NodeId) -> Result<bool>;

    /// Record a committed snapshot's manifest (idempotent).
    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        total_bytes: u64,
        at: tacc_core::Timestamp,
    ) -> Result<()>;
    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>>;
    /// Every committed snapshot's id (what the chunk garbage collector must keep).
    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>>;

    /// Record one kept file of one rank of an attempt; the same (attempt, rank, path)
    /// again replaces its size (an upload repeated).
    async fn add_output(&self, output: OutputRecord) -> Result<()>;
    /// A task's outputs of every attempt and rank, by attempt, rank, then path.
    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>>;

    // ------------------------------------------------------------ usage

    /// Raise the kept peak of `peak`'s task, attempt and rank to at least `peak`, each
    /// measure on its own (a lower value never lowers a kept one). `TaskNotFound` when
    /// the task does not exist.
    async fn record_usage_peak(&self, peak: UsagePeak) -> Result<()>;
    /// A task's peaks by attempt, then rank.
    async fn list_usage_peaks(&self, task: TaskId) -> Result<Vec<UsagePeak>>;
    /// Every task (of `user`, when given) that may have held resources at some time in
    /// `[since, until)`, with all its events, by task id: it entered `starting` before
    /// `until`, and it either has an event at or after `since` or is starting or running
    /// now. A superset: the caller clips each attempt to the window itself.
    async fn tasks_active_between(
        &self,
        since: tacc_core::Timestamp,
        until: tacc_core::Timestamp,
        user: Option<&str>,
    ) -> Result<Vec<TaskHistory>>;

    // ------------------------------------------------------------ adaptive allocation

    /// A task's allocation changes (`TaskChange::Resized`), oldest first.
    async fn list_resizes(&self, task: TaskId) -> Result<Vec<ResizeRecord>>;
    /// Keep a point of an attempt's signal series, and only the newest `keep` points of
    /// that attempt. `TaskNotFound` when the task does not exist.
    async fn record_signal_point(&self, point: SignalRecord, keep: u32) -> Result<()>;
    /// A task's kept signal points of every attempt, by attempt, then time.
    async fn list_signal_points(&self, task: TaskId) -> Result<Vec<SignalRecord>>;
    // ------------------------------------------------------------ groups

    /// Create a group and all its elements (queued, attempt 1, each with its index) in one
    /// transaction: all of them or none. Elements get increasing ids in the order given.
    async fn create_group(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)>;
    async fn get_group(&self, id: GroupId) -> Result<Option<GroupRecord>>;
    /// Groups matching the filter, newest first.
    async fn list_groups(&self, filter: &GroupFilter) -> Result<Vec<GroupRecord>>;
    /// How many of a group's elements are in each state (states with none left out).
    async fn group_counts(&self, id: GroupId) -> Result<BTreeMap<TaskState, u64>>;
    /// Whether any element of the group has not ended (queued, starting or running): one
    /// probe of the group's index whatever its size, for a follower woken at every end.
    /// False for a group that does not exist.
    async fn group_has_open(&self, id: GroupId) -> Result<bool>;
    /// Add elements to an existing group (a sweep's next trials), queued like
    /// [`Store::create_group`]'s, in one transaction; the group's size grows by as many.
    /// `GroupNotFound` when it does not exist.
    async fn add_group_elements(
        &self,
        group: GroupId,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<Vec<TaskRecord>>;

    // ------------------------------------------------------------ metrics

    /// Append reported points (their `seq` is assigned here, continuing the attempt's),
    /// keeping at most [`MAX_METRIC_POINTS_PER_ATTEMPT`] per attempt: beyond that they are
    /// dropped. `TaskNotFound` when a task does not exist (nothing is kept then).
    async fn append_metrics(&self, points: Vec<MetricPoint>) -> Result<()>;
    /// A task's points of every attempt, by attempt, then arrival.
    async fn list_metrics(&self, task: TaskId) -> Result<Vec<MetricPoint>>;

    // ------------------------------------------------------------ pipelines

    /// Create a `pipeline` group, its stages' tasks and array groups, and the stage rows
    /// (needs, cache keys), all in one transaction. A single-task stage is an element of
    /// the pipeline group with its position as index; the tasks come back in stage order.
    async fn create_pipeline(
        &self,
        group: NewGroup,
        stages: Vec<NewStage>,
    ) -> Result<(GroupRecord, Vec<StageRecord>, Vec<TaskRecord>)>;
    /// A pipeline's stages, by position.
    async fn pipeline_stages(&self, pipeline: GroupId) -> Result<Vec<StageRecord>>;
    /// The stage that ran as this task or array group (not one that reused it).
    async fn stage_of(&self, source: StageSource) -> Result<Option<StageRecord>>;
    /// Stages of the user's pipeline of that name and stage name with this cache key,
    /// newest first (the caller checks that the run they point at succeeded).
    async fn stages_with_key(
        &self,
        user: &str,
        pipeline: &str,
        stage: &str,
        cache_key: &str,
    ) -> Result<Vec<StageRecord>>;

    /// Ended tasks matching the filter, newest end first (then highest id).
    async fn task_history(&self, filter: &HistoryFilter) -> Result<Vec<TaskRecord>>;

    // ------------------------------------------------------------ notification outbox

    /// Undelivered notifications due at `now`, soonest first (queued through
    /// [`TaskChange::Notify`]).
    async fn due_deliveries(&self, now: Timestamp, limit: u32) -> Result<Vec<DeliveryRecord>>;
    /// Record how a try went (counts the try); false when there is no such delivery.
    async fn finish_delivery(&self, id: u64, outcome: DeliveryOutcome) -> Result<bool>;
    /// The delivery queued under `key`.
    async fn get_delivery(&self, key: &str) -> Result<Option<DeliveryRecord>>;

    // ------------------------------------------------------------ idempotency keys

    /// The reply kept under `user`'s `key`, unless it expired at `now`.
    async fn kept_reply(&self, user: &str, key: &str, now: Timestamp) -> Result<Option<KeptReply>>;
    /// Keep a reply on its own, for work that is idempotent by itself (a cancel).
    /// `AlreadyExists` when the user's key is kept and not expired at `kept.key.created_at`.
    async fn keep_reply(&self, kept: KeptReply) -> Result<()>;
    /// [`Store::create_task`] and the key with its rendered reply, in one transaction.
    /// `AlreadyExists` (and nothing created) when the key is taken.
    async fn create_task_keyed(&self, task: NewTask, keyed: Keyed) -> Result<TaskRecord>;
    /// [`Store::create_group`] and the key with its rendered reply, in one transaction.
    /// `AlreadyExists` (and nothing created) when the key is taken.
    async fn create_group_keyed(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
        keyed: Keyed,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)>;
    /// [`Store::create_pipeline`] and the key with its rendered reply, in one transaction.
    /// `AlreadyExists` (and nothing created) when the key is taken.
    async fn create_pipeline_keyed(
        &self,
        group: NewGroup,
        stages: Vec<NewStage>,
        keyed: Keyed,
    ) -> Result<(GroupRecord, Vec<StageRecord>, Vec<TaskRecord>)>;

    // ------------------------------------------------------------ leadership lease

    /// Take the leadership lease when no one holds it or it lapsed at `claim.now`, raising
    /// its epoch; `None` while another replica (or this one, see [`Store::renew_lease`])
    /// holds it. From then on this store checks that epoch in every transaction that
    /// changes task state ([`StoreError::Fenced`] once it moved on).
    async fn try_acquire_lease(&self, claim: &LeaseClaim) -> Result<Option<LeaderLease>>;
    /// Extend the lease held under `epoch` to `claim.now + claim.ttl_ms`; `None` when it was
    /// taken over (its epoch moved on) or another holder has it.
    async fn renew_lease(&self, claim: &LeaseClaim, epoch: u64) -> Result<Option<LeaderLease>>;
    /// The lease as stored, lapsed or not; `None` before any replica took it.
    async fn current_lease(&self) -> Result<Option<LeaderLease>>;
    /// A handle on the same database whose task-state writes are checked against `epoch`
    /// alone, whatever this handle wins or loses later; `None` for a store whose writes
    /// are never fenced (it serves one server, not replicas). A leadership term's control
    /// plane writes through it, so nothing of a term that ended (a request still under
    /// way, a loop being stopped) commits in a later term the same replica wins.
    fn for_term(&self, _epoch: u64) -> Option<std::sync::Arc<dyn Store>> {
        None
    }

    // ------------------------------------------------------------ identities

    /// Add a user; `AlreadyExists` when the name is taken.
    async fn create_user(&self, user: UserRecord) -> Result<()>;
    async fn get_user(&self, name: &str) -> Result<Option<UserRecord>>;
    /// Every user, by name.
    async fn list_users(&self) -> Result<Vec<UserRecord>>;
    /// Record a token; assigns its id. `AlreadyExists` when the hash is taken.
    async fn create_token(&self, token: NewToken) -> Result<TokenRecord>;
    /// The token whose secret hashes to `hash`, revoked and expired ones included.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;
    async fn get_token(&self, id: u64) -> Result<Option<TokenRecord>>;
    /// Tokens by id; only those of `user` when given.
    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenRecord>>;
    /// Mark a token revoked at `at`; false when it does not exist or was revoked already.
    async fn revoke_token(&self, id: u64, at: tacc_core::Timestamp) -> Result<bool>;
    /// Use join token `token` to enrol the node `node_name`, atomically: admitted (and
    /// counted) only while the token has enrolled fewer nodes than its scope allows, is
    /// bound to no other name, and has not enrolled this name before. Validity (expiry,
    /// revocation) is the caller's to check.
    async fn enrol_node(
        &self,
        token: u64,
        node_name: &str,
        at: tacc_core::Timestamp,
    ) -> Result<Enrolment>;

    // ------------------------------------------------------------ task uids

    /// The Unix uid `user`'s tasks run as on every node, allocated now (the lowest uid at
    /// least `base` above every uid handed out so far) when they have none. A user keeps
    /// their uid for good, also across restarts and a changed `base`; no uid is ever given
    /// to two users, however many servers allocate at once.
    async fn task_uid(&self, user: &str, base: u32) -> Result<u32>;
    /// Every user's task uid, by user.
    async fn list_task_uids(&self) -> Result<Vec<(String, u32)>>;

    // ------------------------------------------------------------ restart facts

    /// How the node ranks of `task`'s attempt `attempt` that ended so far ended, by rank.
    async fn rank_ends(&self, task: TaskId, attempt: tacc_core::AttemptNo) -> Result<Vec<RankEnd>>;
    /// Keep these groups' fair-share ledgers (replacing what was kept for them).
    async fn save_fairshare(&self, ledgers: &[FairShareLedger]) -> Result<()>;
    /// Every group's kept fair-share ledger, by group.
    async fn load_fairshare(&self) -> Result<Vec<FairShareLedger>>;
    /// When these nodes were last heard from (a removed node is skipped).
    async fn save_nodes_seen(&self, seen: &[(NodeId, Timestamp)]) -> Result<()>;
    /// How long `user`'s latest succeeded tasks named `name` ran (milliseconds, newest
    /// first, at most `limit`).
    async fn recent_run_times(&self, user: &str, name: &str, limit: u32) -> Result<Vec<u64>>;
    /// Keep a dashboard session (replacing one with its key).
    async fn put_dashboard_session(&self, session: DashboardSession) -> Result<()>;
    async fn dashboard_session(&self, key: &str) -> Result<Option<DashboardSession>>;
    /// Forget a session (signed out); false when there was none.
    async fn delete_dashboard_session(&self, key: &str) -> Result<bool>;
    /// Forget the sessions opened before `before`; how many were.
    async fn prune_dashboard_sessions(&self, before: Timestamp) -> Result<u64>;

    // ------------------------------------------------------------ audit

    async fn append_audit(&self, entry: NewAuditEntry) -> Result<()>;
    /// Delete the entries from before `before` (`--audit-retention`); how many were.
    async fn prune_audit(&self, before: tacc_core::Timestamp) -> Result<u64>;
    /// The newest `limit` entries at or after `since`, oldest first.
    async fn list_audit(
        &self,
        since: Option<tacc_core::Timestamp>,
        limit: u32,
    ) -> Result<Vec<AuditEntry>>;

    // ------------------------------------------------------------ secrets

    /// Insert or replace a user's secret.
    async fn put_secret(&self, secret: SecretRecord) -> Result<()>;
    async fn get_secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>>;
    /// A user's secrets, by name.
    async fn list_secrets(&self, user: &str) -> Result<Vec<SecretRecord>>;
    /// False when there was no such secret.
    async fn delete_secret(&self, user: &str, name: &str) -> Result<bool>;

    // ------------------------------------------------------------ snapshot ownership

    /// Record that `user` committed `snapshot` (idempotent).
    async fn add_snapshot_owner(&self, owner: SnapshotOwner) -> Result<()>;
    async fn is_snapshot_owner(&self, snapshot: &SnapshotId, user: &str) -> Result<bool>;
    /// Record that `user` uploaded these chunks (idempotent): proof they hold the bytes.
    async fn add_chunk_owners(&self, user: &str, hashes: &[String]) -> Result<()>;
    /// Which of `hashes` `user` uploaded.
    async fn owned_chunks(
        &self,
        user: &str,
        hashes: &[String],
    ) -> Result<std::collections::BTreeSet<String>>;
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_lost_connection_is_unavailable_and_a_bad_statement_is_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for error in [
            sqlx::Error::Io(refused),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
        ] {
            let mapped = StoreError::from(error);
            assert!(matches!(mapped, StoreError::Unavailable(_)), "{mapped:?}");
            assert!(
                mapped.to_string().contains("database server is running"),
                "{mapped}"
            );
        }
        let mapped = StoreError::from(sqlx::Error::RowNotFound);
        assert!(matches!(mapped, StoreError::Database(_)), "{mapped:?}");
    }
}
