//! The task's checkpoint directory (`$TACC_CHECKPOINT_DIR`, [`CHECKPOINT_DIR`] in the
//! working directory). Created for every attempt before the tree is handed to the task's
//! identity, so it is the task's to write; on a retry it is first filled with the files
//! the previous attempt left there (whatever node ran it: the server kept them like
//! outputs, see `outputs::keep`), and the attempt is told so by `$TACC_RESUME_FROM`.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tacc_compiler::CHECKPOINT_DIR;
use tacc_proto::{Assignment, RESUME_STAGE};
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use crate::Shared;

/// Create the checkpoint directory and restore the previous attempt's files into it.
/// Returns the directory when it holds a checkpoint to resume from.
pub(super) async fn restore(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
    cancel: &CancellationToken,
) -> Result<Option<PathBuf>, AttemptError> {
    let dir = workdir.join(CHECKPOINT_DIR);
    tokio::fs::create_dir_all(&dir).await.map_err(|e| {
        AttemptError::InputFetch(format!(
            "cannot create the checkpoint directory {}: {e}",
            dir.display()
        ))
    })?;
    let restored = tokio::select! {
        restored = fetch_all(shared, assignment, &dir) => restored.map_err(AttemptError::InputFetch)?,
        _ = cancel.cancelled() => return Err(AttemptError::Cancelled),
    };
    Ok((restored > 0).then_some(dir))
}

/// Fetch every checkpoint file of the assignment's inputs; how many there were.
async fn fetch_all(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    dir: &Path,
) -> Result<usize, String> {
    let mut restored = 0;
    let attempt = assignment.attempt;
    for (index, input) in assignment.inputs.iter().enumerate() {
        if input.stage != RESUME_STAGE {
            continue;
        }
        let relative = Path::new(&input.name);
        if !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(format!(
                "checkpoint file `{}` would leave the checkpoint directory",
                input.name
            ));
        }
        let Some(node) = shared.node() else {
            return Err("the agent is not registered; the checkpoint cannot be fetched".into());
        };
        let target = dir.join(relative);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let bytes = shared
            .client
            .get_input(node, attempt.task, attempt.attempt, index)
            .await
            .map_err(|e| {
                format!(
                    "cannot fetch checkpoint file `{}` of attempt {}: {e}",
                    input.name, input.attempt
                )
            })?;
        tokio::fs::write(&target, &bytes)
            .await
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        restored += 1;
    }
    Ok(restored)
}
