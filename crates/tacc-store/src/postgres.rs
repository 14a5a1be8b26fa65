//! The PostgreSQL store, for a control plane whose state lives on a database server: its
//! connection, its transactions and the lease fence they check. Same tables as
//! [`SqliteStore`](crate::SqliteStore) (migrations/postgres mirrors migrations/sqlite), the
//! same SQL ([`crate::sql`], placeholders numbered by [`numbered`] in [`run`]) and the same
//! contract suite.

use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tacc_core::{GroupId, NodeId, SnapshotId, TaskId, TaskState, Timestamp};

use crate::sql::{access, changes, groups, idempotency, lease, pipelines, tasks};
use crate::{
    AuditEntry, DeliveryOutcome, DeliveryRecord, Enrolment, GroupFilter, GroupRecord,
    HistoryFilter, NewAuditEntry, NewGroup, NewNode, NewTask, NewToken, NodeRecord, OutputRecord,
    Result, SecretRecord, SnapshotOwner, Store, StoreError, TaskChange, TaskEvent, TaskFilter,
    TaskHistory, TaskRecord, TokenRecord, UsagePeak, UserRecord,
};

mod begin;
mod placeholders;
mod run;

pub(crate) use placeholders::numbered;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A session idle inside a transaction this long is ended by the server: a replica paused
/// (SIGSTOP, a long GC-like stall) in the middle of a fenced write would otherwise hold the
/// lease row's lock, and no other replica could take the lease over until it resumed.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "5s";

/// How long a statement waits for a pooled connection before the store reports the
/// database unavailable (rather than hanging a request while the server is down).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The store on a PostgreSQL server.
///
/// Writes go through a pool of exactly one connection, as in the SQLite store: the
/// per-task sequence numbers (`task_events.seq`, `task_resizes.seq`, `task_metrics.seq`)
/// are `MAX + 1` inside the writing transaction, which is race-free only with one writer.
/// Reads use their own pool and see every committed write (read committed). Ids come
/// from sequences (`BIGSERIAL`), which never hand out a value twice, even after a
/// rollback or a deletion.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    writer: PgPool,
    reader: PgPool,
    /// The leadership epoch this store's task-state writes are checked against.
    fence: crate::lease::Fence,
}

/// What to check when the database cannot be opened.
const OPEN_HINT: &str = "check the server is reachable, the database exists and the role may \
     use it; for TLS, `sslmode` and `sslrootcert` in the URL, whose host must be a name the \
     server's certificate is valid for";

impl PostgresStore {
    /// Connect to the database at `url` (`postgres://user:password@host:port/database`)
    /// and bring its schema up to date. The database must exist.
    pub async fn open(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|source| StoreError::Open {
                path: redacted(url),
                source,
                hint: OPEN_HINT,
            })?
            .options([(
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            )]);
        let open_error = |source| StoreError::Open {
            path: redacted(url),
            source,
            hint: OPEN_HINT,
        };
        let writer = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        MIGRATOR.run(&writer).await?;
        let reader = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        Ok(PostgresStore {
            writer,
            reader,
            fence: Default::default(),
        })
    }
}

/// The URL with its password replaced, for error messages and logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Fail with [`StoreError::Fenced`] unless the lease epoch `fence` holds is still the
/// stored one; the row stays share-locked until the caller's transaction ends, so a
/// takeover waits for it and the transaction cannot commit after one.
pub(crate) async fn check_fence(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    fence: &crate::lease::Fence,
) -> Result<()> {
    let Some(epoch) = fence.epoch() else {
        return Ok(());
    };
    let current = sqlx::query("SELECT 1 FROM leader_lease WHERE id = 1 AND epoch = $1 FOR SHARE")
        .bind(epoch as i64)
        .fetch_optional(&mut **tx)
        .await?;
    match current {
        Some(_) => Ok(()),
        None => Err(StoreError::Fenced {
            held: (epoch > 0).then_some(epoch),
        }),
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    /// A commit is durable when it returns (`synchronous_commit` on, the server's own
    /// group commit shares WAL flushes between concurrent transactions).
    async fn sync(&self) -> Result<()> {
        Ok(())
    }

    async fn try_acquire_lease(
        &self,
        claim: &crate::LeaseClaim,
    ) -> Result<Option<crate::LeaderLease>> {
        let lease = lease::try_acquire(&self.writer, claim).await?;
        self.fence.set(lease.as_ref().map(|l| l.epoch));
        Ok(lease)
    }

    async fn renew_lease(
        &self,
        claim: &crate::LeaseClaim,
        epoch: u64,
    ) -> Result<Option<crate::LeaderLease>> {
        let lease = lease::renew(&self.writer, claim, epoch).await?;
        self.fence.set(lease.as_ref().map(|l| l.epoch));
        Ok(lease)
    }

    async fn current_lease(&self) -> Result<Option<crate::LeaderLease>> {
        lease::current(&self.reader).await
    }

    fn for_term(&self, epoch: u64) -> Option<std::sync::Arc<dyn Store>> {
        Some(std::sync::Arc::new(PostgresStore {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
            fence: crate::lease::Fence::fixed(epoch),
        }))
    }

    async fn create_task(&self, task: NewTask) -> Result<TaskRecord> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
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
        if changes.is_empty() {
            return Ok(());
        }
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        changes::apply_changes(&mut tx, changes).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn register_node(&self, node: NewNode) -> Result<NodeRecord> {
        tasks::register_node(&self.writer, node).await
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>> {
        tasks::list_nodes(&self.reader).await
    }

    async fn set_node_drained(&self, node: NodeId, drained: bool) -> Result<bool> {
        tasks::set_node_drained(&self.writer, node, drained).await
    }

    async fn remove_node(&self, node: NodeId) -> Result<bool> {
        tasks::remove_node(&self.writer, node).await
    }

    async fn approve_node(&self, node: NodeId) -> Result<bool> {
        tasks::approve_node(&self.writer, node).await
    }

    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        total_bytes: u64,
        at: Timestamp,
    ) -> Result<()> {
        tasks::put_snapshot(&self.writer, id, manifest, total_bytes, at).await
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>> {
        tasks::get_snapshot(&self.reader, id).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>> {
        tasks::list_snapshots(&self.reader).await
    }

    async fn add_output(&self, output: OutputRecord) -> Result<()> {
        tasks::add_output(&self.writer, output).await
    }

    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>> {
        tasks::list_outputs(&self.reader, task).await
    }

    async fn list_resizes(&self, task: TaskId) -> Result<Vec<crate::ResizeRecord>> {
        tasks::list_resizes(&self.reader, task).await
    }

    async fn record_signal_point(&self, point: crate::SignalRecord, keep: u32) -> Result<()> {
        let mut tx = begin::begin(&self.writer).await?;
        changes::record_signal_point(&mut tx, point, keep).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_signal_points(&self, task: TaskId) -> Result<Vec<crate::SignalRecord>> {
        tasks::list_signal_points(&self.reader, task).await
    }

    async fn record_usage_peak(&self, peak: UsagePeak) -> Result<()> {
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
        let mut tx = begin::begin(&self.reader).await?;
        let active = tasks::active_between(&mut tx, since, until, user).await?;
        tx.commit().await?;
        Ok(active)
    }

    async fn create_group(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        let made = groups::insert_group(&mut tx, group, elements).await?;
        tx.commit().await?;
        Ok(made)
    }

    async fn add_group_elements(
        &self,
        group: GroupId,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<Vec<TaskRecord>> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        let tasks = groups::add_elements(&mut tx, group, elements).await?;
        tx.commit().await?;
        Ok(tasks)
    }

    async fn append_metrics(&self, points: Vec<crate::MetricPoint>) -> Result<()> {
        let mut tx = begin::begin(&self.writer).await?;
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

    async fn group_has_open(&self, id: GroupId) -> Result<bool> {
        groups::group_has_open(&self.reader, id).await
    }

    async fn create_pipeline(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        let made = pipelines::insert_pipeline(&mut tx, group, stages).await?;
        tx.commit().await?;
        Ok(made)
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
        let mut tx = begin::begin(&self.writer).await?;
        idempotency::insert_key(&mut tx, &kept).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_task_keyed(&self, task: NewTask, keyed: crate::Keyed) -> Result<TaskRecord> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
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
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
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
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        let made = pipelines::insert_pipeline(&mut tx, group, stages).await?;
        let kept = keyed.kept(crate::Created::Pipeline(&made.0, &made.1, &made.2));
        idempotency::insert_key(&mut tx, &kept).await?;
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
        groups::finish_delivery(&self.writer, id, outcome).await
    }

    async fn get_delivery(&self, key: &str) -> Result<Option<DeliveryRecord>> {
        groups::get_delivery(&self.reader, key).await
    }

    async fn create_user(&self, user: UserRecord) -> Result<()> {
        access::create_user(&self.writer, user).await
    }

    async fn get_user(&self, name: &str) -> Result<Option<UserRecord>> {
        access::get_user(&self.reader, name).await
    }

    async fn list_users(&self) -> Result<Vec<UserRecord>> {
        access::list_users(&self.reader).await
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
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
        access::revoke_token(&self.writer, id, at).await
    }

    async fn enrol_node(&self, token: u64, node_name: &str, at: Timestamp) -> Result<Enrolment> {
        let mut tx = begin::begin(&self.writer).await?;
        let enrolment = access::enrol_node(&mut tx, token, node_name, at).await?;
        tx.commit().await?;
        Ok(enrolment)
    }

    async fn append_audit(&self, entry: NewAuditEntry) -> Result<()> {
        access::append_audit(&self.writer, entry).await
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
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
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        crate::sql::restart_facts::save_fairshare(&mut tx, ledgers).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn load_fairshare(&self) -> Result<Vec<crate::FairShareLedger>> {
        crate::sql::restart_facts::load_fairshare(&self.reader).await
    }

    async fn save_nodes_seen(&self, seen: &[(NodeId, tacc_core::Timestamp)]) -> Result<()> {
        let mut tx = begin::begin(&self.writer).await?;
        check_fence(&mut tx, &self.fence).await?;
        crate::sql::restart_facts::save_nodes_seen(&mut tx, seen).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn recent_run_times(&self, user: &str, name: &str, limit: u32) -> Result<Vec<u64>> {
        crate::sql::restart_facts::recent_run_times(&self.reader, user, name, limit).await
    }

    async fn put_dashboard_session(&self, session: crate::DashboardSession) -> Result<()> {
        crate::sql::restart_facts::put_dashboard_session(&self.writer, session).await
    }

    async fn dashboard_session(&self, key: &str) -> Result<Option<crate::DashboardSession>> {
        crate::sql::restart_facts::dashboard_session(&self.reader, key).await
    }

    async fn delete_dashboard_session(&self, key: &str) -> Result<bool> {
        crate::sql::restart_facts::delete_dashboard_session(&self.writer, key).await
    }

    async fn prune_dashboard_sessions(&self, before: tacc_core::Timestamp) -> Result<u64> {
        crate::sql::restart_facts::prune_dashboard_sessions(&self.writer, before).await
    }

    async fn task_uid(&self, user: &str, base: u32) -> Result<u32> {
        crate::sql::task_uids::task_uid(&self.writer, user, base).await
    }

    async fn list_task_uids(&self) -> Result<Vec<(String, u32)>> {
        crate::sql::task_uids::list_task_uids(&self.reader).await
    }

    async fn put_secret(&self, secret: SecretRecord) -> Result<()> {
        access::put_secret(&self.writer, secret).await
    }

    async fn get_secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>> {
        access::get_secret(&self.reader, user, name).await
    }

    async fn list_secrets(&self, user: &str) -> Result<Vec<SecretRecord>> {
        access::list_secrets(&self.reader, user).await
    }

    async fn delete_secret(&self, user: &str, name: &str) -> Result<bool> {
        access::delete_secret(&self.writer, user, name).await
    }

    async fn add_snapshot_owner(&self, owner: SnapshotOwner) -> Result<()> {
        access::add_snapshot_owner(&self.writer, owner).await
    }

    async fn is_snapshot_owner(&self, snapshot: &SnapshotId, user: &str) -> Result<bool> {
        access::is_snapshot_owner(&self.reader, snapshot, user).await
    }

    async fn add_chunk_owners(&self, user: &str, hashes: &[String]) -> Result<()> {
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
