//! The workflows driven through the [`TestEnv`] as the API drives them: an array is
//! accepted in one turn and cancelled as one group, a rerun submits the failed elements
//! again as a group of their own.

use tacc_core::TaskState::{self, *};
use tacc_store::TaskChange;

use super::test_env::TestEnv;

const ARRAY: &str = "name: a\nresources: {cpus: 1}\nrun: true\narray: \"0-2\"\n";

#[tokio::test]
async fn an_array_is_queued_in_one_turn_and_cancelled_as_one_group() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (group, elements) = env.submit_array(ARRAY).await;
    assert_eq!(elements.len(), 3);
    env.poll(&mut agent).await;
    let states = async || {
        let mut states = Vec::new();
        for task in &elements {
            states.push(env.state(*task).await);
        }
        states
    };
    // One node of one CPU: the first element starts, the others wait.
    assert_eq!(states().await, [Starting, Queued, Queued]);
    env.take_changes();
    let asked = env
        .arrays()
        .cancel(group)
        .await
        .expect("the group is cancelled");
    assert_eq!(asked, 3);
    // The queued elements end at once; the placed one when its agent confirms.
    let mut ended: Vec<(tacc_core::TaskId, TaskState)> = env
        .take_transitions()
        .into_iter()
        .map(|(task, _, to)| (task, to))
        .collect();
    ended.sort();
    assert_eq!(ended, [(elements[1], Cancelled), (elements[2], Cancelled)]);
    assert!(env.task(elements[0]).await.cancel_requested);
}

#[tokio::test]
async fn a_rerun_submits_only_the_failed_elements_again_as_a_group_of_their_own() {
    let env = TestEnv::new().await;
    let (group, elements) = env.submit_array(ARRAY).await;
    // No node: every element waits, held; the second is cancelled.
    env.control.cancel(elements[1]).await.expect("the cancel");
    let record = env
        .control
        .facts
        .group(group)
        .await
        .unwrap()
        .expect("the group");
    let (rerun, reran) = env
        .arrays()
        .rerun_failed(&record, "alice")
        .await
        .expect("the rerun")
        .expect("one element failed");
    assert_eq!(reran.len(), 1);
    assert_eq!(reran[0].group_index, Some(1));
    assert_eq!(rerun.spec["rerun_of"], serde_json::json!(group.0));
    assert!(
        env.take_changes()
            .iter()
            .any(|c| matches!(c, TaskChange::Reason { task, .. } if *task == reran[0].id)),
        "the rerun element is held while no node is up, saying why"
    );
    // Nothing failed in the rerun: a rerun of it submits nothing.
    let again = env
        .control
        .facts
        .group(rerun.id)
        .await
        .unwrap()
        .expect("the rerun group");
    assert!(
        env.arrays()
            .rerun_failed(&again, "alice")
            .await
            .expect("the rerun")
            .is_none()
    );
}
