//! The shared store contract, one test per behaviour and implementation, plus what only
//! the SQLite store promises (durability across reopen, a clear open error) and what the
//! PostgreSQL store must do on a server (no transaction left open, recovery of connections).

use std::time::{Duration, Instant};

use tacc_store::test_database::TestDatabase;
use tacc_store::{MemoryStore, PostgresStore, SqliteStore, Store, contract};

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

/// A store on a new database of the test server, or `None` when the test is skipped.
async fn fresh_postgres(test: &str) -> Option<(PostgresStore, TestDatabase)> {
    let database = TestDatabase::create(test).await?;
    let store = PostgresStore::open(&database.url).await.unwrap();
    Some((store, database))
}

/// A queued task of alice's named `name`.
fn alice_task(name: &str) -> tacc_store::NewTask {
    tacc_store::NewTask {
        name: name.into(),
        user: "alice".into(),
        spec: serde_json::json!({}),
        snapshot: "ef".repeat(32).parse().unwrap(),
        source: None,
        submitted_at: tacc_core::Timestamp(1),
        submission: serde_json::json!({}),
    }
}

mod memory {
    tacc_store::store_contract_tests!(super::fresh_memory);
}

mod sqlite {
    tacc_store::store_contract_tests!(super::fresh_sqlite);
}

mod postgres {
    tacc_store::store_contract_tests!(optional super::fresh_postgres);
}

/// Group commit: commits do not sync the log each; a sync syncs once for every write
/// before it, and not at all when nothing was written since the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_syncs_the_log_once_for_many_writes() {
    let (store, _dir) = fresh_sqlite().await;
    let store = std::sync::Arc::new(store);
    store.sync().await.unwrap();
    let before = store.syncs();
    let writers: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .create_task(alice_task(&format!("t{i}")))
                    .await
                    .unwrap();
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    assert_eq!(
        store.syncs(),
        before,
        "20 commits synced nothing by themselves"
    );
    store.sync().await.unwrap();
    assert_eq!(store.syncs(), before + 1, "one sync for the 20 commits");
    store.sync().await.unwrap();
    let _ = store.get_task(tacc_core::TaskId(1)).await.unwrap();
    store.sync().await.unwrap();
    assert_eq!(
        store.syncs(),
        before + 1,
        "reads and repeated syncs sync nothing"
    );
}

#[tokio::test]
async fn sqlite_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let (id, token) = {
        let store = SqliteStore::open(&path).await.unwrap();
        contract::tasks_get_ids_in_order_and_round_trip(&store).await;
        let id = store.create_task(alice_task("durable")).await.unwrap().id;
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
                join: None,
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

/// The sessions of the test database that sit inside a transaction, polled until there
/// are none or the deadline passes (a rolled-back transaction is ended when its
/// connection goes back to the pool, just after the failing call returns).
async fn open_transactions(database: &TestDatabase) -> i64 {
    use sqlx::Connection;
    let mut probe = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(&mut probe)
        .await
        .unwrap();
        if open == 0 || Instant::now() > deadline {
            return open;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn postgres_failed_write_leaves_no_transaction_open() {
    let Some((store, database)) =
        fresh_postgres("postgres_failed_write_leaves_no_transaction_open").await
    else {
        return;
    };
    let task = store
        .create_task(contract::new_task("a", "alice", 10))
        .await
        .unwrap();
    // The second change fails after the first was written inside the transaction.
    let failed = store
        .apply(&[
            tacc_store::TaskChange::Reason {
                task: task.id,
                reason: Some("first".into()),
            },
            tacc_store::TaskChange::Reason {
                task: tacc_core::TaskId(task.id.0 + 1000),
                reason: Some("missing".into()),
            },
        ])
        .await;
    assert!(
        matches!(failed, Err(tacc_store::StoreError::TaskNotFound(_))),
        "{failed:?}"
    );
    assert_eq!(open_transactions(&database).await, 0);
    // Nothing of the failed call was kept, and the writer still writes.
    let kept = store.get_task(task.id).await.unwrap().unwrap();
    assert_eq!(kept.reason, None);
    let next = store
        .create_task(contract::new_task("b", "alice", 11))
        .await
        .unwrap();
    assert!(next.id > task.id);
}

#[tokio::test]
async fn postgres_ids_are_not_reused_after_a_rollback() {
    let Some((store, _database)) =
        fresh_postgres("postgres_ids_are_not_reused_after_a_rollback").await
    else {
        return;
    };
    let first = store
        .create_task(contract::new_task("a", "alice", 10))
        .await
        .unwrap();
    // A refused token insert (its hash is taken) draws an id from the sequence and
    // rolls back: that id is never handed out.
    let user = tacc_store::UserRecord {
        name: "alice".into(),
        group: None,
        role: tacc_core::Role::User,
        created_at: tacc_core::Timestamp(1),
    };
    store.create_user(user).await.unwrap();
    let token = |hash: &str| tacc_store::NewToken {
        kind: tacc_store::TokenKind::User,
        hash: hash.into(),
        user: Some("alice".into()),
        node: None,
        created_at: tacc_core::Timestamp(1),
        expires_at: None,
        label: String::new(),
        join: None,
    };
    let kept = store.create_token(token("h1")).await.unwrap();
    assert!(store.create_token(token("h1")).await.is_err());
    let after = store.create_token(token("h2")).await.unwrap();
    assert!(
        after.id > kept.id + 1,
        "a refused insert's id is not handed out again"
    );
    let second = store
        .create_task(contract::new_task("b", "alice", 11))
        .await
        .unwrap();
    assert!(second.id > first.id);
}

#[tokio::test]
async fn postgres_store_recovers_when_its_connections_are_killed() {
    let Some((store, database)) =
        fresh_postgres("postgres_store_recovers_when_its_connections_are_killed").await
    else {
        return;
    };
    let task = store
        .create_task(contract::new_task("a", "alice", 10))
        .await
        .unwrap();
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!killed.is_empty(), "the store had connections to kill");
    // Pooled connections are tested before use: the broken ones are replaced.
    let loaded = store.get_task(task.id).await.unwrap();
    assert_eq!(loaded.map(|t| t.name), Some("a".to_string()));
    store
        .create_task(contract::new_task("b", "alice", 11))
        .await
        .unwrap();
}

#[tokio::test]
async fn postgres_open_of_an_unreachable_server_names_it_without_the_password() {
    // A port nothing listens on: the connection is refused at once.
    let err = PostgresStore::open("postgres://tacc:secret@127.0.0.1:1/tacc")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

/// Every schema change is made for both stores: the PostgreSQL migrations mirror the
/// SQLite ones file for file (sqlx applies them by version, so a missing mirror would
/// leave one store a table short).
#[test]
fn every_sqlite_migration_has_a_postgres_mirror() {
    let names = |dir: &str| -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dir);
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let sqlite = names("sqlite");
    assert!(!sqlite.is_empty());
    assert_eq!(sqlite, names("postgres"));
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
        submission: serde_json::json!({}),
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
        submission: serde_json::json!({}),
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

/// `holder`'s claim to the leadership lease at `now` (ms), for one second.
fn lease_claim(holder: &str, now: u64) -> tacc_store::LeaseClaim {
    tacc_store::LeaseClaim {
        holder: holder.to_string(),
        leader_url: format!("http://{holder}"),
        now: tacc_core::Timestamp(now),
        ttl_ms: 1_000,
    }
}

/// Two replicas' stores on one database: once the second took the lapsed lease over, the
/// first can neither change task state nor renew, while the new holder can.
#[tokio::test]
async fn postgres_replica_that_lost_the_lease_is_fenced() {
    let Some((old, database)) =
        fresh_postgres("postgres_replica_that_lost_the_lease_is_fenced").await
    else {
        return;
    };
    let new = PostgresStore::open(&database.url).await.unwrap();
    let first = old
        .try_acquire_lease(&lease_claim("old", 1_000))
        .await
        .unwrap()
        .unwrap();
    let task = old
        .create_task(contract::new_task("a", "alice", 1_000))
        .await
        .unwrap();
    // A replica that lost an election may not change task state either.
    assert_eq!(
        new.try_acquire_lease(&lease_claim("new", 1_500))
            .await
            .unwrap(),
        None
    );
    let refused = new
        .create_task(contract::new_task("b", "alice", 1_001))
        .await;
    assert!(
        matches!(refused, Err(tacc_store::StoreError::Fenced { held: None })),
        "{refused:?}"
    );

    let taken = new
        .try_acquire_lease(&lease_claim("new", 2_000))
        .await
        .unwrap()
        .unwrap();
    assert!(taken.epoch > first.epoch);
    let cancel = [tacc_store::TaskChange::Reason {
        task: task.id,
        reason: Some("from the old leader".into()),
    }];
    let fenced = old.apply(&cancel).await;
    assert!(
        matches!(fenced, Err(tacc_store::StoreError::Fenced { held: Some(e) }) if e == first.epoch),
        "{fenced:?}"
    );
    assert!(fenced.unwrap_err().to_string().contains("no longer leads"));
    let late = old
        .create_task(contract::new_task("c", "alice", 2_001))
        .await;
    assert!(
        matches!(late, Err(tacc_store::StoreError::Fenced { .. })),
        "{late:?}"
    );
    assert_eq!(
        old.renew_lease(&lease_claim("old", 2_001), first.epoch)
            .await
            .unwrap(),
        None
    );
    assert_eq!(open_transactions(&database).await, 0);

    // Nothing of the old leader's was committed; the new one writes.
    assert_eq!(old.get_task(task.id).await.unwrap().unwrap().reason, None);
    assert_eq!(
        old.list_tasks(&Default::default()).await.unwrap().len(),
        1,
        "a fenced create committed"
    );
    new.apply(&[tacc_store::TaskChange::Reason {
        task: task.id,
        reason: Some("from the new leader".into()),
    }])
    .await
    .unwrap();
    assert_eq!(
        new.get_task(task.id)
            .await
            .unwrap()
            .unwrap()
            .reason
            .as_deref(),
        Some("from the new leader")
    );
}

/// A replica that led, lost the lease and won it back: what its first term still has
/// under way (a request, a loop being stopped) writes through that term's handle and is
/// fenced, while the second term's handle writes.
#[tokio::test]
async fn postgres_a_term_that_ended_stays_fenced_when_its_replica_leads_again() {
    let Some((replica, database)) =
        fresh_postgres("postgres_a_term_that_ended_stays_fenced_when_its_replica_leads_again")
            .await
    else {
        return;
    };
    let other = PostgresStore::open(&database.url).await.unwrap();
    let first = replica
        .try_acquire_lease(&lease_claim("replica", 1_000))
        .await
        .unwrap()
        .unwrap();
    let first_term = replica.for_term(first.epoch).unwrap();
    let task = first_term
        .create_task(contract::new_task("a", "alice", 1_000))
        .await
        .unwrap();
    // Another replica takes the lapsed lease, then this one takes it back.
    let between = other
        .try_acquire_lease(&lease_claim("other", 2_000))
        .await
        .unwrap()
        .unwrap();
    let second = replica
        .try_acquire_lease(&lease_claim("replica", 3_000))
        .await
        .unwrap()
        .unwrap();
    assert!(second.epoch > between.epoch && between.epoch > first.epoch);
    let second_term = replica.for_term(second.epoch).unwrap();

    let late = first_term
        .apply(&[tacc_store::TaskChange::Reason {
            task: task.id,
            reason: Some("from the first term".into()),
        }])
        .await;
    assert!(
        matches!(late, Err(tacc_store::StoreError::Fenced { held: Some(e) }) if e == first.epoch),
        "{late:?}"
    );
    second_term
        .apply(&[tacc_store::TaskChange::Reason {
            task: task.id,
            reason: Some("from the second term".into()),
        }])
        .await
        .unwrap();
    assert_eq!(
        replica
            .get_task(task.id)
            .await
            .unwrap()
            .unwrap()
            .reason
            .as_deref(),
        Some("from the second term")
    );
    assert_eq!(open_transactions(&database).await, 0);
    // A store that serves one server alone has no terms.
    let memory = tacc_store::MemoryStore::default();
    assert!(memory.for_term(1).is_none());
}

/// A user's task uid survives a restart of the server, and a restarted server never hands
/// a uid given before to anyone else.
#[tokio::test]
async fn sqlite_task_uids_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let (alice, bob) = {
        let store = SqliteStore::open(&path).await.unwrap();
        let alice = store.task_uid("alice", 200_000).await.unwrap();
        let bob = store.task_uid("bob", 200_000).await.unwrap();
        (alice, bob)
    };
    let reopened = SqliteStore::open(&path).await.unwrap();
    assert_eq!(reopened.task_uid("bob", 200_000).await.unwrap(), bob);
    assert_eq!(reopened.task_uid("alice", 200_000).await.unwrap(), alice);
    let carol = reopened.task_uid("carol", 200_000).await.unwrap();
    assert!(![alice, bob].contains(&carol), "carol got {carol}");
}

/// Two servers on one PostgreSQL database (replicas, or a server and its restart)
/// allocating at once never give one uid to two users, nor two uids to one user.
#[tokio::test]
async fn postgres_task_uids_from_two_servers_never_collide() {
    let Some(database) = TestDatabase::create("postgres_task_uids_from_two_servers").await else {
        return;
    };
    let first = PostgresStore::open(&database.url).await.unwrap();
    let second = PostgresStore::open(&database.url).await.unwrap();
    let users: Vec<String> = (0..12).map(|n| format!("user{n}")).collect();
    let mut handles = Vec::new();
    for (n, user) in users.iter().enumerate() {
        for store in [first.clone(), second.clone()] {
            let user = user.clone();
            handles.push(tokio::spawn(async move {
                (
                    user.clone(),
                    store.task_uid(&user, 400_000 + n as u32 % 3).await.unwrap(),
                )
            }));
        }
    }
    let mut given = std::collections::BTreeMap::new();
    for handle in handles {
        let (user, uid) = handle.await.unwrap();
        if let Some(before) = given.insert(user.clone(), uid) {
            assert_eq!(before, uid, "{user} was given two uids");
        }
    }
    let distinct: std::collections::BTreeSet<u32> = given.values().copied().collect();
    assert_eq!(distinct.len(), users.len(), "users share uids: {given:?}");
    drop(first);
    let restarted = PostgresStore::open(&database.url).await.unwrap();
    for (user, uid) in &given {
        assert_eq!(restarted.task_uid(user, 1).await.unwrap(), *uid);
    }
}

/// A file of many pages, then closed with its write-ahead log folded in, so every page
/// lives in the file itself.
async fn sqlite_file_with_pages(path: &std::path::Path) {
    let store = SqliteStore::open(path).await.unwrap();
    for at in 0..3000 {
        store
            .append_audit(tacc_store::NewAuditEntry {
                at: tacc_core::Timestamp(at),
                actor: "user:alice".into(),
                action: "secret.set".into(),
                target: format!("secret:S{at}"),
                outcome: "ok".into(),
                detail: "x".repeat(100),
            })
            .await
            .unwrap();
    }
    drop(store);
    use sqlx::{ConnectOptions, Connection};
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .unwrap();
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// Deterministic garbage: what a failing disk or a stray write leaves.
fn garbage(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[tokio::test]
async fn sqlite_refuses_a_damaged_file_naming_it_and_the_way_back() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    sqlite_file_with_pages(&path).await;
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        size > 64 * 1024,
        "the file has pages to damage ({size} bytes)"
    );
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(size / 2)).unwrap();
    file.write_all(&garbage(16 * 1024)).unwrap();
    drop(file);
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(err, tacc_store::StoreError::Damaged { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    for needed in [
        path.display().to_string(),
        "backup".into(),
        ".recover".into(),
    ] {
        assert!(
            message.contains(&needed),
            "`{needed}` missing from: {message}"
        );
    }
}

#[tokio::test]
async fn sqlite_integrity_check_stops_at_its_budget_and_opens_a_sound_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    sqlite_file_with_pages(&path).await;
    // No time at all: the check is interrupted at once, and the sound file still opens.
    let started = Instant::now();
    let store = SqliteStore::open_checked(&path, Duration::ZERO)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(store.list_audit(None, 5).await.unwrap().len(), 5);
    drop(store);
    // With time, the whole file is read and found sound.
    SqliteStore::open(&path).await.unwrap();
}
