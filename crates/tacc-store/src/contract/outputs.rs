//! The contract of kept outputs: every rank of every attempt keeps its own files, listed
//! in one order by every store.

use tacc_core::{AttemptNo, TaskId};

use super::new_task;
use crate::{OutputRecord, Store};

fn output(task: TaskId, attempt: u32, rank: u32, path: &str, size: u64) -> OutputRecord {
    OutputRecord {
        task,
        attempt: AttemptNo(attempt),
        rank,
        path: path.into(),
        size,
    }
}

/// Two ranks that wrote the same relative path keep both files.
pub async fn outputs_kept_per_rank(store: &dyn Store) {
    let task = store
        .create_task(new_task("gang", "alice", 10))
        .await
        .unwrap()
        .id;
    store
        .add_output(output(task, 1, 0, "out/same.txt", 3))
        .await
        .unwrap();
    store
        .add_output(output(task, 1, 1, "out/same.txt", 5))
        .await
        .unwrap();
    store
        .add_output(output(task, 1, 1, "out/only1.txt", 7))
        .await
        .unwrap();
    let listed = store.list_outputs(task).await.unwrap();
    assert_eq!(
        listed,
        vec![
            output(task, 1, 0, "out/same.txt", 3),
            output(task, 1, 1, "out/only1.txt", 7),
            output(task, 1, 1, "out/same.txt", 5),
        ]
    );
}

/// Attempts first, then ranks, then paths, whatever order they were added in; other
/// tasks' outputs are not listed.
pub async fn outputs_listed_by_attempt_rank_and_path(store: &dyn Store) {
    let task = store
        .create_task(new_task("retried", "alice", 20))
        .await
        .unwrap()
        .id;
    let other = store
        .create_task(new_task("other", "bob", 21))
        .await
        .unwrap()
        .id;
    for (attempt, rank, path) in [
        (2, 1, "b"),
        (2, 0, "z"),
        (1, 1, "a"),
        (1, 0, "ckpt/state.txt"),
        (2, 0, "a"),
    ] {
        store
            .add_output(output(task, attempt, rank, path, 1))
            .await
            .unwrap();
    }
    store
        .add_output(output(other, 1, 0, "theirs", 1))
        .await
        .unwrap();
    let order: Vec<(u32, u32, String)> = store
        .list_outputs(task)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.attempt.0, o.rank, o.path))
        .collect();
    assert_eq!(
        order,
        vec![
            (1, 0, "ckpt/state.txt".to_string()),
            (1, 1, "a".to_string()),
            (2, 0, "a".to_string()),
            (2, 0, "z".to_string()),
            (2, 1, "b".to_string()),
        ]
    );
}

/// An upload repeated for the same attempt, rank and path replaces the record.
pub async fn outputs_same_rank_and_path_replaced(store: &dyn Store) {
    let task = store
        .create_task(new_task("again", "alice", 30))
        .await
        .unwrap()
        .id;
    store
        .add_output(output(task, 1, 2, "model.bin", 10))
        .await
        .unwrap();
    store
        .add_output(output(task, 1, 2, "model.bin", 99))
        .await
        .unwrap();
    assert_eq!(
        store.list_outputs(task).await.unwrap(),
        vec![output(task, 1, 2, "model.bin", 99)]
    );
}
