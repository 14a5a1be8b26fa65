//! The embedded store in SQLite: its file, its connection threads (WAL, one writer thread,
//! a few reader threads: [`threads`]; commits made durable in groups by [`durability`]) and
//! its transactions. The SQL it runs is shared with the PostgreSQL store ([`crate::sql`];
//! rows decoded by [`crate::rows`]), run on its connections through [`run`].
//!
//! Each call of the store is one job on one connection thread: a write's whole transaction
//! (BEGIN, its statements, COMMIT) runs there at once, so a call costs one hand-off between
//! threads whatever number of statements it runs. sqlx still opens the file first, to check
//! its integrity and run the migrations (databases carry sqlx's `_sqlx_migrations` table),
//! then closes; the threads' connections are rusqlite's, on the same linked SQLite.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tacc_core::{GroupId, NodeId, SnapshotId, TaskId, TaskState, Timestamp};

use crate::sql::{access, changes, groups, idempotency, lease, pipelines, tasks};
use crate::{
    AuditEntry, DeliveryOutcome, DeliveryRecord, Enrolment, GroupFilter, GroupRecord,
    HistoryFilter, NewAuditEntry, NewGroup, NewNode, NewTask, NewToken, NodeRecord, OutputRecord,
    Result, SecretRecord, SnapshotOwner, Store, StoreError, TaskChange, TaskEvent, TaskFilter,
    TaskHistory, TaskRecord, TokenRecord, UsagePeak, UserRecord,
};

mod connect;
mod durability;
mod fault;
mod integrity;
mod run;
mod threads;

use durability::Durability;
use run::{Conn, Tx, block};
use threads::Threads;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Reader connections, each on its own thread: reads run beside the writer, as WAL allows.
const READERS: usize = 4;

/// The embedded store: one SQLite file in WAL mode. A write that returned survives
/// `kill -9`; [`Store::sync`] makes every write before it survive a power loss too, one
/// `fsync` for all the writes of many requests ([`durability`]).
///
/// Writes go through exactly one connection, on one thread: SQLite allows one writer at a
/// time, and a read transaction upgraded to a write after another connection committed
/// fails at once (`SQLITE_BUSY`, which no busy timeout waits out). Reads use their own
/// connections and run beside the writer.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<Threads>,
    readers: Arc<Threads>,
    durability: Arc<Durability>,
}

impl SqliteStore {
    /// Open (creating if needed) the database file and bring its schema up to date,
    /// after checking the file is sound ([`integrity`]; [`StoreError::Damaged`] if not).
    pub async fn open(path: &Path) -> Result<Self> {
        Self::open_checked(path, integrity::CHECK_BUDGET).await
    }

    /// [`SqliteStore::open`] with the integrity check bounded by `budget`.
    pub async fn open_checked(path: &Path, budget: Duration) -> Result<Self> {
        // The settings sqlx opens with for the check and the migrations; the threads'
        // connections get the same ones (`connect`).
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(connect::BUSY_TIMEOUT);
        let open_error = |source: sqlx::Error| {
            if integrity::is_damage(&source) {
                return integrity::damaged(path, source.to_string());
            }
            StoreError::Open {
                path: path.display().to_string(),
                source,
                hint: "check the directory exists and is writable",
            }
        };
        if integrity::check(&options, path, budget).await? == integrity::Checked::Unfinished {
            tracing::warn!(
                "the integrity check of {} did not finish within {}s (a large database); \
                 what it read is sound",
                path.display(),
                budget.as_secs()
            );
        }
        let migrating = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        let migrated = MIGRATOR.run(&migrating).await;
        migrating.close().await;
        migrated?;

        let owned = path.to_path_buf();
        let open: threads::Open = Arc::new(move || connect::connect(&owned));
        let connections = |count: usize| {
            (0..count)
                .map(|_| open())
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| open_error(fault::from_rusqlite(e)))
        };
        let started = |e: std::io::Error| StoreError::Open {
            path: path.display().to_string(),
            source: sqlx::Error::Io(e),
            hint: "the system refused a new thread: check the process and memory limits",
        };
        let writer = Threads::start("tacc-db-writer", connections(1)?, true, open.clone())
            .map_err(started)?;
        let readers = Threads::start("tacc-db-reader", connections(READERS)?, false, open)
            .map_err(started)?;
        let durability = Arc::new(Durability::new(path, Arc::new(durability::Fsync)));
        Ok(SqliteStore {
            writer: Arc::new(writer),
            readers: Arc::new(readers),
            durability,
        })
    }

    /// How many times the write-ahead log was synced since the store was opened.
    pub fn syncs(&self) -> u64 {
        self.durability.syncs()
    }

    /// A read: one job on a reader thread.
    async fn read<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.readers.run(job).await
    }

    /// A write of single statements, each committed on its own (or a shared path's own
    /// transaction): one job on the writer thread. It counts as written, for the next
    /// [`Store::sync`], when the job ends on the writer thread: its commit is in the log
    /// then, before this returns, and even when the caller stopped waiting (so a sync never
    /// counts a commit that has not happened yet as durable).
    async fn write<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let durability = self.durability.clone();
        self.writer
            .run(move |conn| {
                let _written = durability.writing();
                conn.no_open_transaction()?;
                job(conn)
            })
            .await
    }

    /// A write in one transaction, committed together or not at all: one job.
    async fn transact<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Tx<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.write(move |conn| {
            let mut tx = conn.begin(true)?;
            let made = job(&mut tx)?;
            tx.commit()?;
            Ok(made)
        })
        .await
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn sync(&self) -> Result<()> {
        self.durability.barrier().await
    }

    async fn try_acquire_lease(
        &self,
        claim: &crate::LeaseClaim,
    ) -> Result<Option<crate::LeaderLease>> {
        let claim = claim.clone();
        self.write(move |c| block(lease::try_acquire(c, &claim)))
            .await
    }

    async fn renew_lease(
        &self,
        claim: &crate::LeaseClaim,
        epoch: u64,
    ) -> Result<Option<crate::LeaderLease>> {
        let claim = claim.clone();
        self.write(move |c| block(lease::renew(c, &claim, epoch)))
            .await
    }

    async fn current_lease(&self) -> Result<Option<crate::LeaderLease>> {
        self.read(|c| block(lease::current(c))).await
    }

    async fn create_task(&self, task: NewTask) -> Result<TaskRecord> {
        self.transact(move |tx| block(changes::insert_task(tx, task)))
            .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        self.read(move |c| block(tasks::get_task(c, id))).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>> {
        let filter = filter.clone();
        self.read(move |c| block(tasks::list_tasks(c, &filter)))
            .await
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64> {
        let filter = filter.clone();
        self.read(move |c| block(tasks::count_tasks(c, &filter)))
            .await
    }

    async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>> {
        self.read(move |c| block(tasks::task_events(c, id))).await
    }

    async fn apply(&self, changes: &[TaskChange]) -> Result<()> {
        if changes.is_empty() {
            // Nothing to commit, so nothing for the next sync to cover.
            return Ok(());
        }
        let changes = changes.to_vec();
        self.transact(move |tx| block(changes::apply_changes(tx, &changes)))
            .await
    }

    async fn register_node(&self, node: NewNode) -> Result<NodeRecord> {
        self.write(move |c| block(tasks::register_node(c, node)))
            .await
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>> {
        self.read(|c| block(tasks::list_nodes(c))).await
    }

    async fn set_node_drained(&self, node: NodeId, drained: bool) -> Result<bool> {
        self.write(move |c| block(tasks::set_node_drained(c, node, drained)))
            .await
    }

    async fn remove_node(&self, node: NodeId) -> Result<bool> {
        self.write(move |c| block(tasks::remove_node(c, node)))
            .await
    }

    async fn approve_node(&self, node: NodeId) -> Result<bool> {
        self.write(move |c| block(tasks::approve_node(c, node)))
            .await
    }

    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        total_bytes: u64,
        at: Timestamp,
    ) -> Result<()> {
        let (id, manifest) = (id.clone(), manifest.clone());
        self.write(move |c| block(tasks::put_snapshot(c, &id, &manifest, total_bytes, at)))
            .await
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>> {
        let id = id.clone();
        self.read(move |c| block(tasks::get_snapshot(c, &id))).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>> {
        self.read(|c| block(tasks::list_snapshots(c))).await
    }

    async fn add_output(&self, output: OutputRecord) -> Result<()> {
        self.write(move |c| block(tasks::add_output(c, output)))
            .await
    }

    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>> {
        self.read(move |c| block(tasks::list_outputs(c, task)))
            .await
    }

    async fn list_resizes(&self, task: TaskId) -> Result<Vec<crate::ResizeRecord>> {
        self.read(move |c| block(tasks::list_resizes(c, task)))
            .await
    }

    async fn record_signal_point(&self, point: crate::SignalRecord, keep: u32) -> Result<()> {
        self.transact(move |tx| block(changes::record_signal_point(tx, point, keep)))
            .await
    }

    async fn list_signal_points(&self, task: TaskId) -> Result<Vec<crate::SignalRecord>> {
        self.read(move |c| block(tasks::list_signal_points(c, task)))
            .await
    }

    async fn record_usage_peak(&self, peak: UsagePeak) -> Result<()> {
        self.write(move |c| block(tasks::record_usage_peak(c, peak)))
            .await
    }

    async fn list_usage_peaks(&self, task: TaskId) -> Result<Vec<UsagePeak>> {
        self.read(move |c| block(tasks::list_usage_peaks(c, task)))
            .await
    }

    async fn tasks_active_between(
        &self,
        since: Timestamp,
        until: Timestamp,
        user: Option<&str>,
    ) -> Result<Vec<TaskHistory>> {
        let user = user.map(str::to_string);
        // One read transaction: the tasks and their events come from the same snapshot.
        self.read(move |c| {
            let mut tx = c.begin(false)?;
            let active = block(tasks::active_between(
                &mut tx,
                since,
                until,
                user.as_deref(),
            ))?;
            tx.commit()?;
            Ok(active)
        })
        .await
    }

    async fn create_group(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        self.transact(move |tx| block(groups::insert_group(tx, group, elements)))
            .await
    }

    async fn add_group_elements(
        &self,
        group: GroupId,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<Vec<TaskRecord>> {
        self.transact(move |tx| block(groups::add_elements(tx, group, elements)))
            .await
    }

    async fn append_metrics(&self, points: Vec<crate::MetricPoint>) -> Result<()> {
        self.transact(move |tx| block(changes::append_metrics(tx, &points)))
            .await
    }

    async fn list_metrics(&self, task: TaskId) -> Result<Vec<crate::MetricPoint>> {
        self.read(move |c| block(tasks::list_metrics(c, task)))
            .await
    }

    async fn get_group(&self, id: GroupId) -> Result<Option<GroupRecord>> {
        self.read(move |c| block(groups::get_group(c, id))).await
    }

    async fn list_groups(&self, filter: &GroupFilter) -> Result<Vec<GroupRecord>> {
        let filter = filter.clone();
        self.read(move |c| block(groups::list_groups(c, &filter)))
            .await
    }

    async fn group_counts(
        &self,
        id: GroupId,
    ) -> Result<std::collections::BTreeMap<TaskState, u64>> {
        self.read(move |c| block(groups::group_counts(c, id))).await
    }

    async fn group_has_open(&self, id: GroupId) -> Result<bool> {
        self.read(move |c| block(groups::group_has_open(c, id)))
            .await
    }

    async fn create_pipeline(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        self.transact(move |tx| block(pipelines::insert_pipeline(tx, group, stages)))
            .await
    }

    async fn pipeline_stages(&self, pipeline: GroupId) -> Result<Vec<crate::StageRecord>> {
        self.read(move |c| block(pipelines::pipeline_stages(c, pipeline)))
            .await
    }

    async fn stage_of(&self, source: crate::StageSource) -> Result<Option<crate::StageRecord>> {
        self.read(move |c| block(pipelines::stage_of(c, source)))
            .await
    }

    async fn stages_with_key(
        &self,
        user: &str,
        pipeline: &str,
        stage: &str,
        cache_key: &str,
    ) -> Result<Vec<crate::StageRecord>> {
        let (user, pipeline, stage, cache_key) = (
            user.to_string(),
            pipeline.to_string(),
            stage.to_string(),
            cache_key.to_string(),
        );
        self.read(move |c| {
            block(pipelines::stages_with_key(
                c, &user, &pipeline, &stage, &cache_key,
            ))
        })
        .await
    }

    async fn task_history(&self, filter: &HistoryFilter) -> Result<Vec<TaskRecord>> {
        let filter = filter.clone();
        self.read(move |c| block(groups::task_history(c, &filter)))
            .await
    }

    async fn due_deliveries(&self, now: Timestamp, limit: u32) -> Result<Vec<DeliveryRecord>> {
        self.read(move |c| block(groups::due_deliveries(c, now, limit)))
            .await
    }

    async fn finish_delivery(&self, id: u64, outcome: DeliveryOutcome) -> Result<bool> {
        self.write(move |c| block(groups::finish_delivery(c, id, outcome)))
            .await
    }

    async fn get_delivery(&self, key: &str) -> Result<Option<DeliveryRecord>> {
        let key = key.to_string();
        self.read(move |c| block(groups::get_delivery(c, &key)))
            .await
    }

    async fn kept_reply(
        &self,
        user: &str,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<crate::KeptReply>> {
        let (user, key) = (user.to_string(), key.to_string());
        self.read(move |c| block(idempotency::kept_reply(c, &user, &key, now)))
            .await
    }

    async fn keep_reply(&self, kept: crate::KeptReply) -> Result<()> {
        self.transact(move |tx| block(idempotency::insert_key(tx, &kept)))
            .await
    }

    async fn create_task_keyed(&self, task: NewTask, keyed: crate::Keyed) -> Result<TaskRecord> {
        self.transact(move |tx| {
            let record = block(changes::insert_task(tx, task))?;
            let kept = keyed.kept(crate::Created::Task(&record));
            block(idempotency::insert_key(tx, &kept))?;
            Ok(record)
        })
        .await
    }

    async fn create_group_keyed(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
        keyed: crate::Keyed,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        self.transact(move |tx| {
            let (record, tasks) = block(groups::insert_group(tx, group, elements))?;
            let kept = keyed.kept(crate::Created::Group(&record, &tasks));
            block(idempotency::insert_key(tx, &kept))?;
            Ok((record, tasks))
        })
        .await
    }

    async fn create_pipeline_keyed(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
        keyed: crate::Keyed,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        self.transact(move |tx| {
            let made = block(pipelines::insert_pipeline(tx, group, stages))?;
            let kept = keyed.kept(crate::Created::Pipeline(&made.0, &made.1, &made.2));
            block(idempotency::insert_key(tx, &kept))?;
            Ok(made)
        })
        .await
    }

    async fn create_user(&self, user: UserRecord) -> Result<()> {
        self.write(move |c| block(access::create_user(c, user)))
            .await
    }

    async fn get_user(&self, name: &str) -> Result<Option<UserRecord>> {
        let name = name.to_string();
        self.read(move |c| block(access::get_user(c, &name))).await
    }

    async fn list_users(&self) -> Result<Vec<UserRecord>> {
        self.read(|c| block(access::list_users(c))).await
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        self.write(move |c| block(access::create_token(c, token)))
            .await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let hash = hash.to_string();
        self.read(move |c| block(access::token_by_hash(c, &hash)))
            .await
    }

    async fn get_token(&self, id: u64) -> Result<Option<TokenRecord>> {
        self.read(move |c| block(access::get_token(c, id))).await
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenRecord>> {
        let user = user.map(str::to_string);
        self.read(move |c| block(access::list_tokens(c, user.as_deref())))
            .await
    }

    async fn revoke_token(&self, id: u64, at: Timestamp) -> Result<bool> {
        self.write(move |c| block(access::revoke_token(c, id, at)))
            .await
    }

    async fn enrol_node(&self, token: u64, node_name: &str, at: Timestamp) -> Result<Enrolment> {
        let node_name = node_name.to_string();
        self.transact(move |tx| block(access::enrol_node(tx, token, &node_name, at)))
            .await
    }

    async fn append_audit(&self, entry: NewAuditEntry) -> Result<()> {
        self.write(move |c| block(access::append_audit(c, entry)))
            .await
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        self.write(move |c| block(access::prune_audit(c, before)))
            .await
    }

    async fn list_audit(&self, since: Option<Timestamp>, limit: u32) -> Result<Vec<AuditEntry>> {
        self.read(move |c| block(access::list_audit(c, since, limit)))
            .await
    }

    async fn rank_ends(
        &self,
        task: tacc_core::TaskId,
        attempt: tacc_core::AttemptNo,
    ) -> Result<Vec<crate::RankEnd>> {
        self.read(move |c| block(crate::sql::restart_facts::rank_ends(c, task, attempt)))
            .await
    }

    async fn save_fairshare(&self, ledgers: &[crate::FairShareLedger]) -> Result<()> {
        let ledgers = ledgers.to_vec();
        self.transact(move |tx| block(crate::sql::restart_facts::save_fairshare(tx, &ledgers)))
            .await
    }

    async fn load_fairshare(&self) -> Result<Vec<crate::FairShareLedger>> {
        self.read(|c| block(crate::sql::restart_facts::load_fairshare(c)))
            .await
    }

    async fn save_nodes_seen(&self, seen: &[(NodeId, tacc_core::Timestamp)]) -> Result<()> {
        let seen = seen.to_vec();
        self.transact(move |tx| block(crate::sql::restart_facts::save_nodes_seen(tx, &seen)))
            .await
    }

    async fn recent_run_times(&self, user: &str, name: &str, limit: u32) -> Result<Vec<u64>> {
        let (user, name) = (user.to_string(), name.to_string());
        self.read(move |c| {
            block(crate::sql::restart_facts::recent_run_times(
                c, &user, &name, limit,
            ))
        })
        .await
    }

    async fn put_dashboard_session(&self, session: crate::DashboardSession) -> Result<()> {
        self.write(move |c| block(crate::sql::restart_facts::put_dashboard_session(c, session)))
            .await
    }

    async fn dashboard_session(&self, key: &str) -> Result<Option<crate::DashboardSession>> {
        let key = key.to_string();
        self.read(move |c| block(crate::sql::restart_facts::dashboard_session(c, &key)))
            .await
    }

    async fn delete_dashboard_session(&self, key: &str) -> Result<bool> {
        let key = key.to_string();
        self.write(move |c| block(crate::sql::restart_facts::delete_dashboard_session(c, &key)))
            .await
    }

    async fn prune_dashboard_sessions(&self, before: tacc_core::Timestamp) -> Result<u64> {
        self.write(move |c| {
            block(crate::sql::restart_facts::prune_dashboard_sessions(
                c, before,
            ))
        })
        .await
    }

    async fn task_uid(&self, user: &str, base: u32) -> Result<u32> {
        let user = user.to_string();
        self.write(move |c| block(crate::sql::task_uids::task_uid(c, &user, base)))
            .await
    }

    async fn list_task_uids(&self) -> Result<Vec<(String, u32)>> {
        self.read(|c| block(crate::sql::task_uids::list_task_uids(c)))
            .await
    }

    async fn put_secret(&self, secret: SecretRecord) -> Result<()> {
        self.write(move |c| block(access::put_secret(c, secret)))
            .await
    }

    async fn get_secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>> {
        let (user, name) = (user.to_string(), name.to_string());
        self.read(move |c| block(access::get_secret(c, &user, &name)))
            .await
    }

    async fn list_secrets(&self, user: &str) -> Result<Vec<SecretRecord>> {
        let user = user.to_string();
        self.read(move |c| block(access::list_secrets(c, &user)))
            .await
    }

    async fn delete_secret(&self, user: &str, name: &str) -> Result<bool> {
        let (user, name) = (user.to_string(), name.to_string());
        self.write(move |c| block(access::delete_secret(c, &user, &name)))
            .await
    }

    async fn add_snapshot_owner(&self, owner: SnapshotOwner) -> Result<()> {
        self.write(move |c| block(access::add_snapshot_owner(c, owner)))
            .await
    }

    async fn is_snapshot_owner(&self, snapshot: &SnapshotId, user: &str) -> Result<bool> {
        let (snapshot, user) = (snapshot.clone(), user.to_string());
        self.read(move |c| block(access::is_snapshot_owner(c, &snapshot, &user)))
            .await
    }

    async fn add_chunk_owners(&self, user: &str, hashes: &[String]) -> Result<()> {
        let (user, hashes) = (user.to_string(), hashes.to_vec());
        self.write(move |c| block(access::add_chunk_owners(c, &user, &hashes)))
            .await
    }

    async fn owned_chunks(
        &self,
        user: &str,
        hashes: &[String],
    ) -> Result<std::collections::BTreeSet<String>> {
        let (user, hashes) = (user.to_string(), hashes.to_vec());
        self.read(move |c| block(access::owned_chunks(c, &user, &hashes)))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str) -> NewTask {
        crate::contract::new_task(name, "alice", 10)
    }

    /// A call costs one hand-off to a connection thread whatever number of statements it
    /// runs: a group of 50 elements, a batch of changes, a read transaction.
    #[tokio::test]
    async fn a_call_is_one_job_whatever_its_statements() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("tacc.db"))
            .await
            .unwrap();
        let (writes, reads) = (store.writer.sent(), store.readers.sent());
        let group = NewGroup {
            kind: crate::GroupKind::Array,
            name: "sweep".into(),
            user: "alice".into(),
            spec: serde_json::json!({}),
            created_at: Timestamp(10),
        };
        let elements = (0..50).map(|i| (i, task(&format!("e{i}")))).collect();
        let (_, made) = store.create_group(group, elements).await.unwrap();
        assert_eq!(made.len(), 50);
        assert_eq!(store.writer.sent(), writes + 1, "50 inserts, one job");
        let changes: Vec<TaskChange> = made
            .iter()
            .map(|t| TaskChange::Reason {
                task: t.id,
                reason: Some("why".into()),
            })
            .collect();
        store.apply(&changes).await.unwrap();
        assert_eq!(store.writer.sent(), writes + 2, "50 updates, one job");
        let listed = store.list_tasks(&TaskFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 50);
        store
            .tasks_active_between(Timestamp(0), Timestamp(100), None)
            .await
            .unwrap();
        assert_eq!(store.readers.sent(), reads + 2, "each read, one job");
    }
}
