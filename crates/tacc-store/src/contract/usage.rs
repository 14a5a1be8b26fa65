//! The contract of the usage peaks: each measure keeps its own maximum per task, attempt
//! and rank, and peaks are listed by attempt, then rank.

use tacc_core::{AttemptNo, TaskId, TaskState, Timestamp};

use super::{change, new_task, transition};
use crate::{Store, StoreError, TaskChange, UsagePeak};

fn peak(task: TaskId, attempt: u32, rank: u32, cpu: u64, memory: u64, at: u64) -> UsagePeak {
    UsagePeak {
        task,
        attempt: AttemptNo(attempt),
        node_rank: rank,
        node: format!("n{rank}"),
        cpu_millis: cpu,
        memory_bytes: memory,
        gpu_utilization_percent: 0,
        gpu_memory_bytes: 0,
        at: Timestamp(at),
        gpu_busy_ms: 0,
    }
}

pub async fn usage_peaks_keep_each_measure_s_maximum(store: &dyn Store) {
    let task = store
        .create_task(new_task("p", "alice", 1))
        .await
        .unwrap()
        .id;
    store
        .record_usage_peak(peak(task, 1, 0, 900, 100, 10))
        .await
        .unwrap();
    // Higher memory, lower CPU: the CPU peak stays, the memory peak rises.
    store
        .record_usage_peak(UsagePeak {
            gpu_utilization_percent: 80,
            gpu_memory_bytes: 5 << 30,
            gpu_busy_ms: 7_500,
            ..peak(task, 1, 0, 300, 700, 20)
        })
        .await
        .unwrap();
    // Everything lower, an earlier time: nothing changes.
    store
        .record_usage_peak(peak(task, 1, 0, 1, 1, 5))
        .await
        .unwrap();
    let peaks = store.list_usage_peaks(task).await.unwrap();
    assert_eq!(
        peaks,
        vec![UsagePeak {
            gpu_utilization_percent: 80,
            gpu_memory_bytes: 5 << 30,
            gpu_busy_ms: 7_500,
            ..peak(task, 1, 0, 900, 700, 20)
        }]
    );
}

pub async fn usage_peaks_listed_by_attempt_then_rank_per_task(store: &dyn Store) {
    let task = store
        .create_task(new_task("p", "alice", 1))
        .await
        .unwrap()
        .id;
    let other = store.create_task(new_task("q", "bob", 2)).await.unwrap().id;
    for (attempt, rank) in [(2, 1), (1, 1), (2, 0), (1, 0)] {
        store
            .record_usage_peak(peak(task, attempt, rank, 10, 10, 1))
            .await
            .unwrap();
    }
    store
        .record_usage_peak(peak(other, 1, 0, 5, 5, 1))
        .await
        .unwrap();
    let order: Vec<(u32, u32)> = store
        .list_usage_peaks(task)
        .await
        .unwrap()
        .iter()
        .map(|p| (p.attempt.0, p.node_rank))
        .collect();
    assert_eq!(order, vec![(1, 0), (1, 1), (2, 0), (2, 1)]);
    assert_eq!(store.list_usage_peaks(other).await.unwrap().len(), 1);
    assert!(
        store
            .list_usage_peaks(TaskId(999_999))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn usage_peak_of_an_unknown_task_refused(store: &dyn Store) {
    let error = store
        .record_usage_peak(peak(TaskId(999_999), 1, 0, 1, 1, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::TaskNotFound(TaskId(999_999))),
        "{error}"
    );
}

/// Create a task of `user` submitted at `at`, then walk it through `steps` of
/// (state, attempt, time), each from the state before.
async fn walk(store: &dyn Store, user: &str, at: u64, steps: &[(TaskState, u32, u64)]) -> TaskId {
    let task = store.create_task(new_task("w", user, at)).await.unwrap().id;
    let mut from = TaskState::Queued;
    for (to, attempt, at) in steps {
        store
            .apply(&[change(transition(task, from, *to, *attempt, *at))])
            .await
            .unwrap();
        from = *to;
    }
    task
}

async fn active_ids(store: &dyn Store, since: u64, until: u64, user: Option<&str>) -> Vec<TaskId> {
    store
        .tasks_active_between(Timestamp(since), Timestamp(until), user)
        .await
        .unwrap()
        .iter()
        .map(|h| h.task.id)
        .collect()
}

pub async fn active_between_finds_tasks_that_held_resources_in_the_window(store: &dyn Store) {
    use TaskState::*;
    let never_started = walk(store, "alice", 10, &[]).await;
    let ran_before = walk(
        store,
        "alice",
        10,
        &[(Starting, 1, 20), (Running, 1, 30), (Succeeded, 1, 90)],
    )
    .await;
    let overlaps_start = walk(
        store,
        "alice",
        10,
        &[(Starting, 1, 50), (Running, 1, 60), (Failed, 1, 150)],
    )
    .await;
    let still_running = walk(store, "alice", 10, &[(Starting, 1, 20), (Running, 1, 30)]).await;
    let starts_after = walk(store, "alice", 10, &[(Starting, 1, 300), (Running, 1, 310)]).await;
    let cancelled_queued = walk(store, "alice", 10, &[(Cancelled, 1, 120)]).await;
    let ids = active_ids(store, 100, 200, None).await;
    assert_eq!(
        ids,
        vec![overlaps_start, still_running],
        "never started {never_started}, \
        ran before {ran_before}, starts after {starts_after}, cancelled {cancelled_queued}"
    );
    // The events come along, oldest first.
    let histories = store
        .tasks_active_between(Timestamp(100), Timestamp(200), None)
        .await
        .unwrap();
    let states: Vec<(TaskState, u64)> = histories[0]
        .events
        .iter()
        .map(|e| (e.state, e.at.0))
        .collect();
    assert_eq!(
        states,
        vec![(Queued, 10), (Starting, 50), (Running, 60), (Failed, 150)]
    );
    assert_eq!(histories[0].task.state, Failed);
}

pub async fn active_between_keeps_every_attempt(store: &dyn Store) {
    use TaskState::*;
    // Preempted during attempt 1 (back to the queue as attempt 2), then finished.
    let task = walk(
        store,
        "bob",
        5,
        &[
            (Starting, 1, 10),
            (Running, 1, 20),
            (Queued, 2, 40),
            (Starting, 2, 50),
            (Running, 2, 55),
            (Succeeded, 2, 80),
        ],
    )
    .await;
    let histories = store
        .tasks_active_between(Timestamp(0), Timestamp(1000), None)
        .await
        .unwrap();
    assert_eq!(histories.len(), 1);
    assert_eq!(histories[0].task.id, task);
    let attempts: Vec<(u32, TaskState)> = histories[0]
        .events
        .iter()
        .map(|e| (e.attempt.0, e.state))
        .collect();
    assert_eq!(
        attempts,
        vec![
            (1, Queued),
            (1, Starting),
            (1, Running),
            (2, Queued),
            (2, Starting),
            (2, Running),
            (2, Succeeded)
        ]
    );
}

pub async fn active_between_filters_by_user(store: &dyn Store) {
    use TaskState::*;
    let alice = walk(store, "alice", 1, &[(Starting, 1, 10), (Running, 1, 11)]).await;
    let bob = walk(store, "bob", 1, &[(Starting, 1, 10), (Running, 1, 11)]).await;
    assert_eq!(active_ids(store, 0, 100, Some("alice")).await, vec![alice]);
    assert_eq!(active_ids(store, 0, 100, Some("bob")).await, vec![bob]);
    assert_eq!(active_ids(store, 0, 100, None).await, vec![alice, bob]);
    assert!(active_ids(store, 0, 100, Some("carol")).await.is_empty());
    // A reason update alone (no event) changes nothing.
    store
        .apply(&[TaskChange::Reason {
            task: alice,
            reason: Some("x".into()),
        }])
        .await
        .unwrap();
    assert_eq!(active_ids(store, 0, 100, Some("alice")).await, vec![alice]);
}
