//! The decisions about arrays: the group and elements a submitted array is stored as,
//! and what a rerun of a group's failed elements submits (the same task, as a new array
//! of the failed indices, marked as the rerun of the group).

use tacc_core::{GroupId, SnapshotId, TaskState, Timestamp};
use tacc_schema::{ArraySpec, TaskSpec};
use tacc_store::{GroupKind, GroupRecord, NewGroup, NewTask, TaskRecord};

use crate::ServerError;
use crate::control::{Submission, SubmitOptions};

/// The states a rerun of "failed" elements starts again.
pub(crate) const RERUN_STATES: [TaskState; 3] =
    [TaskState::Failed, TaskState::Cancelled, TaskState::Lost];

/// An array as the store makes it: the group, each element by index, and the spec every
/// element runs.
pub(crate) struct NewArray {
    pub(crate) group: NewGroup,
    pub(crate) elements: Vec<(u32, NewTask)>,
    pub(crate) element: TaskSpec,
}

/// What every element of an array is submitted with.
pub(crate) struct ArraySubmitted<'a> {
    pub(crate) user: &'a str,
    pub(crate) snapshot: &'a SnapshotId,
    pub(crate) source: &'a Option<String>,
    pub(crate) at: Timestamp,
    pub(crate) submission: &'a serde_json::Value,
    /// The group this array reruns the failed elements of, recorded in its spec.
    pub(crate) rerun_of: Option<GroupId>,
}

/// The array `spec` (checked) asks for: one element per index of its `array:`, each the
/// task without the array, notifying nothing itself (the group reports once, when every
/// element has ended).
pub(crate) fn new_array(
    spec: TaskSpec,
    submitted: &ArraySubmitted<'_>,
) -> Result<NewArray, ServerError> {
    let Some(array) = spec.array.clone() else {
        return Err(ServerError::InvalidTask(
            "the task has no `array:`; submit it as a single task".into(),
        ));
    };
    let mut group_spec =
        serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?;
    if let (Some(of), Some(object)) = (submitted.rerun_of, group_spec.as_object_mut()) {
        object.insert("rerun_of".into(), serde_json::json!(of.0));
    }
    let element = TaskSpec {
        array: None,
        notify: None,
        ..spec
    };
    let element_json =
        serde_json::to_value(&element).map_err(|e| ServerError::Internal(e.to_string()))?;
    let elements = array
        .indices()
        .iter()
        .map(|index| {
            (
                *index,
                NewTask {
                    name: element.name.clone(),
                    user: submitted.user.to_string(),
                    spec: element_json.clone(),
                    snapshot: submitted.snapshot.clone(),
                    source: submitted.source.clone(),
                    submitted_at: submitted.at,
                    submission: submitted.submission.clone(),
                },
            )
        })
        .collect();
    Ok(NewArray {
        group: NewGroup {
            kind: GroupKind::Array,
            name: element.name.clone(),
            user: submitted.user.to_string(),
            spec: group_spec,
            created_at: submitted.at,
        },
        elements,
        element,
    })
}

/// What a rerun of a group's failed elements submits.
#[derive(Debug)]
pub(crate) struct Rerun {
    pub(crate) spec: TaskSpec,
    pub(crate) snapshot: SnapshotId,
    pub(crate) options: SubmitOptions,
}

/// The rerun of `group` whose elements `ended` (in [`RERUN_STATES`]) failed: the group's
/// task as an array of their indices, from the first one's code and source, waiting for
/// capacity if the run before did; `None` when none failed. A sweep is refused: its
/// stopped trials are its search.
pub(crate) fn rerun(
    group: &GroupRecord,
    ended: &[TaskRecord],
) -> Result<Option<Rerun>, ServerError> {
    if group.kind == GroupKind::Sweep {
        return Err(ServerError::InvalidTask(format!(
            "{} is a sweep: its stopped trials are its search, not failures; submit the \
             task file again to run a new sweep",
            group.id
        )));
    }
    let Some(first) = ended.first() else {
        return Ok(None);
    };
    let mut indices: Vec<u32> = ended.iter().filter_map(|t| t.group_index).collect();
    indices.sort_unstable();
    let array = ArraySpec::of_indices(&indices)
        .map_err(|e| ServerError::Internal(format!("rerun of {}: {e}", group.id)))?;
    let mut spec: TaskSpec =
        serde_json::from_value(strip_rerun_of(group.spec.clone())).map_err(|e| {
            ServerError::Internal(format!(
                "stored spec of group {} is unreadable: {e}",
                group.id
            ))
        })?;
    spec.array = Some(array);
    Ok(Some(Rerun {
        spec,
        snapshot: first.snapshot.clone(),
        options: SubmitOptions {
            source: first.source.clone(),
            wait_for_capacity: Submission::of(first).wait_for_capacity,
            ..Default::default()
        },
    }))
}

/// A group's stored spec without the rerun mark, which is no task field.
fn strip_rerun_of(mut spec: serde_json::Value) -> serde_json::Value {
    if let Some(object) = spec.as_object_mut() {
        object.remove("rerun_of");
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::rules::test_record;

    fn array_spec(indices: &str) -> TaskSpec {
        tacc_schema::parse_task(
            "task.yaml",
            &format!("name: a\nrun: echo\narray: \"{indices}\"\n"),
        )
        .unwrap()
        .0
    }

    fn group(kind: GroupKind, spec: &TaskSpec, rerun_of: Option<u64>) -> GroupRecord {
        let mut spec = serde_json::to_value(spec).unwrap();
        if let Some(of) = rerun_of {
            spec["rerun_of"] = serde_json::json!(of);
        }
        GroupRecord {
            id: GroupId(3),
            kind,
            name: "a".into(),
            user: "ann".into(),
            spec,
            created_at: Timestamp(0),
            size: 4,
        }
    }

    fn element(id: u64, index: u32, wait_for_capacity: bool) -> TaskRecord {
        let mut record = test_record(id, TaskState::Failed, 1, &[]);
        record.group_index = Some(index);
        record.source = Some(format!("src{id}"));
        record.submission = Submission {
            wait_for_capacity,
            overrides: Vec::new(),
        }
        .to_json();
        record
    }

    #[test]
    fn a_rerun_submits_the_failed_indices_from_the_first_failed_element() {
        let spec = array_spec("0-3");
        // (group kind, failed elements (id, index), rerun indices, none, or refused)
        type Case<'a> = (GroupKind, &'a [(u64, u32)], Result<Option<Vec<u32>>, ()>);
        let table: &[Case] = &[
            (GroupKind::Array, &[], Ok(None)),
            (GroupKind::Array, &[(7, 3), (5, 1)], Ok(Some(vec![1, 3]))),
            (GroupKind::Array, &[(5, 2)], Ok(Some(vec![2]))),
            (GroupKind::Sweep, &[(5, 2)], Err(())),
        ];
        for (kind, failed, expected) in table {
            let ended: Vec<TaskRecord> = failed
                .iter()
                .map(|(id, index)| element(*id, *index, *id == 7))
                .collect();
            let got = rerun(&group(*kind, &spec, Some(1)), &ended);
            match (got, expected) {
                (Err(_), Err(())) => {}
                (Ok(None), Ok(None)) => {}
                (Ok(Some(rerun)), Ok(Some(indices))) => {
                    let array = rerun.spec.array.clone().expect("an array");
                    assert_eq!(array.indices(), &indices[..]);
                    assert_eq!(rerun.options.source, ended[0].source);
                    assert_eq!(rerun.options.wait_for_capacity, ended[0].id.0 == 7);
                    assert_eq!(rerun.snapshot, ended[0].snapshot);
                }
                (got, expected) => panic!("{kind:?} {failed:?}: {got:?}, not {expected:?}"),
            }
        }
    }

    #[test]
    fn an_array_is_its_elements_without_array_or_notify_and_a_rerun_is_marked() {
        let spec = array_spec("0-2");
        let snapshot = "ab".repeat(32).parse().unwrap();
        let submitted = ArraySubmitted {
            user: "ann",
            snapshot: &snapshot,
            source: &None,
            at: Timestamp(5),
            submission: &serde_json::json!({}),
            rerun_of: Some(GroupId(9)),
        };
        let array = new_array(spec.clone(), &submitted).unwrap();
        let indices: Vec<u32> = array.elements.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, [0, 1, 2]);
        assert!(array.element.array.is_none() && array.element.notify.is_none());
        assert_eq!(array.group.spec["rerun_of"], serde_json::json!(9));
        assert!(
            array
                .elements
                .iter()
                .all(|(_, t)| t.submitted_at == Timestamp(5))
        );
        let single = TaskSpec {
            array: None,
            ..spec
        };
        assert!(new_array(single, &submitted).is_err());
    }
}
