//! The contract of the restart facts: rank ends are kept with the change that records them
//! (and only with it), per attempt; fair-share ledgers and last-seen times are kept and
//! replaced, and a node's last-seen time survives its re-registration.

use std::collections::BTreeMap;

use tacc_core::{AttemptNo, NodeId, Resources, TaskId, TaskState, Timestamp};

use super::{new_task, transition};
use crate::{DashboardSession, FairShareLedger, NewNode, RankEnd, Store, StoreError, TaskChange};

fn end(task: TaskId, attempt: u32, rank: u32, failure: Option<&str>) -> RankEnd {
    RankEnd {
        task,
        attempt: AttemptNo(attempt),
        rank,
        node: NodeId(u64::from(rank) + 1),
        at: Timestamp(1_000 + u64::from(rank)),
        failure: failure.map(str::to_string),
    }
}

pub async fn rank_ends_kept_per_attempt_with_their_change(store: &dyn Store) {
    let task = store
        .create_task(new_task("gang", "alice", 10))
        .await
        .unwrap();
    assert_eq!(
        store.rank_ends(task.id, AttemptNo(1)).await.unwrap(),
        vec![]
    );
    store
        .apply(&[TaskChange::RankEnded(end(task.id, 1, 1, None))])
        .await
        .unwrap();
    store
        .apply(&[TaskChange::RankEnded(end(task.id, 1, 0, Some("exit 3")))])
        .await
        .unwrap();
    store
        .apply(&[TaskChange::RankEnded(end(task.id, 2, 0, None))])
        .await
        .unwrap();
    assert_eq!(
        store.rank_ends(task.id, AttemptNo(1)).await.unwrap(),
        vec![end(task.id, 1, 0, Some("exit 3")), end(task.id, 1, 1, None)]
    );
    assert_eq!(
        store.rank_ends(task.id, AttemptNo(2)).await.unwrap(),
        vec![end(task.id, 2, 0, None)]
    );
    // Recording a rank again replaces it.
    store
        .apply(&[TaskChange::RankEnded(end(task.id, 2, 0, Some("lost")))])
        .await
        .unwrap();
    assert_eq!(
        store.rank_ends(task.id, AttemptNo(2)).await.unwrap(),
        vec![end(task.id, 2, 0, Some("lost"))]
    );
}

pub async fn rank_ends_roll_back_with_a_failed_change(store: &dyn Store) {
    let task = store
        .create_task(new_task("gang", "alice", 10))
        .await
        .unwrap();
    // The second change conflicts (the task is queued, not starting): nothing is kept.
    let refused = store
        .apply(&[
            TaskChange::RankEnded(end(task.id, 1, 0, None)),
            TaskChange::Transition(transition(
                task.id,
                TaskState::Starting,
                TaskState::Running,
                1,
                20,
            )),
        ])
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(
        store.rank_ends(task.id, AttemptNo(1)).await.unwrap(),
        vec![]
    );
}

pub async fn fairshare_ledgers_kept_and_replaced(store: &dyn Store) {
    assert_eq!(store.load_fairshare().await.unwrap(), vec![]);
    let ledger = |group: &str, value: f64, at: u64| FairShareLedger {
        group: group.into(),
        value,
        rate: 0.125,
        at: Timestamp(at),
    };
    store
        .save_fairshare(&[ledger("vision", 1.0 / 3.0, 5), ledger("nlp", 7.5, 5)])
        .await
        .unwrap();
    store
        .save_fairshare(&[ledger("vision", 2.25, 9)])
        .await
        .unwrap();
    assert_eq!(
        store.load_fairshare().await.unwrap(),
        vec![ledger("nlp", 7.5, 5), ledger("vision", 2.25, 9)]
    );
    // Exact: a value survives the round trip bit for bit.
    store
        .save_fairshare(&[ledger("nlp", 1.0 / 3.0, 10)])
        .await
        .unwrap();
    assert_eq!(store.load_fairshare().await.unwrap()[0].value, 1.0 / 3.0);
}

pub async fn nodes_last_seen_kept_across_registrations(store: &dyn Store) {
    let node = NewNode {
        name: "n1".into(),
        capacity: Resources::new(4_000, 8 << 30, 0),
        gpu_type: None,
        labels: BTreeMap::new(),
        address: "10.0.0.1".into(),
        registered_at: Timestamp(100),
        enrolment: None,
    };
    let registered = store.register_node(node.clone()).await.unwrap();
    assert_eq!(registered.last_seen, None);
    store
        .save_nodes_seen(&[(registered.id, Timestamp(250)), (NodeId(999), Timestamp(1))])
        .await
        .unwrap();
    let nodes = store.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1, "an unknown node is skipped, not created");
    assert_eq!(nodes[0].last_seen, Some(Timestamp(250)));
    let again = store.register_node(node).await.unwrap();
    assert_eq!(again.last_seen, Some(Timestamp(250)));
}

pub async fn dashboard_sessions_kept_found_forgotten_and_pruned(store: &dyn Store) {
    let session = |key: &str, at: u64| DashboardSession {
        key: key.into(),
        user: "alice".into(),
        nonce: vec![1, 2, 3],
        sealed: vec![0, 255, 7],
        opened_at: Timestamp(at),
    };
    assert_eq!(store.dashboard_session("k1").await.unwrap(), None);
    store
        .put_dashboard_session(session("k1", 10))
        .await
        .unwrap();
    store
        .put_dashboard_session(session("k2", 20))
        .await
        .unwrap();
    assert_eq!(
        store.dashboard_session("k1").await.unwrap(),
        Some(session("k1", 10))
    );
    assert!(store.delete_dashboard_session("k1").await.unwrap());
    assert!(!store.delete_dashboard_session("k1").await.unwrap());
    store
        .put_dashboard_session(session("k3", 30))
        .await
        .unwrap();
    assert_eq!(
        store.prune_dashboard_sessions(Timestamp(30)).await.unwrap(),
        1
    );
    assert_eq!(store.dashboard_session("k2").await.unwrap(), None);
    assert_eq!(
        store.dashboard_session("k3").await.unwrap(),
        Some(session("k3", 30))
    );
}

pub async fn recent_run_times_of_a_user_s_succeeded_tasks_by_name(store: &dyn Store) {
    let run = |name: &str, user: &str, start: u64, end: u64, state: TaskState| {
        let (name, user) = (name.to_string(), user.to_string());
        async move {
            let task = store.create_task(new_task(&name, &user, 1)).await.unwrap();
            let step = |from, to, at| {
                TaskChange::Transition(crate::Transition {
                    placements: vec![crate::StoredPlacement {
                        node: NodeId(1),
                        gpu_indices: vec![],
                    }],
                    ..transition(task.id, from, to, 1, at)
                })
            };
            store
                .apply(&[
                    step(TaskState::Queued, TaskState::Starting, start),
                    step(TaskState::Starting, TaskState::Running, start),
                    step(TaskState::Running, state, end),
                ])
                .await
                .unwrap();
        }
    };
    run("train", "alice", 100, 1_100, TaskState::Succeeded).await;
    run("train", "alice", 200, 2_200, TaskState::Succeeded).await;
    run("train", "alice", 300, 400, TaskState::Failed).await;
    run("train", "bob", 100, 9_100, TaskState::Succeeded).await;
    run("eval", "alice", 100, 600, TaskState::Succeeded).await;
    run("train", "alice", 500, 3_500, TaskState::Succeeded).await;
    assert_eq!(
        store.recent_run_times("alice", "train", 10).await.unwrap(),
        vec![3_000, 2_000, 1_000],
        "newest first, succeeded only, this user and name only"
    );
    assert_eq!(
        store.recent_run_times("alice", "train", 2).await.unwrap(),
        vec![3_000, 2_000]
    );
    assert!(
        store
            .recent_run_times("carol", "train", 10)
            .await
            .unwrap()
            .is_empty()
    );
}
