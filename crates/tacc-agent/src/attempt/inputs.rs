//! A pipeline stage's inputs: the kept outputs of the stages it needs, fetched from the
//! server into `inputs/<stage>/` after the working directory was handed to the task's
//! identity, and left owned by the agent with files `0444` and directories `0555`, so
//! the task reads them and cannot change them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tacc_proto::{Assignment, RESUME_STAGE};
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use crate::Shared;

/// Fetch every input of the assignment, unless cancelled first.
pub(super) async fn fetch(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
    cancel: &CancellationToken,
) -> Result<(), AttemptError> {
    if assignment.inputs.iter().all(|i| i.stage == RESUME_STAGE) {
        return Ok(());
    }
    tokio::select! {
        fetched = fetch_all(shared, assignment, workdir) => fetched.map_err(AttemptError::InputFetch),
        _ = cancel.cancelled() => Err(AttemptError::Cancelled),
    }
}

async fn fetch_all(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
) -> Result<(), String> {
    let Some(node) = shared.node() else {
        return Err("the agent is not registered; inputs cannot be fetched".into());
    };
    let root = workdir.join("inputs");
    let attempt = assignment.attempt;
    let mut dirs = vec![root.clone()];
    for (index, input) in assignment.inputs.iter().enumerate() {
        // A checkpoint file, restored by `checkpoint` into the checkpoint directory.
        if input.stage == RESUME_STAGE {
            continue;
        }
        let relative = Path::new(&input.stage).join(&input.name);
        if !stays_inside(&relative) {
            return Err(format!(
                "input `{}` of stage `{}` would leave inputs/",
                input.name, input.stage
            ));
        }
        let target = root.join(&relative);
        let mut parent = target.parent().map(Path::to_path_buf);
        while let Some(dir) = parent {
            if !dir.starts_with(&root) || dirs.contains(&dir) {
                break;
            }
            parent = dir.parent().map(Path::to_path_buf);
            dirs.push(dir);
        }
        fetch_to(shared, node, attempt, index, &target, || {
            format!(
                "input `{}` of stage `{}` (task {})",
                input.name, input.stage, input.task
            )
        })
        .await?;
        set_mode(&target, 0o444)?;
    }
    // Deepest first is not needed for modes; every directory is read-only once filled.
    for dir in dirs {
        set_mode(&dir, 0o555)?;
    }
    Ok(())
}

/// Fetch input file `index` of `attempt` from the server into `target` (its directory
/// created); `what` names the file in an error.
pub(super) async fn fetch_to(
    shared: &Shared,
    node: tacc_core::NodeId,
    attempt: tacc_proto::AttemptRef,
    index: usize,
    target: &Path,
    what: impl Fn() -> String,
) -> Result<(), String> {
    if let Some(dir) = target.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let bytes = shared
        .client
        .get_input(node, attempt.task, attempt.attempt, index)
        .await
        .map_err(|e| format!("cannot fetch {}: {e}", what()))?;
    tokio::fs::write(target, &bytes)
        .await
        .map_err(|e| format!("cannot write {}: {e}", target.display()))
}

fn set_mode(path: &PathBuf, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))
}

fn stays_inside(path: &Path) -> bool {
    path.components().all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_names_are_placed() {
        assert!(stays_inside(Path::new("train/model.txt")));
        assert!(!stays_inside(Path::new("train/../../etc")));
        assert!(!stays_inside(Path::new("/etc/passwd")));
    }
}
