//! One node's share of one attempt, as a pipeline of stages: read the instruction and
//! decide who the task runs as; [`prepare`] the working directory from the pinned
//! snapshot (private to that identity) and what surrounds it; [`launch`] `setup`, then
//! `run`, through the executor, streaming output with the task's secrets masked
//! ([`execution`], [`ranks`]); keep its [`outputs`] (every rank, however it ended); and
//! report how it ended. A stage that fails says why with an [`AttemptError`], whose
//! reason code is what the server records.

mod checkpoint;
mod disk_limit;
mod error;
mod execution;
mod inputs;
mod launch;
pub(crate) mod outputs;
mod prepare;
mod ranks;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tacc_compiler::{INSTRUCTION_FORMAT, Instruction};
use tacc_exec::ExitOutcome;
use tacc_proto::{AgentReport, Assignment};
use tokio_util::sync::CancellationToken;

pub(crate) use error::AttemptError;
pub(crate) use execution::{LogLines, launch, outcome_of};
pub(crate) use prepare::SnapshotCache;
pub(crate) use ranks::share_of;

use crate::Shared;
use crate::now;

pub(crate) fn report(shared: &Shared, report: AgentReport) {
    shared.reports.send(report);
}

/// The name of an assignment's working directory under the agent's `work/`.
fn workdir_name(assignment: &Assignment) -> String {
    let attempt = assignment.attempt;
    format!(
        "{}-{}-r{}",
        attempt.task, attempt.attempt, assignment.node_rank
    )
}

/// Where an assignment's working directory lies (while its attempt runs here).
pub(crate) fn workdir_of(shared: &Shared, assignment: &Assignment) -> PathBuf {
    shared.config.work_root().join(workdir_name(assignment))
}

/// What an ended attempt leaves to clean up once its end is reported (see [`run`]): its
/// private /tmp — unmounting waits out a kernel grace period, milliseconds that need not
/// sit between one task's end and the next task's start on this node — and its working
/// directory.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    tmp: Option<crate::private_tmp::AttemptTmp>,
    workdir: Option<PathBuf>,
}

/// Run the attempt and report its end; returns what is left to clean up (see
/// [`remove_leftovers`]), which the caller removes once it has recorded the end. Nothing
/// of the attempt runs any more by then: its executions' processes are gone.
pub(crate) async fn run(
    shared: Arc<Shared>,
    assignment: Assignment,
    cancel: CancellationToken,
) -> Leftovers {
    let attempt = assignment.attempt;
    let workdir = workdir_of(&shared, &assignment);
    let mut tmp = None;
    // Once a process runs, cancelling is the executor's job (SIGTERM, grace, SIGKILL of
    // the group): dropping the future here would orphan the process.
    let executed = execute(&shared, &assignment, &workdir, &cancel, &mut tmp).await;
    let (outcome, failed_rank) = match executed {
        Ok(ended) => (outcome_of(ended.outcome), ended.failed_rank),
        Err(error) => (error.into_outcome(), None),
    };
    let outcome = if shared.fenced.lock().unwrap().remove(&attempt) {
        AttemptError::Fenced(shared.config.name.clone()).into_outcome()
    } else {
        outcome
    };
    // Nothing of the attempt may keep its GPUs from the next task.
    for text in crate::gpu_release::release(shared.gpus.as_ref(), attempt, &assignment.gpu_indices)
    {
        report(
            &shared,
            AgentReport::Log {
                attempt,
                text,
                offset: None,
            },
        );
    }
    // No sample of the attempt may follow its end in the report stream.
    shared.sampling.end(attempt);
    shared.resizing.end(attempt);
    // The end is reported before the working directory is removed: nothing runs in it
    // any more (the execution's processes are gone), and its removal — a blocking job
    // whose every `rmdir` may wait for the device (`discard`) — need not delay the next
    // task's start on this node.
    report(
        &shared,
        AgentReport::Finished {
            attempt,
            at: now(),
            outcome,
            rank: failed_rank,
        },
    );
    Leftovers {
        tmp,
        workdir: (!shared.config.keep_workdirs).then_some(workdir),
    }
}

/// Unmount an ended attempt's private /tmp and remove its working directory (`run`'s
/// leftovers), on a blocking thread.
pub(crate) async fn remove_leftovers(left: Leftovers) {
    if left.tmp.is_none() && left.workdir.is_none() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        // Dropping it unmounts it and gives its mount point back.
        drop(left.tmp);
        if let Some(dir) = left.workdir {
            remove_tree(&dir);
        }
    })
    .await;
}

/// Remove a working directory even where the code files in it are read-only.
fn remove_tree(dir: &Path) {
    if let Err(e) = crate::tree_removal::remove_tree(dir) {
        tracing::warn!("cannot remove {}: {e}", dir.display());
    }
}

/// Every stage in order; the outputs are kept whatever became of the attempt once its
/// working directory exists.
async fn execute(
    shared: &Arc<Shared>,
    assignment: &Assignment,
    workdir: &Path,
    cancel: &CancellationToken,
    tmp: &mut Option<crate::private_tmp::AttemptTmp>,
) -> Result<ranks::RanksEnded, AttemptError> {
    let instruction: Instruction = serde_json::from_value(assignment.instruction.clone())
        .map_err(AttemptError::UnreadableInstruction)?;
    if instruction.format_version > INSTRUCTION_FORMAT {
        return Err(AttemptError::NewerInstruction {
            found: instruction.format_version,
        });
    }
    crate::secrets::check_names(&assignment.secrets).map_err(AttemptError::Refused)?;
    // Never root: the mapped account, the user's own task uid, or (an agent that is not
    // root) the agent itself.
    let identity = shared
        .identities
        .for_task(
            &instruction.user,
            instruction.unix_user.as_deref(),
            assignment.task_uid,
        )
        .map_err(AttemptError::Refused)?;
    // Masked in every task's log on this node (this one's included) until the attempt's
    // last line is written: until this function returns.
    let _held = shared.secrets.hold(assignment.secrets.values().cloned());
    let started = Instant::now();
    let hand_over = identity.run_as.filter(|_| {
        prepare::hands_over_at_build(
            checkpoint::restores(assignment),
            !instruction.datasets.is_empty(),
        )
    });
    let handed_over =
        prepare::workdir(shared, &instruction.snapshot, workdir, hand_over, cancel).await?;
    // `resources.disk`: past it, the watch stops what runs (as a cancel would) and the
    // attempt ends as `disk_limit`.
    let (run_cancel, disk_watch) = match instruction.disk_limit_bytes {
        Some(limit) => {
            let stop = cancel.child_token();
            let watch = disk_limit::DiskWatch::start(workdir.to_path_buf(), limit, stop.clone());
            (stop, Some(watch))
        }
        None => (cancel.clone(), None),
    };
    let cancel = &run_cancel;
    // From here on the working directory exists: whatever becomes of the attempt, its
    // outputs are kept once nothing runs any more.
    let ended = async {
        // Before the hand-over, which makes the checkpoint directory the task's.
        let resume_from = checkpoint::restore(shared, assignment, workdir, cancel).await?;
        let surroundings = prepare::surroundings(
            shared,
            &instruction,
            &identity,
            workdir,
            handed_over,
            cancel,
        )
        .await?;
        // After the hand-over: the inputs stay the agent's, read-only to the task.
        inputs::fetch(shared, assignment, workdir, cancel).await?;
        let name = workdir_name(assignment);
        // Lives until every execution of the attempt has ended: `run` hands it back,
        // to be unmounted once the end is reported.
        *tmp = shared
            .private_tmps
            .for_attempt(&name, instruction.per_node.memory_bytes)
            .map_err(AttemptError::Refused)?;
        let private_tmp = tmp.as_ref();
        let stage = launch::Launch {
            assignment,
            instruction: &instruction,
            identity: &identity,
            surroundings,
            resume_from,
            private_tmp: private_tmp.map(|t| t.placement()),
            started,
            workdir,
            name: &name,
        };
        launch::setup_then_run(shared, stage, cancel).await
    }
    .await;
    let over_disk = disk_watch.and_then(|watch| watch.exceeded());
    let stopped = over_disk.is_some()
        || match &ended {
            Ok(ended) => matches!(
                ended.outcome,
                ExitOutcome::Cancelled | ExitOutcome::TimeLimit
            ),
            Err(error) => matches!(error, AttemptError::Cancelled),
        };
    if let Some(over) = over_disk {
        let error = AttemptError::DiskLimit {
            used: tacc_core::ByteSize::from_bytes(over.used),
            limit: tacc_core::ByteSize::from_bytes(over.limit),
        };
        report(
            shared,
            AgentReport::Log {
                attempt: assignment.attempt,
                text: format!("tacc: {error}\n"),
                offset: None,
            },
        );
        outputs::keep(shared, &instruction, workdir, assignment.node_rank, stopped).await;
        return Err(error);
    }
    outputs::keep(shared, &instruction, workdir, assignment.node_rank, stopped).await;
    ended
}
