//! The read-only view of the control plane's durable state, for the API and the dashboard.
//!
//! Every read an HTTP handler makes of tasks, groups, outputs, snapshots, users, tokens
//! and secrets goes through here: a handler holds no store, so it cannot change state
//! behind the control plane's back (changes go through `Control` and the services that
//! own them: `accounts`, `secrets`, `auth`). `taccd/tests/architecture.rs` keeps
//! `control.store` out of the API's handlers. Only reads live here: each method is one
//! store read, named for what it answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tacc_core::{GroupId, SnapshotId, TaskId, TaskState};
use tacc_store::{
    GroupRecord, HistoryFilter, OutputRecord, ResizeRecord, SecretRecord, Store, StoreError,
    TaskEvent, TaskFilter, TaskRecord, TokenRecord, UserRecord,
};

type Result<T> = std::result::Result<T, StoreError>;

/// Reads of the durable state; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    store: Arc<dyn Store>,
}

impl Query {
    pub(crate) fn new(store: Arc<dyn Store>) -> Query {
        Query { store }
    }

    pub(crate) async fn task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        self.store.get_task(id).await
    }

    /// Tasks matching `filter`, newest first.
    pub(crate) async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>> {
        self.store.list_tasks(filter).await
    }

    /// Ended tasks, newest end first, in pages.
    pub(crate) async fn history(&self, filter: &HistoryFilter) -> Result<Vec<TaskRecord>> {
        self.store.task_history(filter).await
    }

    pub(crate) async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>> {
        self.store.task_events(id).await
    }

    pub(crate) async fn resizes(&self, id: TaskId) -> Result<Vec<ResizeRecord>> {
        self.store.list_resizes(id).await
    }

    pub(crate) async fn outputs(&self, id: TaskId) -> Result<Vec<OutputRecord>> {
        self.store.list_outputs(id).await
    }

    pub(crate) async fn group(&self, id: GroupId) -> Result<Option<GroupRecord>> {
        self.store.get_group(id).await
    }

    pub(crate) async fn group_counts(&self, id: GroupId) -> Result<BTreeMap<TaskState, u64>> {
        self.store.group_counts(id).await
    }

    /// Whether any element of the group has not ended (one probe, whatever its size).
    pub(crate) async fn group_has_open(&self, id: GroupId) -> Result<bool> {
        self.store.group_has_open(id).await
    }

    pub(crate) async fn snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>> {
        self.store.get_snapshot(id).await
    }

    pub(crate) async fn is_snapshot_owner(&self, id: &SnapshotId, user: &str) -> Result<bool> {
        self.store.is_snapshot_owner(id, user).await
    }

    /// Which of `hashes` `user` uploaded.
    pub(crate) async fn owned_chunks(
        &self,
        user: &str,
        hashes: &[String],
    ) -> Result<BTreeSet<String>> {
        self.store.owned_chunks(user, hashes).await
    }

    pub(crate) async fn user(&self, name: &str) -> Result<Option<UserRecord>> {
        self.store.get_user(name).await
    }

    pub(crate) async fn users(&self) -> Result<Vec<UserRecord>> {
        self.store.list_users().await
    }

    pub(crate) async fn token(&self, id: u64) -> Result<Option<TokenRecord>> {
        self.store.get_token(id).await
    }

    /// Every token, or `user`'s.
    pub(crate) async fn tokens(&self, user: Option<&str>) -> Result<Vec<TokenRecord>> {
        self.store.list_tokens(user).await
    }

    /// `user`'s secrets, sealed (their names and times are what a reader may show).
    pub(crate) async fn secrets(&self, user: &str) -> Result<Vec<SecretRecord>> {
        self.store.list_secrets(user).await
    }

    pub(crate) async fn secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>> {
        self.store.get_secret(user, name).await
    }
}
