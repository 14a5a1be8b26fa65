//! The shared store contract, run against every implementation.

use tacc_store::{MemoryStore, SqliteStore, Store, contract};

#[tokio::test]
async fn memory_store_meets_the_contract() {
    contract::run_all(&MemoryStore::new()).await;
}

#[tokio::test]
async fn sqlite_store_meets_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("tacc.db"))
        .await
        .unwrap();
    contract::run_all(&store).await;
}

#[tokio::test]
async fn sqlite_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tacc.db");
    let id = {
        let store = SqliteStore::open(&path).await.unwrap();
        contract::tasks_get_ids_in_order_and_round_trip(&store).await;
        store
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
            .id
    };
    let reopened = SqliteStore::open(&path).await.unwrap();
    let task = reopened
        .get_task(id)
        .await
        .unwrap()
        .expect("task survives reopen");
    assert_eq!(task.name, "durable");
    assert_eq!(reopened.task_events(id).await.unwrap().len(), 1);
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
