//! The contract of the usage peaks: each measure keeps its own maximum per task, attempt
//! and rank, and peaks are listed by attempt, then rank.

use tacc_core::{AttemptNo, TaskId, Timestamp};

use super::new_task;
use crate::{Store, StoreError, UsagePeak};

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
