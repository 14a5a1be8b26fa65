//! The embedded store in SQLite: its file and pools (WAL, one writer connection, commits
//! made durable in groups by [`durability`]) and its transactions. The SQL it runs is shared with the PostgreSQL store
//! ([`crate::sql`]; rows decoded by [`crate::rows`]), run on its pools through [`run`].

use std::path::Path;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tacc_core::{GroupId, NodeId, SnapshotId, TaskId, TaskState, Timestamp};

use crate::sql::{access, changes, groups, idempotency, lease, pipelines, tasks};
use crate::{
    AuditEntry, DeliveryOutcome, DeliveryRecord, Enrolment, GroupFilter, GroupRecord,
    HistoryFilter, NewAuditEntry, NewGroup, NewNode, NewTask, NewToken, NodeRecord, OutputRecord,
    Result, SecretRecord, SnapshotOwner, Store, StoreError, TaskChange, TaskEvent, TaskFilter,
    TaskHistory, TaskRecord, TokenRecord, UsagePeak, UserRecord,
};

mod durability;
mod integrity;
mod run;

use durability::Durability;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The embedded store: one SQLite file in WAL mode. A write that returned survives
/// `kill -9`; [`Store::sync`] makes every write before it survive a power loss too, one
/// `fsync` for all the writes of many requests ([`durability`]).
///
/// Writes go through a pool of exactly one connection: SQLite allows one writer at a time,
/// and a read transaction upgraded to a write after another connection committed fails
/// at once (`SQLITE_BUSY`, which no busy timeout waits out). Reads use their own pool and
/// run beside the writer, as WAL allows.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    durability: std::sync::Arc<Durability>,
}

impl SqliteStore {
    /// Open (creating if needed) the database file and bring its schema up to date,
    /// after checking the file is sound ([`integrity`]; [`StoreError::Damaged`] if not).
    pub async fn open(path: &Path) -> Result<Self> {
        Self::open_checked(path, integrity::CHECK_BUDGET).await
    }

    /// [`SqliteStore::open`] with the integrity check bounded by `budget`.
    pub async fn open_checked(path: &Path, budget: Duration) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // No fsync per commit: `sync` makes groups of commits durable (see
            // `durability`); checkpoints still sync the files they copy between.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            // Reads served from the page cache through a mapping, not a pread each.
            .pragma("mmap_size", "268435456")
            // A checkpoint syncs both files: every 10,000 pages (about 40 MiB of log)
            // instead of SQLite's 1,000, a trivial task's share of those syncs falls from
            // about 0.04 to 0.004 fsyncs (docs/BENCHMARKS.md, "Store commits per task").
            .pragma("wal_autocheckpoint", "10000")
            .busy_timeout(Duration::from_secs(10));
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
                "the integrity check of {} did not finish within {}s (a large database);                  what it read is sound",
                path.display(),
                budget.as_secs()
            );
        }
        let durability = std::sync::Arc::new(Durability::new(
            path,
            std::sync::Arc::new(durability::Fsync),
        ));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(|conn, _| Box::pin(no_transaction_left_open(conn)))
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        MIGRATOR.run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        Ok(SqliteStore {
            writer,
            reader,
            durability,
        })
    }

    /// How many times the write-ahead log was synced since the store was opened.
    pub fn syncs(&self) -> u64 {
        self.durability.syncs()
    }
}

/// Whether the writer connection may be used again: no transaction is left open on it.
///
/// A write that fails for space can leave one open: SQLite may roll back a transaction
/// itself when `COMMIT` fails with `SQLITE_FULL`, so sqlx's `ROLLBACK` on drop fails and
/// sqlx still counts the transaction; or a nested savepoint is rolled back to while the
/// outer transaction stays. Every later write would then run inside that transaction and
/// never commit: acknowledged, yet invisible and lost on restart. The pool closes such a
/// connection (SQLite rolls back whatever it held) and opens a fresh one.
async fn no_transaction_left_open(
    conn: &mut sqlx::SqliteConnection,
) -> std::result::Result<bool, sqlx::Error> {
    use sqlx::{Connection, TransactionManager};
    // The rollback a dropped transaction queued runs before this round trip returns.
    conn.ping().await?;
    let depth = sqlx::sqlite::SqliteTransactionManager::get_transaction_depth(conn);
    if depth != 0 {
        tracing::warn!(
            "a failed write left {depth} transaction(s) open on the database connection; \
             closing it and opening a fresh one"
        );
    }
    Ok(depth == 0)
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
        let _written = self.durability.writing();
        let lease = lease::try_acquire(&self.writer, claim).await?;
        Ok(lease)
    }

    async fn renew_lease(
        &self,
        claim: &crate::LeaseClaim,
        epoch: u64,
    ) -> Result<Option<crate::LeaderLease>> {
        let _written = self.durability.writing();
        let lease = lease::renew(&self.writer, claim, epoch).await?;
        Ok(lease)
    }

    async fn current_lease(&self) -> Result<Option<crate::LeaderLease>> {
        lease::current(&self.reader).await
    }

    async fn create_task(&self, task: NewTask) -> Result<TaskRecord> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let record = changes::insert_task(&mut tx, task).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        tasks::get_task(&self.reader, id).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>> {
        tasks::list_tasks(&self.reader, filter).await
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64> {
        tasks::count_tasks(&self.reader, filter).await
    }

    async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>> {
        tasks::task_events(&self.reader, id).await
    }

    async fn apply(&self, changes: &[TaskChange]) -> Result<()> {
        let _written = self.durability.writing();
        if changes.is_empty() {
            return Ok(());
        }
        let mut tx = self.writer.begin().await?;
        changes::apply_changes(&mut tx, changes).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn register_node(&self, node: NewNode) -> Result<NodeRecord> {
        let _written = self.durability.writing();
        tasks::register_node(&self.writer, node).await
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>> {
        tasks::list_nodes(&self.reader).await
    }

    async fn set_node_drained(&self, node: NodeId, drained: bool) -> Result<bool> {
        let _written = self.durability.writing();
        tasks::set_node_drained(&self.writer, node, drained).await
    }

    async fn remove_node(&self, node: NodeId) -> Result<bool> {
        let _written = self.durability.writing();
        tasks::remove_node(&self.writer, node).await
    }

    async fn approve_node(&self, node: NodeId) -> Result<bool> {
        let _written = self.durability.writing();
        tasks::approve_node(&self.writer, node).await
    }

    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        total_bytes: u64,
        at: Timestamp,
    ) -> Result<()> {
        let _written = self.durability.writing();
        tasks::put_snapshot(&self.writer, id, manifest, total_bytes, at).await
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>> {
        tasks::get_snapshot(&self.reader, id).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>> {
        tasks::list_snapshots(&self.reader).await
    }

    async fn add_output(&self, output: OutputRecord) -> Result<()> {
        let _written = self.durability.writing();
        tasks::add_output(&self.writer, output).await
    }

    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>> {
        tasks::list_outputs(&self.reader, task).await
    }

    async fn list_resizes(&self, task: TaskId) -> Result<Vec<crate::ResizeRecord>> {
        tasks::list_resizes(&self.reader, task).await
    }

    async fn record_signal_point(&self, point: crate::SignalRecord, keep: u32) -> Result<()> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        changes::record_signal_point(&mut tx, point, keep).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_signal_points(&self, task: TaskId) -> Result<Vec<crate::SignalRecord>> {
        tasks::list_signal_points(&self.reader, task).await
    }

    async fn record_usage_peak(&self, peak: UsagePeak) -> Result<()> {
        let _written = self.durability.writing();
        tasks::record_usage_peak(&self.writer, peak).await
    }

    async fn list_usage_peaks(&self, task: TaskId) -> Result<Vec<UsagePeak>> {
        tasks::list_usage_peaks(&self.reader, task).await
    }

    async fn tasks_active_between(
        &self,
        since: Timestamp,
        until: Timestamp,
        user: Option<&str>,
    ) -> Result<Vec<TaskHistory>> {
        // One read transaction: the tasks and their events come from the same snapshot.
        let mut tx = self.reader.begin().await?;
        let active = tasks::active_between(&mut tx, since, until, user).await?;
        tx.commit().await?;
        Ok(active)
    }

    async fn create_group(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let made = groups::insert_group(&mut tx, group, elements).await?;
        tx.commit().await?;
        Ok(made)
    }

    async fn add_group_elements(
        &self,
        group: GroupId,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<Vec<TaskRecord>> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let tasks = groups::add_elements(&mut tx, group, elements).await?;
        tx.commit().await?;
        Ok(tasks)
    }

    async fn append_metrics(&self, points: Vec<crate::MetricPoint>) -> Result<()> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        changes::append_metrics(&mut tx, &points).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_metrics(&self, task: TaskId) -> Result<Vec<crate::MetricPoint>> {
        tasks::list_metrics(&self.reader, task).await
    }

    async fn get_group(&self, id: GroupId) -> Result<Option<GroupRecord>> {
        groups::get_group(&self.reader, id).await
    }

    async fn list_groups(&self, filter: &GroupFilter) -> Result<Vec<GroupRecord>> {
        groups::list_groups(&self.reader, filter).await
    }

    async fn group_counts(
        &self,
        id: GroupId,
    ) -> Result<std::collections::BTreeMap<TaskState, u64>> {
        groups::group_counts(&self.reader, id).await
    }

    async fn create_pipeline(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let made = pipelines::insert_pipeline(&mut tx, group, stages).await?;
        tx.commit().await?;
        Ok(made)
    }

    async fn pipeline_stages(&self, pipeline: GroupId) -> Result<Vec<crate::StageRecord>> {
        pipelines::pipeline_stages(&self.reader, pipeline).await
    }

    async fn stage_of(&self, source: crate::StageSource) -> Result<Option<crate::StageRecord>> {
        pipelines::stage_of(&self.reader, source).await
    }

    async fn stages_with_key(
        &self,
        user: &str,
        pipeline: &str,
        stage: &str,
        cache_key: &str,
    ) -> Result<Vec<crate::StageRecord>> {
        pipelines::stages_with_key(&self.reader, user, pipeline, stage, cache_key).await
    }

    async fn task_history(&self, filter: &HistoryFilter) -> Result<Vec<TaskRecord>> {
        groups::task_history(&self.reader, filter).await
    }

    async fn due_deliveries(&self, now: Timestamp, limit: u32) -> Result<Vec<DeliveryRecord>> {
        groups::due_deliveries(&self.reader, now, limit).await
    }

    async fn finish_delivery(&self, id: u64, outcome: DeliveryOutcome) -> Result<bool> {
        let _written = self.durability.writing();
        groups::finish_delivery(&self.writer, id, outcome).await
    }

    async fn get_delivery(&self, key: &str) -> Result<Option<DeliveryRecord>> {
        groups::get_delivery(&self.reader, key).await
    }

    async fn kept_reply(
        &self,
        user: &str,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<crate::KeptReply>> {
        idempotency::kept_reply(&self.reader, user, key, now).await
    }

    async fn keep_reply(&self, kept: crate::KeptReply) -> Result<()> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        idempotency::insert_key(&mut tx, &kept).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_task_keyed(&self, task: NewTask, keyed: crate::Keyed) -> Result<TaskRecord> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let record = changes::insert_task(&mut tx, task).await?;
        let kept = keyed.kept(crate::Created::Task(&record));
        idempotency::insert_key(&mut tx, &kept).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn create_group_keyed(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
        keyed: crate::Keyed,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let (record, tasks) = groups::insert_group(&mut tx, group, elements).await?;
        let kept = keyed.kept(crate::Created::Group(&record, &tasks));
        idempotency::insert_key(&mut tx, &kept).await?;
        tx.commit().await?;
        Ok((record, tasks))
    }

    async fn create_pipeline_keyed(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
        keyed: crate::Keyed,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let made = pipelines::insert_pipeline(&mut tx, group, stages).await?;
        let kept = keyed.kept(crate::Created::Pipeline(&made.0, &made.1, &made.2));
        idempotency::insert_key(&mut tx, &kept).await?;
        tx.commit().await?;
        Ok(made)
    }

    async fn create_user(&self, user: UserRecord) -> Result<()> {
        let _written = self.durability.writing();
        access::create_user(&self.writer, user).await
    }

    async fn get_user(&self, name: &str) -> Result<Option<UserRecord>> {
        access::get_user(&self.reader, name).await
    }

    async fn list_users(&self) -> Result<Vec<UserRecord>> {
        access::list_users(&self.reader).await
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        let _written = self.durability.writing();
        access::create_token(&self.writer, token).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        access::token_by_hash(&self.reader, hash).await
    }

    async fn get_token(&self, id: u64) -> Result<Option<TokenRecord>> {
        access::get_token(&self.reader, id).await
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenRecord>> {
        access::list_tokens(&self.reader, user).await
    }

    async fn revoke_token(&self, id: u64, at: Timestamp) -> Result<bool> {
        let _written = self.durability.writing();
        access::revoke_token(&self.writer, id, at).await
    }

    async fn enrol_node(&self, token: u64, node_name: &str, at: Timestamp) -> Result<Enrolment> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        let enrolment = access::enrol_node(&mut tx, token, node_name, at).await?;
        tx.commit().await?;
        Ok(enrolment)
    }

    async fn append_audit(&self, entry: NewAuditEntry) -> Result<()> {
        let _written = self.durability.writing();
        access::append_audit(&self.writer, entry).await
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        let _written = self.durability.writing();
        access::prune_audit(&self.writer, before).await
    }

    async fn list_audit(&self, since: Option<Timestamp>, limit: u32) -> Result<Vec<AuditEntry>> {
        access::list_audit(&self.reader, since, limit).await
    }

    async fn rank_ends(
        &self,
        task: tacc_core::TaskId,
        attempt: tacc_core::AttemptNo,
    ) -> Result<Vec<crate::RankEnd>> {
        crate::sql::restart_facts::rank_ends(&self.reader, task, attempt).await
    }

    async fn save_fairshare(&self, ledgers: &[crate::FairShareLedger]) -> Result<()> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        crate::sql::restart_facts::save_fairshare(&mut tx, ledgers).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn load_fairshare(&self) -> Result<Vec<crate::FairShareLedger>> {
        crate::sql::restart_facts::load_fairshare(&self.reader).await
    }

    async fn save_nodes_seen(&self, seen: &[(NodeId, tacc_core::Timestamp)]) -> Result<()> {
        let _written = self.durability.writing();
        let mut tx = self.writer.begin().await?;
        crate::sql::restart_facts::save_nodes_seen(&mut tx, seen).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn recent_run_times(&self, user: &str, name: &str, limit: u32) -> Result<Vec<u64>> {
        crate::sql::restart_facts::recent_run_times(&self.reader, user, name, limit).await
    }

    async fn put_dashboard_session(&self, session: crate::DashboardSession) -> Result<()> {
        let _written = self.durability.writing();
        crate::sql::restart_facts::put_dashboard_session(&self.writer, session).await
    }

    async fn dashboard_session(&self, key: &str) -> Result<Option<crate::DashboardSession>> {
        crate::sql::restart_facts::dashboard_session(&self.reader, key).await
    }

    async fn delete_dashboard_session(&self, key: &str) -> Result<bool> {
        let _written = self.durability.writing();
        crate::sql::restart_facts::delete_dashboard_session(&self.writer, key).await
    }

    async fn prune_dashboard_sessions(&self, before: tacc_core::Timestamp) -> Result<u64> {
        let _written = self.durability.writing();
        crate::sql::restart_facts::prune_dashboard_sessions(&self.writer, before).await
    }

    async fn task_uid(&self, user: &str, base: u32) -> Result<u32> {
        let _written = self.durability.writing();
        crate::sql::task_uids::task_uid(&self.writer, user, base).await
    }

    async fn list_task_uids(&self) -> Result<Vec<(String, u32)>> {
        crate::sql::task_uids::list_task_uids(&self.reader).await
    }

    async fn put_secret(&self, secret: SecretRecord) -> Result<()> {
        let _written = self.durability.writing();
        access::put_secret(&self.writer, secret).await
    }

    async fn get_secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>> {
        access::get_secret(&self.reader, user, name).await
    }

    async fn list_secrets(&self, user: &str) -> Result<Vec<SecretRecord>> {
        access::list_secrets(&self.reader, user).await
    }

    async fn delete_secret(&self, user: &str, name: &str) -> Result<bool> {
        let _written = self.durability.writing();
        access::delete_secret(&self.writer, user, name).await
    }

    async fn add_snapshot_owner(&self, owner: SnapshotOwner) -> Result<()> {
        let _written = self.durability.writing();
        access::add_snapshot_owner(&self.writer, owner).await
    }

    async fn is_snapshot_owner(&self, snapshot: &SnapshotId, user: &str) -> Result<bool> {
        access::is_snapshot_owner(&self.reader, snapshot, user).await
    }

    async fn add_chunk_owners(&self, user: &str, hashes: &[String]) -> Result<()> {
        let _written = self.durability.writing();
        access::add_chunk_owners(&self.writer, user, hashes).await
    }

    async fn owned_chunks(
        &self,
        user: &str,
        hashes: &[String],
    ) -> Result<std::collections::BTreeSet<String>> {
        access::owned_chunks(&self.reader, user, hashes).await
    }
}
