//! What an attempt resumes from: the files the latest earlier attempt of its task left in
//! its checkpoint directory (kept like outputs when it ended, on whatever node), offered
//! to the new attempt among its inputs under [`RESUME_STAGE`], after a pipeline stage's
//! own inputs so their numbering is unchanged (`Facts::attempt_inputs`).

use tacc_compiler::CHECKPOINT_DIR;
use tacc_core::AttemptNo;
use tacc_proto::{InputFile, RESUME_STAGE};
use tacc_store::OutputRecord;

/// The checkpoint files of the latest attempt before `current` that kept any, named
/// relative to the checkpoint directory (another node rank's under `rank-N/`).
pub(crate) fn resume_files(current: AttemptNo, outputs: Vec<OutputRecord>) -> Vec<InputFile> {
    let prefix = format!("{CHECKPOINT_DIR}/");
    let kept: Vec<OutputRecord> = outputs
        .into_iter()
        .filter(|o| o.attempt < current && o.path.starts_with(&prefix))
        .collect();
    let Some(latest) = kept.iter().map(|o| o.attempt).max() else {
        return Vec::new();
    };
    kept.into_iter()
        .filter(|o| o.attempt == latest)
        .map(|o| {
            let inside = &o.path[prefix.len()..];
            let name = if o.rank == 0 {
                inside.to_string()
            } else {
                format!("rank-{}/{inside}", o.rank)
            };
            InputFile {
                stage: RESUME_STAGE.to_string(),
                name,
                size: o.size,
                task: o.task,
                attempt: o.attempt,
                rank: o.rank,
                path: o.path,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::TaskId;

    fn output(attempt: u32, rank: u32, path: &str) -> OutputRecord {
        OutputRecord {
            task: TaskId(7),
            attempt: AttemptNo(attempt),
            rank,
            path: path.to_string(),
            size: 3,
        }
    }

    #[test]
    fn the_latest_earlier_checkpoint_is_resumed_from() {
        let outputs = vec![
            output(1, 0, ".tacc-checkpoint/step"),
            output(2, 0, ".tacc-checkpoint/step"),
            output(2, 1, ".tacc-checkpoint/sub/step"),
            output(2, 0, "model.pt"),
            output(3, 0, ".tacc-checkpoint/step"),
            output(3, 0, ".tacc-checkpointed"),
        ];
        let files = resume_files(AttemptNo(3), outputs.clone());
        let named: Vec<(&str, u32, u32)> = files
            .iter()
            .map(|f| (f.name.as_str(), f.attempt.0, f.rank))
            .collect();
        assert_eq!(named, [("step", 2, 0), ("rank-1/sub/step", 2, 1)]);
        assert!(files.iter().all(|f| f.stage == RESUME_STAGE));
        assert_eq!(files[1].path, ".tacc-checkpoint/sub/step");
        // The first attempt, or one after attempts that kept no checkpoint, has none.
        assert!(resume_files(AttemptNo(1), outputs).is_empty());
        assert!(resume_files(AttemptNo(2), vec![output(1, 0, "model.pt")]).is_empty());
    }
}
