//! The behaviour every [`Store`](crate::Store) implementation must show, one public
//! function per behaviour, each expecting a fresh, empty store. Each implementation's tests
//! run all of them through [`store_contract_tests!`](crate::store_contract_tests), so the
//! fake and the real stores cannot drift apart.

mod access;
mod adaptive;
mod enrolment;
mod groups;
mod idempotency;
mod lease;
mod metrics;
mod outputs;
mod pipelines;
mod restart_facts;
mod task_uids;
mod usage;

pub use access::*;
pub use adaptive::*;
pub use enrolment::*;
pub use groups::*;
pub use idempotency::*;
pub use lease::*;
pub use metrics::*;
pub use outputs::*;
pub use pipelines::*;
pub use restart_facts::*;
pub use task_uids::*;
pub use usage::*;

use std::collections::BTreeMap;

use tacc_core::{AttemptNo, NodeId, Resources, SnapshotId, TaskId, TaskState, Timestamp};

use crate::{
    NewNode, NewTask, OutputRecord, Store, StoreError, StoredPlacement, TaskChange, TaskFilter,
    Transition,
};

fn snapshot() -> SnapshotId {
    "ab".repeat(32).parse().expect("valid snapshot id")
}

/// A task of `user` submitted at `at` (milliseconds), on the contract's snapshot.
pub fn new_task(name: &str, user: &str, at: u64) -> NewTask {
    NewTask {
        name: name.to_string(),
        user: user.to_string(),
        spec: serde_json::json!({"name": name, "run": "true"}),
        snapshot: snapshot(),
        source: Some("task.yaml".into()),
        submitted_at: Timestamp(at),
        // Not empty, so every read-back the contract compares shows it was kept.
        submission: serde_json::json!({"wait_for_capacity": true}),
    }
}

fn transition(task: TaskId, from: TaskState, to: TaskState, attempt: u32, at: u64) -> Transition {
    Transition::new(task, from, to, AttemptNo(attempt), Timestamp(at))
}

fn change(t: Transition) -> TaskChange {
    TaskChange::Transition(t)
}

/// One `#[tokio::test]` per behaviour of the contract, each on a fresh store, so one
/// failure does not hide the others.
///
/// `$fresh` names an async function returning `(store, guard)`: a new, empty store and
/// whatever must outlive it (its temporary directory, or `()`). Invoke it once per
/// implementation, inside a module named after it:
///
/// ```ignore
/// mod sqlite {
///     tacc_store::store_contract_tests!(super::fresh_sqlite);
/// }
/// ```
///
/// A store on a server that may be absent (PostgreSQL) uses `optional`: `$fresh` then
/// takes the test's name and returns `None` when the test is skipped.
///
/// ```ignore
/// mod postgres {
///     tacc_store::store_contract_tests!(optional super::fresh_postgres);
/// }
/// ```
///
/// A new check in this module must be added to the list below, or it never runs.
#[macro_export]
macro_rules! store_contract_tests {
    ($fresh:path) => {
        $crate::store_contract_tests!(@list plain $fresh);
    };
    (optional $fresh:path) => {
        $crate::store_contract_tests!(@list optional $fresh);
    };
    (@list $mode:ident $fresh:path) => {
        $crate::store_contract_tests!(@each $mode $fresh;
            tasks_get_ids_in_order_and_round_trip,
            sync_covers_every_write_before_it,
            lifecycle_records_every_transition,
            apply_is_all_or_nothing,
            one_apply_takes_a_task_through_several_changes_in_order,
            list_filters_by_state_and_user,
            nodes_keep_their_id_when_re_registered,
            nodes_drain_persists_and_remove_forgets,
            snapshots_and_outputs,
            outputs_kept_per_rank,
            outputs_listed_by_attempt_rank_and_path,
            outputs_same_rank_and_path_replaced,
            users_round_trip_and_list_by_name,
            users_duplicate_name_refused,
            tokens_found_by_hash_and_id,
            tokens_duplicate_hash_refused,
            tokens_listed_by_user,
            tokens_revoke_once,
            tokens_expire,
            join_tokens_enrol_one_node_by_default,
            join_tokens_bound_to_a_name_refuse_others,
            join_tokens_enrol_up_to_their_limit_once_per_name,
            join_token_uses_are_durable_records,
            nodes_keep_their_enrolled_capacity_and_approval_across_restarts,
            audit_lists_oldest_first,
            audit_since_is_inclusive,
            audit_limit_keeps_the_newest,
            audit_prune_deletes_only_older_entries,
            secrets_round_trip,
            secrets_put_replaces,
            secrets_listed_by_name,
            secrets_delete_once,
            secrets_isolated_per_user,
            snapshot_owners_idempotent,
            snapshot_owners_per_user_and_snapshot,
            chunk_owners_per_user_in_batches,
            usage_peaks_keep_each_measure_s_maximum,
            usage_peaks_listed_by_attempt_then_rank_per_task,
            usage_peak_of_an_unknown_task_refused,
            resizes_of_the_running_attempt_are_kept_in_order,
            a_resize_of_a_task_not_running_that_attempt_is_a_conflict,
            signal_points_keep_the_newest_per_attempt,
            active_between_finds_tasks_that_held_resources_in_the_window,
            active_between_keeps_every_attempt,
            active_between_filters_by_user,
            groups_create_every_element_with_its_index,
            groups_listed_newest_first_by_user_and_state,
            group_counts_follow_element_states,
            group_has_open_until_its_last_element_ends,
            history_lists_ended_tasks_newest_end_first_in_pages,
            history_filters_by_name_state_user_and_since,
            deliveries_queue_with_their_change_once_per_key,
            metrics_kept_per_attempt_in_arrival_order,
            metrics_bounded_per_attempt_keeping_the_first,
            metrics_of_an_unknown_task_refused_whole,
            groups_grow_by_added_elements,
            deliveries_come_due_retry_and_end,
            pipelines_create_stages_tasks_and_arrays_at_once,
            pipeline_stages_found_by_what_they_ran_as,
            pipeline_stages_found_by_cache_key_newest_first_per_user,
            idempotency_keyed_task_keeps_its_reply,
            idempotency_taken_key_creates_nothing,
            idempotency_keyed_group_keeps_every_element_id,
            idempotency_keys_are_per_user,
            idempotency_keys_expire_after_a_day,
            idempotency_reply_kept_on_its_own_once,
            idempotency_keyed_pipeline_is_all_or_nothing,
            ids_are_never_reused_after_a_refused_write,
            lease_free_is_taken_with_epoch_one,
            lease_held_is_refused_to_another_replica,
            lease_lapsed_is_taken_over_with_a_higher_epoch,
            lease_renewed_by_its_holder_keeps_its_epoch,
            lease_renewal_after_a_takeover_is_refused,
            lease_renewal_by_another_replica_is_refused,
            task_uids_allocated_from_the_base_and_kept,
            task_uids_never_repeat_when_the_base_changes,
            task_uids_racing_allocations_never_share_a_uid,
            rank_ends_kept_per_attempt_with_their_change,
            rank_ends_roll_back_with_a_failed_change,
            fairshare_ledgers_kept_and_replaced,
            nodes_last_seen_kept_across_registrations,
            dashboard_sessions_kept_found_forgotten_and_pruned,
            recent_run_times_of_a_user_s_succeeded_tasks_by_name,
        );
    };
    (@each plain $fresh:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let (store, _guard) = $fresh().await;
                $crate::contract::$check(&store).await;
            }
        )+
    };
    (@each optional $fresh:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let Some((store, _guard)) = $fresh(stringify!($check)).await else {
                    return;
                };
                $crate::contract::$check(&store).await;
            }
        )+
    };
}

pub async fn tasks_get_ids_in_order_and_round_trip(store: &dyn Store) {
    let first = store.create_task(new_task("a", "alice", 10)).await.unwrap();
    let second = store.create_task(new_task("b", "bob", 11)).await.unwrap();
    assert!(second.id > first.id, "ids must increase");
    let loaded = store
        .get_task(first.id)
        .await
        .unwrap()
        .expect("task exists");
    assert_eq!(loaded, first);
    assert_eq!(loaded.state, TaskState::Queued);
    assert_eq!(loaded.attempt, AttemptNo::FIRST);
    assert!(store.get_task(TaskId(999_999)).await.unwrap().is_none());
}

pub async fn lifecycle_records_every_transition(store: &dyn Store) {
    let task = store
        .create_task(new_task("life", "alice", 100))
        .await
        .unwrap()
        .id;
    let placements = vec![StoredPlacement {
        node: NodeId(3),
        gpu_indices: vec![0, 1],
    }];
    store
        .apply(&[change(Transition {
            placements: placements.clone(),
            ..transition(task, TaskState::Queued, TaskState::Starting, 1, 110)
        })])
        .await
        .unwrap();
    store
        .apply(&[change(transition(
            task,
            TaskState::Starting,
            TaskState::Running,
            1,
            120,
        ))])
        .await
        .unwrap();
    // A retry: failed attempt 1 goes back to the queue as attempt 2.
    store
        .apply(&[
            change(Transition {
                exit_code: Some(3),
                reason: Some("exit_code".into()),
                ..transition(task, TaskState::Running, TaskState::Failed, 1, 130)
            }),
            change(transition(
                task,
                TaskState::Failed,
                TaskState::Queued,
                2,
                130,
            )),
        ])
        .await
        .unwrap();
    let record = store.get_task(task).await.unwrap().unwrap();
    assert_eq!(record.state, TaskState::Queued);
    assert_eq!(record.attempt, AttemptNo(2));
    assert!(
        record.placements.is_empty(),
        "a requeued task holds no placement"
    );
    assert_eq!(record.exit_code, None);

    store
        .apply(&[change(Transition {
            placements: placements.clone(),
            ..transition(task, TaskState::Queued, TaskState::Starting, 2, 140)
        })])
        .await
        .unwrap();
    store
        .apply(&[TaskChange::CancelRequested { task }])
        .await
        .unwrap();
    store
        .apply(&[change(transition(
            task,
            TaskState::Starting,
            TaskState::Running,
            2,
            150,
        ))])
        .await
        .unwrap();
    store
        .apply(&[change(Transition {
            exit_code: Some(0),
            ..transition(task, TaskState::Running, TaskState::Succeeded, 2, 160)
        })])
        .await
        .unwrap();
    let record = store.get_task(task).await.unwrap().unwrap();
    assert_eq!(record.state, TaskState::Succeeded);
    assert_eq!(record.placements, placements);
    assert!(record.cancel_requested);
    assert_eq!(record.started_at, Some(Timestamp(150)));
    assert_eq!(record.finished_at, Some(Timestamp(160)));
    assert_eq!(record.exit_code, Some(0));

    let events = store.task_events(task).await.unwrap();
    let seen: Vec<(u32, TaskState, u64)> = events
        .iter()
        .map(|e| (e.attempt.0, e.state, e.at.0))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, TaskState::Queued, 100),
            (1, TaskState::Starting, 110),
            (1, TaskState::Running, 120),
            (1, TaskState::Failed, 130),
            (2, TaskState::Queued, 130),
            (2, TaskState::Starting, 140),
            (2, TaskState::Running, 150),
            (2, TaskState::Succeeded, 160),
        ]
    );
    assert_eq!(events[3].reason.as_deref(), Some("exit_code"));
}

/// `sync` returns once what was written before it is durable, again and again, with or
/// without writes between; it changes nothing that reads see.
pub async fn sync_covers_every_write_before_it(store: &dyn Store) {
    store.sync().await.expect("a sync with nothing written");
    let task = store.create_task(new_task("a", "alice", 10)).await.unwrap();
    store.sync().await.expect("a sync after a write");
    store.sync().await.expect("a sync with nothing new");
    let (a, b) = tokio::join!(store.sync(), store.sync());
    a.and(b).expect("concurrent syncs");
    assert_eq!(store.get_task(task.id).await.unwrap(), Some(task));
}

/// Several changes of one task in one `apply` (a short task's start and end in one report
/// batch) leave it as the last says, with every transition in its history in order, and
/// a reason set between them kept.
pub async fn one_apply_takes_a_task_through_several_changes_in_order(store: &dyn Store) {
    let task = store
        .create_task(new_task("short", "alice", 300))
        .await
        .unwrap()
        .id;
    let placed = Transition {
        placements: vec![StoredPlacement {
            node: NodeId(1),
            gpu_indices: vec![],
        }],
        ..transition(task, TaskState::Queued, TaskState::Starting, 1, 310)
    };
    let ended = Transition {
        exit_code: Some(0),
        ..transition(task, TaskState::Running, TaskState::Succeeded, 1, 330)
    };
    store
        .apply(&[
            change(placed),
            change(transition(
                task,
                TaskState::Starting,
                TaskState::Running,
                1,
                320,
            )),
            TaskChange::Reason {
                task,
                reason: Some("runtime process".into()),
            },
            change(ended),
        ])
        .await
        .unwrap();
    let record = store.get_task(task).await.unwrap().unwrap();
    assert_eq!(record.state, TaskState::Succeeded);
    assert_eq!(record.started_at, Some(Timestamp(320)));
    assert_eq!(record.finished_at, Some(Timestamp(330)));
    assert_eq!(record.exit_code, Some(0));
    assert_eq!(record.placements.len(), 1);
    // The end's transition set the reason (none) after the reason change.
    assert_eq!(record.reason, None);
    let states: Vec<TaskState> = store
        .task_events(task)
        .await
        .unwrap()
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        states,
        [
            TaskState::Queued,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Succeeded
        ]
    );
    // A change a task's row cannot follow fails the whole apply, even after others of it.
    let again = store
        .apply(&[
            TaskChange::Reason {
                task,
                reason: Some("late".into()),
            },
            change(transition(
                task,
                TaskState::Running,
                TaskState::Failed,
                1,
                340,
            )),
        ])
        .await
        .unwrap_err();
    assert!(matches!(again, StoreError::Conflict { .. }), "{again}");
    assert_eq!(store.get_task(task).await.unwrap().unwrap().reason, None);
}

pub async fn apply_is_all_or_nothing(store: &dyn Store) {
    let a = store
        .create_task(new_task("atomic-a", "alice", 200))
        .await
        .unwrap()
        .id;
    let b = store
        .create_task(new_task("atomic-b", "alice", 201))
        .await
        .unwrap()
        .id;
    // The second change expects the wrong state, so neither may be applied.
    let err = store
        .apply(&[
            change(transition(
                a,
                TaskState::Queued,
                TaskState::Starting,
                1,
                210,
            )),
            change(transition(
                b,
                TaskState::Running,
                TaskState::Succeeded,
                1,
                210,
            )),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { task, .. } if task == b),
        "{err}"
    );
    assert_eq!(
        store.get_task(a).await.unwrap().unwrap().state,
        TaskState::Queued
    );
    assert_eq!(store.task_events(a).await.unwrap().len(), 1);
    let missing = store
        .apply(&[TaskChange::Reason {
            task: TaskId(888_888),
            reason: None,
        }])
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::TaskNotFound(TaskId(888_888))));
    store
        .apply(&[TaskChange::Reason {
            task: a,
            reason: Some("waiting for resources".into()),
        }])
        .await
        .unwrap();
    let record = store.get_task(a).await.unwrap().unwrap();
    assert_eq!(record.reason.as_deref(), Some("waiting for resources"));
    assert_eq!(
        store.task_events(a).await.unwrap().len(),
        1,
        "a reason change is not a transition"
    );
}

pub async fn list_filters_by_state_and_user(store: &dyn Store) {
    let carol = store
        .create_task(new_task("list-1", "carol", 300))
        .await
        .unwrap()
        .id;
    let carol2 = store
        .create_task(new_task("list-2", "carol", 301))
        .await
        .unwrap()
        .id;
    store
        .apply(&[change(transition(
            carol2,
            TaskState::Queued,
            TaskState::Cancelled,
            1,
            302,
        ))])
        .await
        .unwrap();
    let mine = store
        .list_tasks(&TaskFilter {
            user: Some("carol".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let counted = store
        .count_tasks(&TaskFilter {
            user: Some("carol".into()),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(counted, 2, "a count ignores the limit");
    let queued = store
        .count_tasks(&TaskFilter {
            states: vec![TaskState::Queued],
            user: Some("carol".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(queued, 1);
    assert_eq!(
        mine.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![carol2, carol],
        "newest first"
    );
    let queued = store
        .list_tasks(&TaskFilter {
            user: Some("carol".into()),
            states: vec![TaskState::Queued],
            limit: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(queued.iter().map(|t| t.id).collect::<Vec<_>>(), vec![carol]);
    let limited = store
        .list_tasks(&TaskFilter {
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 1);
    assert_eq!(limited[0].id, carol2);
}

pub async fn nodes_keep_their_id_when_re_registered(store: &dyn Store) {
    let node = |cpus: u64| NewNode {
        name: "gpu-01".into(),
        capacity: Resources::new(cpus * 1000, 64 << 30, 8),
        gpu_type: Some("A100".into()),
        labels: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
        address: "10.0.0.1".into(),
        registered_at: Timestamp(400),
        enrolment: None,
    };
    let first = store.register_node(node(32)).await.unwrap();
    let again = store.register_node(node(64)).await.unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(again.capacity.cpu_millis, 64_000);
    let other = store
        .register_node(NewNode {
            name: "gpu-02".into(),
            ..node(8)
        })
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
    let nodes = store.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0].labels["rack"], "r1");
}

pub async fn nodes_drain_persists_and_remove_forgets(store: &dyn Store) {
    let node = |name: &str| NewNode {
        name: name.into(),
        capacity: Resources::new(8000, 16 << 30, 1),
        gpu_type: None,
        labels: BTreeMap::new(),
        address: "10.0.0.1".into(),
        registered_at: Timestamp(500),
        enrolment: None,
    };
    let first = store.register_node(node("n1")).await.unwrap();
    let second = store.register_node(node("n2")).await.unwrap();
    assert!(!first.drained, "a new node is not drained");
    assert!(store.set_node_drained(first.id, true).await.unwrap());
    let again = store.register_node(node("n1")).await.unwrap();
    assert!(again.drained, "re-registering keeps the drain");
    let nodes = store.list_nodes().await.unwrap();
    assert!(nodes.iter().find(|n| n.id == first.id).unwrap().drained);
    assert!(!nodes.iter().find(|n| n.id == second.id).unwrap().drained);
    assert!(store.set_node_drained(first.id, false).await.unwrap());
    assert!(!store.list_nodes().await.unwrap()[0].drained);
    assert!(!store.set_node_drained(NodeId(999), true).await.unwrap());

    assert!(store.remove_node(second.id).await.unwrap());
    assert!(!store.remove_node(second.id).await.unwrap());
    let nodes = store.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    let back = store.register_node(node("n2")).await.unwrap();
    assert_ne!(back.id, second.id, "a removed node's id is not reused");
    assert!(!back.drained);
}

pub async fn snapshots_and_outputs(store: &dyn Store) {
    let manifest = serde_json::json!({"entries": [{"path": "train.py"}]});
    store
        .put_snapshot(&snapshot(), &manifest, 10, Timestamp(500))
        .await
        .unwrap();
    store
        .put_snapshot(
            &snapshot(),
            &serde_json::json!({"other": true}),
            10,
            Timestamp(501),
        )
        .await
        .unwrap();
    assert_eq!(
        store.get_snapshot(&snapshot()).await.unwrap(),
        Some(manifest),
        "first write wins"
    );
    let absent: SnapshotId = "cd".repeat(32).parse().unwrap();
    assert!(store.get_snapshot(&absent).await.unwrap().is_none());
    assert_eq!(store.list_snapshots().await.unwrap(), vec![snapshot()]);

    let task = store
        .create_task(new_task("out", "alice", 510))
        .await
        .unwrap()
        .id;
    for (path, size) in [("results/model.json", 42), ("results/a.txt", 1)] {
        store
            .add_output(OutputRecord {
                task,
                attempt: AttemptNo::FIRST,
                rank: 0,
                path: path.into(),
                size,
            })
            .await
            .unwrap();
    }
    let outputs = store.list_outputs(task).await.unwrap();
    assert_eq!(outputs.len(), 2);
    assert!(
        outputs
            .iter()
            .any(|o| o.path == "results/model.json" && o.size == 42)
    );
    let err = store
        .add_output(OutputRecord {
            task: TaskId(777_777),
            attempt: AttemptNo::FIRST,
            rank: 0,
            path: "x".into(),
            size: 1,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TaskNotFound(_)), "{err}");
}
