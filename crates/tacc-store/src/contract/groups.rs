//! The contract of task groups (created with all their elements at once, listed, counted
//! by state), of the history of ended tasks, and of the notification outbox.

use tacc_core::{GroupId, TaskId, TaskState, Timestamp};

use super::{change, new_task, transition};
use crate::{
    DeliveryOutcome, GroupFilter, GroupKind, HistoryFilter, NewDelivery, NewGroup, Store,
    StoreError, TaskChange, TaskFilter, Transition,
};

fn new_group(name: &str, user: &str, at: u64) -> NewGroup {
    NewGroup {
        kind: GroupKind::Array,
        name: name.to_string(),
        user: user.to_string(),
        spec: serde_json::json!({"name": name, "run": "true", "array": "0-2"}),
        created_at: Timestamp(at),
    }
}

async fn array(store: &dyn Store, name: &str, user: &str, indices: &[u32]) -> Vec<TaskId> {
    let elements = indices
        .iter()
        .map(|i| (*i, new_task(name, user, 10)))
        .collect();
    let (_, tasks) = store
        .create_group(new_group(name, user, 10), elements)
        .await
        .unwrap();
    tasks.iter().map(|t| t.id).collect()
}

/// Queued → starting → running → `to`, ending at `at`.
async fn end(store: &dyn Store, task: TaskId, to: TaskState, at: u64) {
    store
        .apply(&[
            change(transition(
                task,
                TaskState::Queued,
                TaskState::Starting,
                1,
                at - 2,
            )),
            change(transition(
                task,
                TaskState::Starting,
                TaskState::Running,
                1,
                at - 1,
            )),
            change(transition(task, TaskState::Running, to, 1, at)),
        ])
        .await
        .unwrap();
}

fn delivery(key: &str, at: u64) -> NewDelivery {
    NewDelivery {
        key: key.to_string(),
        user: "alice".into(),
        url: "http://127.0.0.1:9/hook".into(),
        secret: "HOOK_KEY".into(),
        body: format!("{{\"key\":\"{key}\"}}"),
        created_at: Timestamp(at),
    }
}

pub async fn groups_create_every_element_with_its_index(store: &dyn Store) {
    let before = store
        .create_task(new_task("alone", "alice", 1))
        .await
        .unwrap();
    let (group, tasks) = store
        .create_group(
            new_group("sweep", "alice", 5),
            (0..3)
                .map(|i| (i * 2, new_task("sweep", "alice", 5)))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(group.size, 3);
    assert_eq!(group.kind, GroupKind::Array);
    assert_eq!(
        store.get_group(group.id).await.unwrap(),
        Some(group.clone())
    );
    assert!(store.get_group(GroupId(999)).await.unwrap().is_none());
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids[0] > before.id);
    for (task, index) in tasks.iter().zip([0, 2, 4]) {
        let loaded = store.get_task(task.id).await.unwrap().unwrap();
        assert_eq!(&loaded, task);
        assert_eq!(loaded.group, Some(group.id));
        assert_eq!(loaded.group_index, Some(index));
        assert_eq!(loaded.state, TaskState::Queued);
        assert_eq!(store.task_events(task.id).await.unwrap().len(), 1);
    }
    let elements = store
        .list_tasks(&TaskFilter {
            group: Some(group.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(elements.len(), 3);
    let ungrouped = store
        .list_tasks(&TaskFilter {
            ungrouped: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        ungrouped.iter().map(|t| t.id).collect::<Vec<_>>(),
        [before.id]
    );
}

pub async fn groups_listed_newest_first_by_user_and_state(store: &dyn Store) {
    let first = array(store, "a", "alice", &[0, 1]).await;
    array(store, "b", "bob", &[0]).await;
    array(store, "c", "alice", &[0]).await;
    let mine = store
        .list_groups(&GroupFilter {
            user: Some("alice".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        mine.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        ["c", "a"]
    );
    let limited = store
        .list_groups(&GroupFilter {
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited[0].name, "c");
    for task in &first {
        end(store, *task, TaskState::Succeeded, 50).await;
    }
    let active = store
        .list_groups(&GroupFilter {
            with_states: vec![TaskState::Queued],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        active.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        ["c", "b"]
    );
}

/// The group task `task` is an element of.
async fn group_of(store: &dyn Store, task: TaskId) -> GroupId {
    store.get_task(task).await.unwrap().unwrap().group.unwrap()
}

pub async fn group_counts_follow_element_states(store: &dyn Store) {
    let tasks = array(store, "a", "alice", &[0, 1, 2, 3]).await;
    end(store, tasks[0], TaskState::Succeeded, 20).await;
    end(store, tasks[1], TaskState::Failed, 21).await;
    let group = group_of(store, tasks[0]).await;
    let counts = store.group_counts(group).await.unwrap();
    assert_eq!(counts.get(&TaskState::Queued), Some(&2));
    assert_eq!(counts.get(&TaskState::Succeeded), Some(&1));
    assert_eq!(counts.get(&TaskState::Failed), Some(&1));
    assert_eq!(counts.get(&TaskState::Running), None);
    assert!(store.group_counts(GroupId(999)).await.unwrap().is_empty());
}

pub async fn group_has_open_until_its_last_element_ends(store: &dyn Store) {
    let tasks = array(store, "a", "alice", &[0, 1, 2]).await;
    let group = group_of(store, tasks[0]).await;
    let other = array(store, "b", "alice", &[0]).await;
    assert!(store.group_has_open(group).await.unwrap(), "all queued");
    end(store, tasks[0], TaskState::Succeeded, 20).await;
    end(store, tasks[1], TaskState::Cancelled, 21).await;
    assert!(store.group_has_open(group).await.unwrap(), "one left");
    end(store, tasks[2], TaskState::Failed, 22).await;
    assert!(
        !store.group_has_open(group).await.unwrap(),
        "every element ended"
    );
    let other = group_of(store, other[0]).await;
    assert!(
        store.group_has_open(other).await.unwrap(),
        "another group's"
    );
    assert!(
        !store.group_has_open(GroupId(999)).await.unwrap(),
        "no group"
    );
}

pub async fn history_lists_ended_tasks_newest_end_first_in_pages(store: &dyn Store) {
    let mut ids = Vec::new();
    for (i, at) in [(0, 30), (1, 10), (2, 20)] {
        let id = store
            .create_task(new_task(&format!("t{i}"), "alice", 1))
            .await
            .unwrap()
            .id;
        end(store, id, TaskState::Succeeded, at).await;
        ids.push(id);
    }
    store
        .create_task(new_task("open", "alice", 1))
        .await
        .unwrap();
    let page = |before| HistoryFilter {
        before,
        limit: 2,
        ..Default::default()
    };
    let first = store.task_history(&page(None)).await.unwrap();
    assert_eq!(
        first.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[0], ids[2]]
    );
    let last = first.last().unwrap();
    let cursor = Some((last.finished_at.unwrap(), last.id));
    let second = store.task_history(&page(cursor)).await.unwrap();
    assert_eq!(second.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[1]]);
}

pub async fn history_filters_by_name_state_user_and_since(store: &dyn Store) {
    let a = store
        .create_task(new_task("train", "alice", 1))
        .await
        .unwrap()
        .id;
    let b = store
        .create_task(new_task("train", "bob", 1))
        .await
        .unwrap()
        .id;
    let c = store
        .create_task(new_task("eval", "alice", 1))
        .await
        .unwrap()
        .id;
    end(store, a, TaskState::Failed, 10).await;
    end(store, b, TaskState::Succeeded, 20).await;
    end(store, c, TaskState::Succeeded, 30).await;
    let ids = |tasks: Vec<crate::TaskRecord>| tasks.iter().map(|t| t.id).collect::<Vec<_>>();
    let all = HistoryFilter {
        limit: 10,
        ..Default::default()
    };
    let by_name = HistoryFilter {
        name: Some("train".into()),
        ..all.clone()
    };
    assert_eq!(ids(store.task_history(&by_name).await.unwrap()), [b, a]);
    let failed = HistoryFilter {
        states: vec![TaskState::Failed],
        ..all.clone()
    };
    assert_eq!(ids(store.task_history(&failed).await.unwrap()), [a]);
    let alice = HistoryFilter {
        user: Some("alice".into()),
        ..all.clone()
    };
    assert_eq!(ids(store.task_history(&alice).await.unwrap()), [c, a]);
    let recent = HistoryFilter {
        since: Some(Timestamp(20)),
        ..all
    };
    assert_eq!(ids(store.task_history(&recent).await.unwrap()), [c, b]);
}

pub async fn deliveries_queue_with_their_change_once_per_key(store: &dyn Store) {
    let task = store
        .create_task(new_task("t", "alice", 1))
        .await
        .unwrap()
        .id;
    store
        .apply(&[
            change(transition(
                task,
                TaskState::Queued,
                TaskState::Cancelled,
                1,
                5,
            )),
            TaskChange::Notify(delivery("task:1", 5)),
        ])
        .await
        .unwrap();
    store
        .apply(&[TaskChange::Notify(NewDelivery {
            body: "second".into(),
            ..delivery("task:1", 6)
        })])
        .await
        .unwrap();
    let queued = store.get_delivery("task:1").await.unwrap().unwrap();
    assert_eq!(
        queued.body, "{\"key\":\"task:1\"}",
        "the first one queued stays"
    );
    assert_eq!(queued.attempts, 0);
    // A change that fails takes its notification with it.
    let failed = store
        .apply(&[
            TaskChange::Notify(delivery("task:2", 7)),
            change(Transition {
                ..transition(task, TaskState::Running, TaskState::Succeeded, 1, 7)
            }),
        ])
        .await;
    assert!(
        matches!(failed, Err(StoreError::Conflict { .. })),
        "{failed:?}"
    );
    assert!(store.get_delivery("task:2").await.unwrap().is_none());
}

pub async fn deliveries_come_due_retry_and_end(store: &dyn Store) {
    store
        .apply(&[
            TaskChange::Notify(delivery("a", 10)),
            TaskChange::Notify(delivery("b", 20)),
        ])
        .await
        .unwrap();
    let due = store.due_deliveries(Timestamp(15), 10).await.unwrap();
    assert_eq!(
        due.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    let a = due[0].id;
    let retry = DeliveryOutcome::Retry {
        next_at: Timestamp(40),
        error: "HTTP 500".into(),
    };
    assert!(store.finish_delivery(a, retry).await.unwrap());
    let due = store.due_deliveries(Timestamp(30), 10).await.unwrap();
    assert_eq!(
        due.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    let a_now = store.get_delivery("a").await.unwrap().unwrap();
    assert_eq!(a_now.attempts, 1);
    assert_eq!(a_now.last_error.as_deref(), Some("HTTP 500"));
    let delivered = DeliveryOutcome::Delivered { at: Timestamp(41) };
    assert!(store.finish_delivery(a, delivered).await.unwrap());
    let gave_up = DeliveryOutcome::GaveUp {
        error: "timed out".into(),
    };
    assert!(store.finish_delivery(due[0].id, gave_up).await.unwrap());
    assert!(
        store
            .due_deliveries(Timestamp(1000), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let a_done = store.get_delivery("a").await.unwrap().unwrap();
    assert_eq!(
        (a_done.attempts, a_done.delivered_at),
        (2, Some(Timestamp(41)))
    );
    assert!(store.get_delivery("b").await.unwrap().unwrap().gave_up);
    assert!(
        !store
            .finish_delivery(999, DeliveryOutcome::Delivered { at: Timestamp(1) })
            .await
            .unwrap()
    );
}
