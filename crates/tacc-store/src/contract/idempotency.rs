//! The contract of idempotency keys: a key is committed with the work it acknowledges and
//! the reply rendered from what the work made; a taken key makes nothing; keys are per
//! user and expire after a day; ids of acknowledged tasks are never given out again.

use tacc_core::{TaskId, Timestamp};

use super::new_task;
use crate::{
    Created, GroupKind, IdempotencyKey, KEY_LIFETIME_MS, KeptReply, Keyed, NewGroup, NewStage,
    NewStageRun, Store, StoreError, StoredReply, TaskFilter,
};

fn key(user: &str, key: &str, at: u64) -> IdempotencyKey {
    IdempotencyKey {
        user: user.to_string(),
        key: key.to_string(),
        route: "POST /v1/tasks".into(),
        request_hash: format!("hash-of-{key}"),
        created_at: Timestamp(at),
    }
}

/// A reply naming the task ids the work made, as the server renders its own.
fn keyed(user: &str, name: &str, at: u64) -> Keyed {
    Keyed {
        key: key(user, name, at),
        render: Box::new(|created| {
            let ids: Vec<u64> = match created {
                Created::Task(task) => vec![task.id.0],
                Created::Group(_, tasks) | Created::Pipeline(_, _, tasks) => {
                    tasks.iter().map(|t| t.id.0).collect()
                }
            };
            StoredReply {
                status: 201,
                body: serde_json::json!({ "ids": ids }),
            }
        }),
    }
}

fn group(user: &str) -> NewGroup {
    NewGroup {
        kind: GroupKind::Array,
        name: "arr".into(),
        user: user.to_string(),
        spec: serde_json::json!({"name": "arr"}),
        created_at: Timestamp(10),
    }
}

async fn task_count(store: &dyn Store) -> u64 {
    store.count_tasks(&TaskFilter::default()).await.unwrap()
}

pub async fn idempotency_keyed_task_keeps_its_reply(store: &dyn Store) {
    let task = store
        .create_task_keyed(new_task("a", "alice", 10), keyed("alice", "k1", 10))
        .await
        .unwrap();
    let kept = store
        .kept_reply("alice", "k1", Timestamp(11))
        .await
        .unwrap()
        .expect("the key is kept with the task");
    assert_eq!(kept.key, key("alice", "k1", 10));
    assert_eq!(kept.reply.status, 201);
    assert_eq!(kept.reply.body, serde_json::json!({ "ids": [task.id.0] }));
    assert!(store.get_task(task.id).await.unwrap().is_some());
}

pub async fn idempotency_taken_key_creates_nothing(store: &dyn Store) {
    store
        .create_task_keyed(new_task("a", "alice", 10), keyed("alice", "k1", 10))
        .await
        .unwrap();
    let again = store
        .create_task_keyed(new_task("a", "alice", 12), keyed("alice", "k1", 12))
        .await;
    assert!(
        matches!(again, Err(StoreError::AlreadyExists { .. })),
        "{again:?}"
    );
    assert_eq!(task_count(store).await, 1);
    let group = store
        .create_group_keyed(
            group("alice"),
            vec![
                (0, new_task("e", "alice", 12)),
                (1, new_task("e", "alice", 12)),
            ],
            keyed("alice", "k1", 12),
        )
        .await;
    assert!(
        matches!(group, Err(StoreError::AlreadyExists { .. })),
        "{group:?}"
    );
    assert_eq!(
        task_count(store).await,
        1,
        "a refused group leaves no element"
    );
    assert!(
        store
            .list_groups(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn idempotency_keyed_group_keeps_every_element_id(store: &dyn Store) {
    let (_, tasks) = store
        .create_group_keyed(
            group("alice"),
            vec![
                (0, new_task("e", "alice", 10)),
                (1, new_task("e", "alice", 10)),
            ],
            keyed("alice", "g", 10),
        )
        .await
        .unwrap();
    let ids: Vec<u64> = tasks.iter().map(|t| t.id.0).collect();
    let kept = store
        .kept_reply("alice", "g", Timestamp(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.reply.body, serde_json::json!({ "ids": ids }));
}

pub async fn idempotency_keys_are_per_user(store: &dyn Store) {
    store
        .create_task_keyed(new_task("a", "alice", 10), keyed("alice", "same", 10))
        .await
        .unwrap();
    store
        .create_task_keyed(new_task("b", "bob", 10), keyed("bob", "same", 10))
        .await
        .expect("another user's equal key is another key");
    assert!(
        store
            .kept_reply("carol", "same", Timestamp(10))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(task_count(store).await, 2);
}

pub async fn idempotency_keys_expire_after_a_day(store: &dyn Store) {
    store
        .create_task_keyed(new_task("a", "alice", 10), keyed("alice", "k", 10))
        .await
        .unwrap();
    let last_live = Timestamp(10 + KEY_LIFETIME_MS - 1);
    assert!(
        store
            .kept_reply("alice", "k", last_live)
            .await
            .unwrap()
            .is_some()
    );
    let expired = 10 + KEY_LIFETIME_MS;
    assert!(
        store
            .kept_reply("alice", "k", Timestamp(expired))
            .await
            .unwrap()
            .is_none()
    );
    let task = store
        .create_task_keyed(
            new_task("a", "alice", expired),
            keyed("alice", "k", expired),
        )
        .await
        .expect("an expired key may be used again");
    let kept = store
        .kept_reply("alice", "k", Timestamp(expired))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.reply.body, serde_json::json!({ "ids": [task.id.0] }));
}

pub async fn idempotency_reply_kept_on_its_own_once(store: &dyn Store) {
    let kept = KeptReply {
        key: key("alice", "cancel-1", 10),
        reply: StoredReply {
            status: 200,
            body: serde_json::json!({"task_id": 1, "state": "cancelled"}),
        },
    };
    store.keep_reply(kept.clone()).await.unwrap();
    let again = store.keep_reply(kept.clone()).await;
    assert!(
        matches!(again, Err(StoreError::AlreadyExists { .. })),
        "{again:?}"
    );
    assert_eq!(
        store
            .kept_reply("alice", "cancel-1", Timestamp(10))
            .await
            .unwrap(),
        Some(kept)
    );
}

pub async fn ids_are_never_reused_after_a_refused_write(store: &dyn Store) {
    let first = store.create_task(new_task("a", "alice", 10)).await.unwrap();
    store
        .create_task_keyed(new_task("b", "alice", 10), keyed("alice", "k", 10))
        .await
        .unwrap();
    let acknowledged = task_count(store).await;
    let refused = store
        .create_task_keyed(new_task("c", "alice", 11), keyed("alice", "k", 11))
        .await;
    assert!(refused.is_err());
    let next = store.create_task(new_task("d", "alice", 12)).await.unwrap();
    let ids: Vec<TaskId> = store
        .list_tasks(&TaskFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids.len() as u64, acknowledged + 1);
    assert!(
        ids.iter().filter(|id| **id == next.id).count() == 1 && next.id > first.id,
        "ids {ids:?}: {} given out again",
        next.id
    );
    assert!(ids.iter().all(|id| *id <= next.id));
}

pub async fn idempotency_keyed_pipeline_is_all_or_nothing(store: &dyn Store) {
    let pipeline = || NewGroup {
        kind: GroupKind::Pipeline,
        ..group("alice")
    };
    let stages = || {
        vec![NewStage {
            name: "train".into(),
            needs: vec![],
            cache_key: "k-train".into(),
            run: NewStageRun::Task(new_task("train", "alice", 10)),
        }]
    };
    let (made, _, tasks) = store
        .create_pipeline_keyed(pipeline(), stages(), keyed("alice", "p", 10))
        .await
        .unwrap();
    let kept = store
        .kept_reply("alice", "p", Timestamp(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        kept.reply.body,
        serde_json::json!({ "ids": [tasks[0].id.0] })
    );
    let again = store
        .create_pipeline_keyed(pipeline(), stages(), keyed("alice", "p", 11))
        .await;
    assert!(
        matches!(again, Err(StoreError::AlreadyExists { .. })),
        "{again:?}"
    );
    assert_eq!(task_count(store).await, 1);
    assert_eq!(
        store.list_groups(&Default::default()).await.unwrap().len(),
        1
    );
    assert_eq!(store.pipeline_stages(made.id).await.unwrap().len(), 1);
}
