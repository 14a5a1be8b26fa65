//! The task's checkpoint directory (`$TACC_CHECKPOINT_DIR`, [`CHECKPOINT_DIR`] in the
//! working directory). Created for every attempt before the tree is handed to the task's
//! identity, so it is the task's to write; on a retry it is first filled with the files
//! the previous attempt left there (whatever node ran it: the server kept them like
//! outputs, see `outputs::keep`), and the attempt is told so by `$TACC_RESUME_FROM`.
//! While the attempt runs, what changed in the directory is copied to the server every
//! [`SYNC_EVERY`], so an attempt whose agent or machine dies still leaves the checkpoint
//! it last wrote (a task writes each checkpoint file whole: to a temporary name, then
//! renamed).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tacc_compiler::CHECKPOINT_DIR;
use tacc_proto::{Assignment, AttemptRef, RESUME_STAGE};
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use crate::Shared;

/// Restore the previous attempt's files into the checkpoint directory (made with the
/// working directory, see `prepare::build`). Returns the directory when it holds a
/// checkpoint to resume from.
pub(super) async fn restore(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
    cancel: &CancellationToken,
) -> Result<Option<PathBuf>, AttemptError> {
    if !restores(assignment) {
        return Ok(None);
    }
    let dir = workdir.join(CHECKPOINT_DIR);
    let restored = tokio::select! {
        restored = fetch_all(shared, assignment, &dir) => restored.map_err(AttemptError::InputFetch)?,
        _ = cancel.cancelled() => return Err(AttemptError::Cancelled),
    };
    Ok((restored > 0).then_some(dir))
}

/// Whether the assignment brings checkpoint files of an earlier attempt to restore.
pub(super) fn restores(assignment: &Assignment) -> bool {
    assignment.inputs.iter().any(|i| i.stage == RESUME_STAGE)
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
        super::inputs::fetch_to(shared, node, attempt, index, &target, || {
            format!(
                "checkpoint file `{}` of attempt {}",
                input.name, input.attempt
            )
        })
        .await?;
        restored += 1;
    }
    Ok(restored)
}

/// How often a running attempt's checkpoint directory is copied to the server.
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(5);

/// Copy the files of the checkpoint directory that changed since the last pass to the
/// server, every [`SYNC_EVERY`], until `stop` (the attempt's end, when `outputs::keep`
/// takes over).
pub(super) async fn sync_while_running(
    shared: Arc<Shared>,
    attempt: AttemptRef,
    workdir: PathBuf,
    stop: CancellationToken,
) {
    let mut sent: BTreeMap<String, (u64, SystemTime)> = BTreeMap::new();
    let mut every = tokio::time::interval(SYNC_EVERY);
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        let Some(node) = shared.node() else {
            continue;
        };
        let scan = {
            let workdir = workdir.clone();
            tokio::task::spawn_blocking(move || checkpoint_files(&workdir))
        };
        let Some((real_workdir, files)) = scan.await.ok().flatten() else {
            continue;
        };
        for (relative, path, size, modified) in files {
            if sent.get(&relative) == Some(&(size, modified)) {
                continue;
            }
            // Opened as outputs are: no link followed out of the working directory.
            let Ok(file) = super::outputs::open_inside(&path, &real_workdir) else {
                continue;
            };
            let put = shared.client.put_output(
                node,
                attempt.task,
                attempt.attempt,
                &relative,
                tokio::fs::File::from_std(file),
            );
            // A failed copy is tried again on the next pass; the end uploads it anyway.
            if put.await.is_ok() {
                sent.insert(relative, (size, modified));
            }
        }
    }
}

/// The real working directory, and the checkpoint directory's files (relative to the
/// working directory) with their size and modification time.
type Scan = (PathBuf, Vec<(String, PathBuf, u64, SystemTime)>);

fn checkpoint_files(workdir: &Path) -> Option<Scan> {
    let real_workdir = std::fs::canonicalize(workdir).ok()?;
    let mut found = Vec::new();
    super::outputs::collect_files(workdir, &workdir.join(CHECKPOINT_DIR), &mut found);
    let files = found
        .into_iter()
        .filter_map(|(relative, path, size)| {
            let modified = std::fs::symlink_metadata(&path).ok()?.modified().ok()?;
            Some((relative, path, size, modified))
        })
        .collect();
    Some((real_workdir, files))
}
