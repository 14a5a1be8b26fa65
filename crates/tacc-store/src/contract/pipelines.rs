//! The contract of pipelines: a pipeline group, its stages' tasks and array groups and its
//! stage rows made in one call; stages read back by pipeline, by what they ran as, and by
//! cache key.

use tacc_core::{GroupId, Timestamp};

use super::new_task;
use crate::{GroupKind, NewGroup, NewStage, NewStageRun, StageSource, Store, TaskFilter};

fn group(kind: GroupKind, name: &str, user: &str) -> NewGroup {
    NewGroup {
        kind,
        name: name.to_string(),
        user: user.to_string(),
        spec: serde_json::json!({"name": name}),
        created_at: Timestamp(10),
    }
}

fn stage(name: &str, needs: &[&str], key: &str, run: NewStageRun) -> NewStage {
    NewStage {
        name: name.to_string(),
        needs: needs.iter().map(|n| n.to_string()).collect(),
        cache_key: key.to_string(),
        run,
    }
}

/// gen (task) → sweep (array of 2) → eval (task).
fn three_stages(user: &str) -> Vec<NewStage> {
    vec![
        stage(
            "gen",
            &[],
            "k-gen",
            NewStageRun::Task(new_task("p-gen", user, 10)),
        ),
        stage(
            "fan",
            &["gen"],
            "k-fan",
            NewStageRun::Array {
                group: group(GroupKind::Array, "p-fan", user),
                elements: vec![
                    (0, new_task("p-fan", user, 10)),
                    (1, new_task("p-fan", user, 10)),
                ],
            },
        ),
        stage(
            "eval",
            &["fan", "gen"],
            "k-eval",
            NewStageRun::Task(new_task("p-eval", user, 10)),
        ),
    ]
}

pub async fn pipelines_create_stages_tasks_and_arrays_at_once(store: &dyn Store) {
    let (pipeline, stages, tasks) = store
        .create_pipeline(
            group(GroupKind::Pipeline, "p", "alice"),
            three_stages("alice"),
        )
        .await
        .unwrap();
    assert_eq!(pipeline.kind, GroupKind::Pipeline);
    assert_eq!(pipeline.size, 3, "a pipeline's size is its stages");
    assert_eq!(tasks.len(), 4, "two single tasks and two array elements");
    assert_eq!(
        stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["gen", "fan", "eval"]
    );
    assert_eq!(stages[2].needs, ["fan", "gen"]);
    let StageSource::Task(gen_task) = stages[0].source else {
        panic!("a single stage runs as a task: {:?}", stages[0]);
    };
    let StageSource::Group(fan) = stages[1].source else {
        panic!("an array stage runs as a group: {:?}", stages[1]);
    };
    let gen_record = store.get_task(gen_task).await.unwrap().unwrap();
    assert_eq!(gen_record.group, Some(pipeline.id));
    assert_eq!(
        gen_record.group_index, None,
        "a single stage is no array element"
    );
    let elements = store
        .list_tasks(&TaskFilter {
            group: Some(fan),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(elements.len(), 2);
    assert_eq!(
        store.get_group(fan).await.unwrap().unwrap().kind,
        GroupKind::Array
    );
    assert_eq!(store.pipeline_stages(pipeline.id).await.unwrap(), stages);
    assert!(
        store
            .pipeline_stages(GroupId(9_999))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn pipeline_stages_found_by_what_they_ran_as(store: &dyn Store) {
    let (_, stages, _) = store
        .create_pipeline(
            group(GroupKind::Pipeline, "p", "alice"),
            three_stages("alice"),
        )
        .await
        .unwrap();
    for stage in &stages {
        assert_eq!(
            store.stage_of(stage.source).await.unwrap().as_ref(),
            Some(stage)
        );
    }
    // A later run reusing the first stage is not what that task ran as.
    let (_, again, _) = store
        .create_pipeline(
            group(GroupKind::Pipeline, "p", "alice"),
            vec![stage(
                "gen",
                &[],
                "k-gen",
                NewStageRun::Cached(stages[0].source),
            )],
        )
        .await
        .unwrap();
    assert!(again[0].cached);
    assert_eq!(
        store.stage_of(stages[0].source).await.unwrap().as_ref(),
        Some(&stages[0])
    );
}

pub async fn pipeline_stages_found_by_cache_key_newest_first_per_user(store: &dyn Store) {
    let (first, stages, _) = store
        .create_pipeline(
            group(GroupKind::Pipeline, "p", "alice"),
            three_stages("alice"),
        )
        .await
        .unwrap();
    let (second, _, _) = store
        .create_pipeline(
            group(GroupKind::Pipeline, "p", "alice"),
            vec![stage(
                "gen",
                &[],
                "k-gen",
                NewStageRun::Cached(stages[0].source),
            )],
        )
        .await
        .unwrap();
    store
        .create_pipeline(group(GroupKind::Pipeline, "p", "bob"), three_stages("bob"))
        .await
        .unwrap();
    let found = store
        .stages_with_key("alice", "p", "gen", "k-gen")
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|s| s.pipeline).collect::<Vec<_>>(),
        [second.id, first.id]
    );
    assert!(found.iter().all(|s| s.source == stages[0].source));
    assert!(
        store
            .stages_with_key("alice", "p", "gen", "other")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .stages_with_key("alice", "q", "gen", "k-gen")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .stages_with_key("alice", "p", "eval", "k-gen")
            .await
            .unwrap()
            .is_empty()
    );
}
