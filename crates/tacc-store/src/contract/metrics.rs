//! The contract of reported metrics (kept per attempt in the order of arrival, bounded,
//! only for tasks that exist) and of groups that grow (a sweep's next trials).

use std::collections::BTreeMap;

use tacc_core::{AttemptNo, GroupId, TaskId, Timestamp};

use super::new_task;
use crate::{
    GroupKind, MAX_METRIC_POINTS_PER_ATTEMPT, MetricPoint, NewGroup, Store, StoreError, TaskFilter,
};

fn point(task: TaskId, attempt: u32, step: u64, loss: f64) -> MetricPoint {
    MetricPoint {
        task,
        attempt: AttemptNo(attempt),
        seq: 0,
        step,
        at: Timestamp(1000 + step),
        values: BTreeMap::from([("val_loss".to_string(), loss)]),
    }
}

pub async fn metrics_kept_per_attempt_in_arrival_order(store: &dyn Store) {
    let task = store.create_task(new_task("t", "ann", 1)).await.unwrap().id;
    let other = store.create_task(new_task("u", "ann", 1)).await.unwrap().id;
    store
        .append_metrics(vec![point(task, 1, 10, 0.5), point(task, 1, 5, 0.7)])
        .await
        .unwrap();
    store
        .append_metrics(vec![point(task, 2, 1, 0.9), point(other, 1, 1, 0.1)])
        .await
        .unwrap();
    store
        .append_metrics(vec![point(task, 1, 20, 0.3)])
        .await
        .unwrap();
    let kept = store.list_metrics(task).await.unwrap();
    let shown: Vec<(u32, u32, u64)> = kept.iter().map(|p| (p.attempt.0, p.seq, p.step)).collect();
    // Arrival order, not step order: a step a trial reports twice is kept twice.
    assert_eq!(shown, [(1, 0, 10), (1, 1, 5), (1, 2, 20), (2, 0, 1)]);
    assert_eq!(kept[2].values["val_loss"], 0.3);
    assert_eq!(kept[2].at, Timestamp(1020));
    assert_eq!(store.list_metrics(other).await.unwrap().len(), 1);
    assert!(store.list_metrics(TaskId(999)).await.unwrap().is_empty());
}

pub async fn metrics_bounded_per_attempt_keeping_the_first(store: &dyn Store) {
    let task = store.create_task(new_task("t", "ann", 1)).await.unwrap().id;
    let points: Vec<MetricPoint> = (0..u64::from(MAX_METRIC_POINTS_PER_ATTEMPT) + 5)
        .map(|step| point(task, 1, step, 1.0))
        .collect();
    store.append_metrics(points).await.unwrap();
    store
        .append_metrics(vec![point(task, 1, 99_999, 0.0), point(task, 2, 0, 0.0)])
        .await
        .unwrap();
    let kept = store.list_metrics(task).await.unwrap();
    let first: Vec<&MetricPoint> = kept.iter().filter(|p| p.attempt.0 == 1).collect();
    assert_eq!(first.len(), MAX_METRIC_POINTS_PER_ATTEMPT as usize);
    assert_eq!(
        first.last().unwrap().step,
        u64::from(MAX_METRIC_POINTS_PER_ATTEMPT) - 1
    );
    assert_eq!(kept.iter().filter(|p| p.attempt.0 == 2).count(), 1);
}

pub async fn metrics_of_an_unknown_task_refused_whole(store: &dyn Store) {
    let task = store.create_task(new_task("t", "ann", 1)).await.unwrap().id;
    let refused = store
        .append_metrics(vec![point(task, 1, 1, 0.5), point(TaskId(999), 1, 1, 0.5)])
        .await;
    assert!(
        matches!(refused, Err(StoreError::TaskNotFound(TaskId(999)))),
        "{refused:?}"
    );
    assert!(store.list_metrics(task).await.unwrap().is_empty());
}

pub async fn groups_grow_by_added_elements(store: &dyn Store) {
    let (group, first) = store
        .create_group(
            NewGroup {
                kind: GroupKind::Sweep,
                name: "s".into(),
                user: "ann".into(),
                spec: serde_json::json!({"name": "s", "run": "true"}),
                created_at: Timestamp(1),
            },
            vec![(0, new_task("s", "ann", 1))],
        )
        .await
        .unwrap();
    let added = store
        .add_group_elements(
            group.id,
            vec![(1, new_task("s", "ann", 2)), (2, new_task("s", "ann", 2))],
        )
        .await
        .unwrap();
    assert_eq!(added.len(), 2);
    assert!(added[0].id > first[0].id && added[1].id > added[0].id);
    assert_eq!(added[1].group, Some(group.id));
    assert_eq!(added[1].group_index, Some(2));
    assert_eq!(
        store.get_task(added[1].id).await.unwrap().as_ref(),
        Some(&added[1])
    );
    assert_eq!(store.get_group(group.id).await.unwrap().unwrap().size, 3);
    let elements = store
        .list_tasks(&TaskFilter {
            group: Some(group.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(elements.len(), 3);
    let missing = store
        .add_group_elements(GroupId(999), vec![(0, new_task("s", "ann", 3))])
        .await;
    assert!(
        matches!(missing, Err(StoreError::GroupNotFound(GroupId(999)))),
        "{missing:?}"
    );
}
