//! Keeping an attempt's declared outputs: once its processes are stopped — however it
//! ended: succeeded, failed, cancelled, preempted, out of time — every rank uploads the
//! files under the task's `outputs:` paths and its checkpoint directory, before the agent
//! reports the attempt `finished`. The upload is bounded in time, so a huge output
//! cannot keep a cancel from completing; what did not make it is named in the task's log.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tacc_compiler::Instruction;
use tacc_core::ByteSize;
use tacc_proto::{AgentReport, AttemptRef};
use tokio::time::Instant;

use crate::Shared;

/// How long a stopped attempt's (cancelled, preempted, out of time) outputs may take to
/// upload: whoever stopped it is waiting.
pub(crate) const STOPPED_DEADLINE: Duration = Duration::from_secs(60);
/// How long the outputs of an attempt that ended on its own may take to upload.
pub(crate) const ENDED_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// Files not kept that the log names one by one; the rest are counted.
const NAMED_MAX: usize = 20;

/// Upload the attempt's outputs and write into its log what could not be kept.
/// `stopped`: the attempt was cancelled or ran out of time, and whoever stopped it waits.
pub(crate) async fn keep(
    shared: &Arc<Shared>,
    instruction: &Instruction,
    workdir: &Path,
    rank: u32,
    stopped: bool,
) {
    let limit = if stopped {
        STOPPED_DEADLINE
    } else {
        ENDED_DEADLINE
    };
    let attempt = AttemptRef {
        task: instruction.task,
        attempt: instruction.attempt,
    };
    let kept = upload(shared, instruction, workdir, Instant::now() + limit).await;
    if let Some(text) = kept.log_text(rank, limit, stopped) {
        super::report(
            shared,
            AgentReport::Log {
                attempt,
                text,
                offset: None,
            },
        );
    }
}

/// What an upload achieved.
#[derive(Debug, Default)]
struct Kept {
    files: usize,
    bytes: u64,
    /// Not uploaded because the deadline passed: path and size.
    late: Vec<(String, u64)>,
    /// Could not be read or sent: path and why.
    failed: Vec<(String, String)>,
}

impl Kept {
    /// The lines for the task's log, when anything was not kept.
    fn log_text(&self, rank: u32, limit: Duration, stopped: bool) -> Option<String> {
        let mut text = String::new();
        if !self.late.is_empty() {
            let late_bytes: u64 = self.late.iter().map(|(_, size)| size).sum();
            let named: Vec<&str> = self
                .late
                .iter()
                .take(NAMED_MAX)
                .map(|(path, _)| path.as_str())
                .collect();
            let more = self.late.len().saturating_sub(NAMED_MAX);
            text.push_str(&format!(
                "tacc: rank {rank} kept {} output file(s) ({}) within the {} s allowed for \
                 uploading the outputs of {} attempt; not kept: {} file(s), {}: {}{}. Save \
                 smaller or fewer outputs (checkpoints more often, old ones removed).\n",
                self.files,
                ByteSize::from_bytes(self.bytes),
                limit.as_secs(),
                if stopped { "a stopped" } else { "an" },
                self.late.len(),
                ByteSize::from_bytes(late_bytes),
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                },
            ));
        }
        for (path, why) in self.failed.iter().take(NAMED_MAX) {
            text.push_str(&format!(
                "tacc: rank {rank} could not keep output {path}: {why}\n"
            ));
        }
        if self.failed.len() > NAMED_MAX {
            text.push_str(&format!(
                "tacc: rank {rank} could not keep {} more output file(s)\n",
                self.failed.len() - NAMED_MAX
            ));
        }
        (!text.is_empty()).then_some(text)
    }
}

/// Upload every file under the instruction's output paths (relative to the working
/// directory), one after the other, until `deadline`.
async fn upload(
    shared: &Arc<Shared>,
    instruction: &Instruction,
    workdir: &Path,
    deadline: Instant,
) -> Kept {
    let mut kept = Kept::default();
    let Some(node) = shared.node() else {
        return kept;
    };
    // Most attempts keep nothing: said by a look or two here rather than by a job on a
    // blocking thread (a thread hand-off each way).
    if nothing_to_keep(&instruction.outputs, workdir) {
        return kept;
    }
    let found = {
        let workdir = workdir.to_path_buf();
        let outputs = instruction.outputs.clone();
        tokio::task::spawn_blocking(move || {
            let mut files = Vec::new();
            // The checkpoint directory is kept like outputs, for the next attempt.
            let checkpoint = tacc_compiler::CHECKPOINT_DIR.to_string();
            for output in outputs.iter().chain(std::iter::once(&checkpoint)) {
                collect_files(&workdir, &workdir.join(output), &mut files);
            }
            // An `outputs:` path may hold the checkpoint directory too: each file once.
            files.sort();
            files.dedup();
            files
        })
        .await
        .unwrap_or_default()
    };
    let real_workdir = match std::fs::canonicalize(workdir) {
        Ok(real) => real,
        Err(e) => {
            kept.failed
                .push((workdir.display().to_string(), e.to_string()));
            return kept;
        }
    };
    for (relative, path, size) in found {
        if Instant::now() >= deadline {
            kept.late.push((relative, size));
            continue;
        }
        // The server's disk is full (507): the file waits here until it has room again,
        // within the deadline.
        let mut backoff = crate::Backoff::default();
        let never = tokio_util::sync::CancellationToken::new();
        loop {
            let opened = open_inside(&path, &real_workdir).and_then(|file| {
                if file.metadata()?.is_file() {
                    Ok(file)
                } else {
                    Err(std::io::Error::other("not a regular file"))
                }
            });
            let file = match opened {
                Ok(file) => tokio::fs::File::from_std(file),
                Err(e) => {
                    kept.failed.push((relative, e.to_string()));
                    break;
                }
            };
            let put = shared.client.put_output(
                node,
                instruction.task,
                instruction.attempt,
                &relative,
                file,
            );
            match tokio::time::timeout_at(deadline, put).await {
                Ok(Ok(())) => {
                    kept.files += 1;
                    kept.bytes += size;
                }
                Ok(Err(tacc_client::ClientError::Api { status: 507, .. }))
                    if Instant::now() < deadline =>
                {
                    let wait = tokio::time::timeout_at(deadline, backoff.wait(&never));
                    if wait.await.is_ok() {
                        continue;
                    }
                    kept.late.push((relative, size));
                }
                Ok(Err(e)) => kept.failed.push((relative, e.to_string())),
                Err(_) => kept.late.push((relative, size)),
            }
            break;
        }
    }
    kept
}

/// Whether an attempt has nothing to keep: no `outputs:` paths, and a checkpoint
/// directory that is empty or is not there (what `collect_files` would find nothing in:
/// a link there is never followed). Only a directory whose first entry is listed or a
/// plain file there may hold something.
fn nothing_to_keep(outputs: &[String], workdir: &Path) -> bool {
    if !outputs.is_empty() {
        return false;
    }
    let checkpoint = workdir.join(tacc_compiler::CHECKPOINT_DIR);
    match std::fs::symlink_metadata(&checkpoint) {
        Err(_) => true,
        Ok(meta) if meta.is_dir() => match std::fs::read_dir(&checkpoint) {
            Ok(mut entries) => entries.next().is_none(),
            Err(_) => true,
        },
        Ok(meta) => !meta.is_file(),
    }
}

/// Opens a file of the working directory for reading. The working directory belongs to
/// the task, and a process it left behind could swap a listed file for a link to
/// something only the agent may read: the file is opened without following a final
/// link, and must really lie inside the working directory (which also catches a
/// directory on the way swapped for a link). Directories are opened too (for listings).
pub(crate) fn open_inside(path: &Path, real_workdir: &Path) -> std::io::Result<std::fs::File> {
    let file = crate::layout::open_no_follow(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() && !meta.is_dir() {
        return Err(std::io::Error::other("not a regular file or directory"));
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    if !real.starts_with(real_workdir) {
        return Err(std::io::Error::other(
            "it does not lie inside the working directory",
        ));
    }
    Ok(file)
}

/// Regular files under `path` (a file or a directory), as paths relative to `root`, with
/// their sizes. Symbolic links are not followed, so outputs cannot reach outside the
/// working directory.
pub(super) fn collect_files(root: &Path, path: &Path, out: &mut Vec<(String, PathBuf, u64)>) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_file() {
        if let Ok(relative) = path.strip_prefix(root) {
            out.push((
                relative.to_string_lossy().into_owned(),
                path.to_path_buf(),
                meta.len(),
            ));
        }
    } else if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for entry in entries {
            collect_files(root, &entry, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_not_kept_is_named_then_counted() {
        let kept = Kept {
            files: 2,
            bytes: 2048,
            late: (0..25)
                .map(|i| (format!("ckpt/{i}.bin"), 1 << 20))
                .collect(),
            failed: vec![("out/x".into(), "permission denied".into())],
        };
        let text = kept.log_text(1, STOPPED_DEADLINE, true).unwrap();
        assert!(
            text.contains("rank 1 kept 2 output file(s) (2KiB) within the 60 s"),
            "{text}"
        );
        assert!(
            text.contains("not kept: 25 file(s), 25MiB: ckpt/0.bin"),
            "{text}"
        );
        assert!(text.contains("and 5 more"), "{text}");
        assert!(!text.contains("ckpt/24.bin"), "{text}");
        assert!(
            text.contains("could not keep output out/x: permission denied"),
            "{text}"
        );
        assert_eq!(Kept::default().log_text(0, ENDED_DEADLINE, false), None);
    }

    #[test]
    fn nothing_is_kept_only_where_collecting_would_find_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        let checkpoint = work.join(tacc_compiler::CHECKPOINT_DIR);
        let found = || {
            let mut files = Vec::new();
            collect_files(work, &checkpoint, &mut files);
            files.len()
        };
        // Absent.
        assert!(nothing_to_keep(&[], work));
        assert_eq!(found(), 0);
        // Empty.
        std::fs::create_dir(&checkpoint).unwrap();
        assert!(nothing_to_keep(&[], work));
        assert!(
            !nothing_to_keep(&["out".to_string()], work),
            "outputs declared"
        );
        // Holding a file, however deep.
        std::fs::create_dir(checkpoint.join("deep")).unwrap();
        std::fs::write(checkpoint.join("deep/model.pt"), "w").unwrap();
        assert!(!nothing_to_keep(&[], work));
        assert_eq!(found(), 1);
        // Replaced by a file: kept as one.
        std::fs::remove_dir_all(&checkpoint).unwrap();
        std::fs::write(&checkpoint, "x").unwrap();
        assert!(!nothing_to_keep(&[], work));
        assert_eq!(found(), 1);
        // Replaced by a link (never followed): nothing.
        std::fs::remove_file(&checkpoint).unwrap();
        std::os::unix::fs::symlink(dir.path(), &checkpoint).unwrap();
        assert!(nothing_to_keep(&[], work));
        assert_eq!(found(), 0);
    }

    #[test]
    fn only_files_inside_the_working_directory_open() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("out")).unwrap();
        std::fs::write(work.join("out/a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), work.join("out/link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), work.join("up")).unwrap();
        let real = std::fs::canonicalize(&work).unwrap();
        assert!(open_inside(&work.join("out/a.txt"), &real).is_ok());
        assert!(open_inside(&work.join("out"), &real).is_ok());
        assert!(
            open_inside(&work.join("out/link"), &real).is_err(),
            "final link"
        );
        assert!(
            open_inside(&work.join("up/secret"), &real).is_err(),
            "a directory link leading out"
        );
        let mut files = Vec::new();
        collect_files(&work, &work.join("out"), &mut files);
        let names: Vec<&str> = files.iter().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(names, vec!["out/a.txt"], "links are not collected");
    }
}
