//! The shared store contract, one test per behaviour and implementation, plus what only
//! the SQLite store promises (durability across reopen, a clear open error).

use tacc_store::{MemoryStore, SqliteStore, Store, contract};

async fn fresh_memory() -> (MemoryStore, ()) {
    (MemoryStore::new(), ())
}

async fn fresh_sqlite() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("tacc.db"))
        .await
        .unwrap();
    (store, dir)
}

mod memory {
    tacc_store::store_contract_tests!(super::fresh_memory);
}

mod sqlite {
    tacc_store::store_contract_tests!(super::fresh_sqlite);
}

#[tokio::test]
async fn sqlite_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let (id, token) = {
        let store = SqliteStore::open(&path).await.unwrap();
        contract::tasks_get_ids_in_order_and_round_trip(&store).await;
        let id = store
            .create_task(tacc_store::NewTask {
                name: "durable".into(),
                user: "alice".into(),
                spec: serde_json::json!({}),
                snapshot: "ef".repeat(32).parse().unwrap(),
                source: None,
                submitted_at: tacc_core::Timestamp(1),
            })
            .await
            .unwrap()
            .id;
        store
            .create_user(tacc_store::UserRecord {
                name: "alice".into(),
                group: None,
                role: tacc_core::Role::Admin,
                created_at: tacc_core::Timestamp(1),
            })
            .await
            .unwrap();
        let token = store
            .create_token(tacc_store::NewToken {
                kind: tacc_store::TokenKind::User,
                hash: "0".repeat(64),
                user: Some("alice".into()),
                node: None,
                created_at: tacc_core::Timestamp(1),
                expires_at: None,
                label: "durable".into(),
            })
            .await
            .unwrap();
        (id, token)
    };
    let reopened = SqliteStore::open(&path).await.unwrap();
    let task = reopened
        .get_task(id)
        .await
        .unwrap()
        .expect("task survives reopen");
    assert_eq!(task.name, "durable");
    assert_eq!(reopened.task_events(id).await.unwrap().len(), 1);
    let user = reopened.get_user("alice").await.unwrap();
    assert_eq!(user.map(|u| u.role), Some(tacc_core::Role::Admin));
    assert_eq!(
        reopened.token_by_hash(&token.hash).await.unwrap(),
        Some(token)
    );
}

#[tokio::test]
async fn sqlite_open_names_the_path_when_it_cannot_create_the_file() {
    let err = SqliteStore::open(std::path::Path::new("/nonexistent-dir/x/tacc.db"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent-dir/x/tacc.db"),
        "{err}"
    );
}

/// A database written before outputs were kept per rank opens with its outputs intact,
/// as rank 0's (the only rank whose outputs earlier versions kept).
#[tokio::test]
async fn sqlite_outputs_of_earlier_versions_become_rank_0s() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    // The schema as it was before per-rank outputs: the migrations up to 0004.
    let earlier = dir.path().join("migrations");
    std::fs::create_dir(&earlier).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    for entry in std::fs::read_dir(&all).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.as_str() < "0005" {
            std::fs::copy(entry.path(), earlier.join(&name)).unwrap();
        }
    }
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::migrate::Migrator::new(earlier.as_path())
        .await
        .unwrap()
        .run(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tasks (id, name, user_name, spec, snapshot, source, state, attempt, \
         submitted_at) VALUES (7, 'old', 'alice', '{}', ?, NULL, 'succeeded', 1, 1)",
    )
    .bind("ab".repeat(32))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outputs (task_id, attempt, path, size) VALUES (7, 1, 'results/m.json', 14)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let store = SqliteStore::open(&path).await.unwrap();
    let outputs = store.list_outputs(tacc_core::TaskId(7)).await.unwrap();
    assert_eq!(
        outputs,
        vec![tacc_store::OutputRecord {
            task: tacc_core::TaskId(7),
            attempt: tacc_core::AttemptNo(1),
            rank: 0,
            path: "results/m.json".into(),
            size: 14,
        }]
    );
}

/// Task ids come from an AUTOINCREMENT column: a reopened store never gives out an id it
/// acknowledged before, even when that was the newest.
#[tokio::test]
async fn sqlite_ids_are_never_reused_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let task = |name: &str| tacc_store::NewTask {
        name: name.into(),
        user: "alice".into(),
        spec: serde_json::json!({}),
        snapshot: "ef".repeat(32).parse().unwrap(),
        source: None,
        submitted_at: tacc_core::Timestamp(1),
    };
    let before = {
        let store = SqliteStore::open(&path).await.unwrap();
        let mut ids = Vec::new();
        for name in ["a", "b", "c"] {
            ids.push(store.create_task(task(name)).await.unwrap().id);
        }
        ids
    };
    let reopened = SqliteStore::open(&path).await.unwrap();
    let after = reopened.create_task(task("d")).await.unwrap().id;
    assert!(
        before.iter().all(|id| *id < after),
        "id {after} after reopen, acknowledged before: {before:?}"
    );
}

/// A database another process holds locked past the busy timeout is a fault of the
/// storage (the server answers 503), not of the request; once the lock is gone the store
/// writes again — the failed write left no transaction open.
#[tokio::test]
async fn sqlite_a_locked_database_is_a_storage_fault_and_the_store_recovers() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let task = |name: &str| tacc_store::NewTask {
        name: name.into(),
        user: "alice".into(),
        spec: serde_json::json!({}),
        snapshot: "ef".repeat(32).parse().unwrap(),
        source: None,
        submitted_at: tacc_core::Timestamp(1),
    };
    let first = store.create_task(task("before")).await.unwrap().id;
    let mut locker = sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new().filename(&path),
    )
    .await
    .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .unwrap();
    let error = store.create_task(task("locked")).await.unwrap_err();
    assert_eq!(
        error.storage_fault(),
        Some(tacc_store::StorageFault::Unavailable),
        "{error}"
    );
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    locker.close().await.unwrap();
    let after = store.create_task(task("after")).await.unwrap().id;
    assert!(after > first);
    let reopened = SqliteStore::open(&path).await.unwrap();
    assert!(reopened.get_task(after).await.unwrap().is_some());
}
