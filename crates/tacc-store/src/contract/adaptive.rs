//! The contract of adaptive allocation's records: allocation changes are kept with the
//! task's running attempt only, in order; signal points are bounded per attempt.

use tacc_core::{AttemptNo, TaskId, TaskState, Timestamp};

use super::{change, new_task, transition};
use crate::{ResizeRecord, SignalRecord, Store, StoreError, TaskChange};

fn resize(task: TaskId, attempt: u32, at: u64, cpu: u64, reason: &str) -> TaskChange {
    TaskChange::Resized(ResizeRecord {
        task,
        attempt: AttemptNo(attempt),
        at: Timestamp(at),
        cpu_millis: cpu,
        memory_bytes: 1 << 30,
        reason: reason.into(),
    })
}

async fn running(store: &dyn Store) -> TaskId {
    let task = store
        .create_task(new_task("a", "alice", 1))
        .await
        .unwrap()
        .id;
    store
        .apply(&[
            change(transition(
                task,
                TaskState::Queued,
                TaskState::Starting,
                1,
                2,
            )),
            change(transition(
                task,
                TaskState::Starting,
                TaskState::Running,
                1,
                3,
            )),
        ])
        .await
        .unwrap();
    task
}

pub async fn resizes_of_the_running_attempt_are_kept_in_order(store: &dyn Store) {
    let task = running(store).await;
    store
        .apply(&[resize(task, 1, 10, 3000, "cpu_bound: grow")])
        .await
        .unwrap();
    store
        .apply(&[resize(task, 1, 20, 2000, "over_provisioned: shrink")])
        .await
        .unwrap();
    let resizes = store.list_resizes(task).await.unwrap();
    let seen: Vec<(u64, u64, &str)> = resizes
        .iter()
        .map(|r| (r.at.0, r.cpu_millis, r.reason.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (10, 3000, "cpu_bound: grow"),
            (20, 2000, "over_provisioned: shrink")
        ]
    );
    // A resize is history of its own, not a state event.
    assert_eq!(store.task_events(task).await.unwrap().len(), 3);
    assert!(
        store
            .list_resizes(TaskId(999_999))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn a_resize_of_a_task_not_running_that_attempt_is_a_conflict(store: &dyn Store) {
    let task = running(store).await;
    let stale = store.apply(&[resize(task, 2, 10, 3000, "late")]).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let queued = store.create_task(new_task("q", "bob", 1)).await.unwrap().id;
    let not_running = store.apply(&[resize(queued, 1, 10, 3000, "queued")]).await;
    assert!(
        matches!(not_running, Err(StoreError::Conflict { .. })),
        "{not_running:?}"
    );
    assert!(store.list_resizes(task).await.unwrap().is_empty());
    assert!(store.list_resizes(queued).await.unwrap().is_empty());
}

pub async fn signal_points_keep_the_newest_per_attempt(store: &dyn Store) {
    let task = running(store).await;
    let point = |attempt: u32, at: u64| SignalRecord {
        task,
        attempt: AttemptNo(attempt),
        at: Timestamp(at),
        point: serde_json::json!({"cpu": at}),
    };
    for at in 1..=5 {
        store.record_signal_point(point(1, at), 3).await.unwrap();
    }
    store.record_signal_point(point(2, 1), 3).await.unwrap();
    let kept: Vec<(u32, u64)> = store
        .list_signal_points(task)
        .await
        .unwrap()
        .iter()
        .map(|p| (p.attempt.0, p.at.0))
        .collect();
    assert_eq!(kept, vec![(1, 3), (1, 4), (1, 5), (2, 1)]);
    assert_eq!(
        store.list_signal_points(task).await.unwrap()[0].point,
        serde_json::json!({"cpu": 3})
    );
    let unknown = store
        .record_signal_point(
            SignalRecord {
                task: TaskId(999_999),
                ..point(1, 1)
            },
            3,
        )
        .await;
    assert!(
        matches!(unknown, Err(StoreError::TaskNotFound(_))),
        "{unknown:?}"
    );
}
