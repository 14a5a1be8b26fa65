//! The prepare stage of an attempt: build a fresh working directory from the pinned
//! snapshot (fetching only the chunks this node lacks), then what the task runs with
//! around it — the user's directory on this node, the datasets linked into the working
//! directory, the tree handed to the task's identity, and the managed environment. Any
//! of these can be cancelled, since nothing of the task runs yet.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tacc_compiler::{CHECKPOINT_DIR, ChunkSource, DirChunkStore, Instruction, Manifest};
use tacc_core::SnapshotId;
use tacc_proto::{AgentReport, AttemptRef};
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use super::{remove_tree, report};
use crate::Shared;
use crate::environments::EnvLease;
use crate::identity::TaskIdentity;
use tacc_exec::RunAs;

/// The node's caches of code: manifests by snapshot id, chunks by hash, whole files.
#[derive(Debug)]
pub(crate) struct SnapshotCache {
    manifests: Mutex<BTreeMap<SnapshotId, Arc<Manifest>>>,
    chunks: DirChunkStore,
    files: PathBuf,
}

impl SnapshotCache {
    pub fn open(data_dir: &Path) -> Result<Self, tacc_compiler::CompilerError> {
        Ok(SnapshotCache {
            manifests: Mutex::new(BTreeMap::new()),
            chunks: DirChunkStore::open(data_dir.join("chunks"))?,
            files: data_dir.join("files"),
        })
    }
}

/// What the task runs with besides its working directory.
pub(super) struct Surroundings {
    /// The user's directory on this node (their HOME when the account has none).
    pub userdir: PathBuf,
    /// Held until the attempt ends: an environment in use is never evicted.
    pub environment: Option<EnvLease>,
}

/// Build the working directory from the snapshot, with its empty checkpoint directory,
/// unless cancelled first; handed to `hand_over` in the same step where given (see
/// [`hands_over_at_build`]). Says whether it was handed over.
pub(super) async fn workdir(
    shared: &Arc<Shared>,
    snapshot: &SnapshotId,
    workdir: &Path,
    hand_over: Option<RunAs>,
    cancel: &CancellationToken,
) -> Result<HandedOver, AttemptError> {
    tokio::select! {
        built = materialise(shared, snapshot, workdir, hand_over) => built,
        _ = cancel.cancelled() => Err(AttemptError::Cancelled),
    }
}

/// Whether the working directory was handed to the task's identity when it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HandedOver(pub bool);

/// Whether the working directory can be handed to the task's identity in the same
/// blocking step that builds it (one hand-off to a blocking thread per attempt instead
/// of three: build, checkpoint directory, hand-over): only where nothing is put into the
/// tree between the build and the hand-over — no checkpoint files restored from an
/// earlier attempt (they are fetched before the hand-over, so they become the task's)
/// and no datasets linked in. Everything put in later (pipeline inputs, environments)
/// stays the agent's either way.
pub(super) fn hands_over_at_build(restores_checkpoint: bool, links_datasets: bool) -> bool {
    !restores_checkpoint && !links_datasets
}

/// Everything after the working directory was built: user directory, datasets, the tree
/// handed over, environment.
pub(super) async fn surroundings(
    shared: &Arc<Shared>,
    instruction: &Instruction,
    identity: &TaskIdentity,
    workdir: &Path,
    handed_over: HandedOver,
    cancel: &CancellationToken,
) -> Result<Surroundings, AttemptError> {
    let attempt = AttemptRef {
        task: instruction.task,
        attempt: instruction.attempt,
    };
    // Preparation lines (dataset fetches, environment builds) go to the task's log, so a
    // failed build can be read with `tcloud logs`.
    let log_line = |line: String| {
        report(
            shared,
            AgentReport::Log {
                attempt,
                text: format!("{}\n", shared.secrets.mask().apply(&line)),
                offset: None,
            },
        )
    };
    // Private to the task's identity, like the working directory.
    let userdir = shared
        .config
        .data_dir
        .join("users")
        .join(user_dir_name(&instruction.user));
    crate::layout::private_dir(&userdir, identity.run_as)
        .map_err(|e| AttemptError::Refused(format!("cannot create {}: {e}", userdir.display())))?;
    let step = identity.step(&userdir);
    if !instruction.datasets.is_empty() {
        tokio::select! {
            mounted = shared.datasets.mount_all(&instruction.datasets, workdir, &step, &log_line) => {
                mounted.map_err(AttemptError::DatasetFetch)?
            }
            _ = cancel.cancelled() => return Err(AttemptError::Cancelled),
        };
    }
    // Built by the agent so far, and unreachable by any task; now the task's own (unless
    // that was done when it was built).
    if let (Some(run_as), HandedOver(false)) = (identity.run_as, handed_over) {
        let dir = workdir.to_path_buf();
        tokio::task::spawn_blocking(move || crate::layout::give_tree(&dir, run_as))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|source| AttemptError::HandOver {
                workdir: workdir.display().to_string(),
                uid: run_as.uid,
                source,
            })?;
    }
    let environment = match &instruction.environment {
        None => None,
        Some(wanted) => tokio::select! {
            acquired = shared.envs.acquire(wanted, workdir, &step, &log_line) => {
                Some(acquired.map_err(AttemptError::EnvironmentBuild)?)
            }
            _ = cancel.cancelled() => return Err(AttemptError::Cancelled),
        },
    };
    Ok(Surroundings {
        userdir,
        environment,
    })
}

/// The name of a user's directory under `users/`: the user name where it is a plain file
/// name, else a cleaned form with a hash of the real name (two users never share one).
fn user_dir_name(user: &str) -> String {
    let clean: String = user
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == user && !clean.is_empty() && !clean.starts_with('.') {
        return clean;
    }
    let hash = blake3::hash(user.as_bytes()).to_hex();
    let visible = clean
        .strip_prefix('.')
        .map_or(clean.clone(), |rest| format!("_{rest}"));
    format!("{visible}-{}", &hash[..12])
}

/// Build the working directory from the snapshot, fetching only chunks this node lacks:
/// the fetches here, the files (and the checkpoint directory, and the hand-over where
/// asked) in one job on a blocking thread.
async fn materialise(
    shared: &Arc<Shared>,
    snapshot: &SnapshotId,
    workdir: &Path,
    hand_over: Option<RunAs>,
) -> Result<HandedOver, AttemptError> {
    let manifest = fetch_snapshot(shared, snapshot)
        .await
        .map_err(AttemptError::SnapshotFetch)?;
    let shared = shared.clone();
    let workdir = workdir.to_path_buf();
    tokio::task::spawn_blocking(move || build(&shared, &manifest, &workdir, hand_over))
        .await
        .map_err(|e| AttemptError::SnapshotFetch(e.to_string()))?
}

/// The snapshot's manifest, with every chunk of it in the node's cache.
async fn fetch_snapshot(
    shared: &Arc<Shared>,
    snapshot: &SnapshotId,
) -> Result<Arc<Manifest>, String> {
    let cached = shared
        .snapshots
        .manifests
        .lock()
        .unwrap()
        .get(snapshot)
        .cloned();
    let manifest = match cached {
        Some(manifest) => manifest,
        None => {
            let value = shared
                .client
                .get_snapshot(snapshot)
                .await
                .map_err(|e| format!("cannot fetch snapshot {snapshot}: {e}"))?;
            let manifest: Manifest = serde_json::from_value(value)
                .map_err(|e| format!("snapshot {snapshot} is malformed: {e}"))?;
            if manifest.id() != *snapshot {
                return Err(format!(
                    "snapshot {snapshot} does not match its id; refusing to run it"
                ));
            }
            let manifest = Arc::new(manifest);
            shared
                .snapshots
                .manifests
                .lock()
                .unwrap()
                .insert(snapshot.clone(), manifest.clone());
            manifest
        }
    };
    for hash in manifest.chunk_set() {
        if shared.snapshots.chunks.has(&hash) {
            continue;
        }
        let bytes = shared
            .client
            .get_chunk(&hash.to_string())
            .await
            .map_err(|e| format!("cannot fetch chunk {hash}: {e}"))?;
        shared
            .snapshots
            .chunks
            .put(&hash, &bytes)
            .map_err(|e| format!("chunk {hash}: {e}"))?;
    }
    Ok(manifest)
}

/// The working directory built (a leftover of the same name removed first), private to
/// the agent from the start; its checkpoint directory made; then handed to `hand_over`
/// where given. Blocking.
fn build(
    shared: &Shared,
    manifest: &Manifest,
    workdir: &Path,
    hand_over: Option<RunAs>,
) -> Result<HandedOver, AttemptError> {
    if workdir.symlink_metadata().is_ok() {
        remove_tree(workdir);
    }
    // Private from the start: nobody but the agent may enter it until it is handed over.
    std::fs::DirBuilder::new()
        .mode(crate::layout::PRIVATE_DIR_MODE)
        .create(workdir)
        .map_err(|e| {
            AttemptError::SnapshotFetch(format!("cannot create {}: {e}", workdir.display()))
        })?;
    let source: &dyn ChunkSource = &shared.snapshots.chunks;
    // Hard links share one inode between working directories; only a task that is
    // not the cache's owner is stopped by the read-only mode from writing through
    // them, so an agent running as root (whose tasks get the tree as their own, to
    // write in) makes copies.
    let result = if nix::unistd::geteuid().is_root() {
        tacc_compiler::materialize(manifest, source, workdir)
    } else {
        tacc_compiler::materialize_cached(manifest, source, &shared.snapshots.files, workdir)
    };
    result.map_err(|e| {
        AttemptError::SnapshotFetch(format!("cannot build the working directory: {e}"))
    })?;
    // Before the hand-over, which makes the checkpoint directory the task's.
    let checkpoint = workdir.join(CHECKPOINT_DIR);
    std::fs::create_dir_all(&checkpoint).map_err(|e| {
        AttemptError::InputFetch(format!(
            "cannot create the checkpoint directory {}: {e}",
            checkpoint.display()
        ))
    })?;
    let Some(run_as) = hand_over else {
        return Ok(HandedOver(false));
    };
    crate::layout::give_tree(workdir, run_as).map_err(|source| AttemptError::HandOver {
        workdir: workdir.display().to_string(),
        uid: run_as.uid,
        source,
    })?;
    Ok(HandedOver(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_handed_over_at_build_only_where_nothing_goes_in_before_the_hand_over() {
        // (restores a checkpoint, links datasets) -> handed over when built
        let table = [
            ((false, false), true),
            ((true, false), false),
            ((false, true), false),
            ((true, true), false),
        ];
        for ((restores, links), expected) in table {
            assert_eq!(
                hands_over_at_build(restores, links),
                expected,
                "restores {restores}, links {links}"
            );
        }
    }

    #[test]
    fn user_directories_never_collide_or_escape() {
        assert_eq!(user_dir_name("alice"), "alice");
        assert_eq!(user_dir_name("a.b-c_d"), "a.b-c_d");
        let slashed = user_dir_name("a/b");
        let underscored = user_dir_name("a_b");
        assert_ne!(slashed, underscored);
        assert!(slashed.starts_with("a_b-"), "{slashed}");
        for odd in ["..", ".", "", "../etc"] {
            let name = user_dir_name(odd);
            assert!(
                !name.starts_with('.') && !name.contains('/'),
                "{odd}: {name}"
            );
            assert!(name.len() > 12, "{odd}: {name}");
        }
    }
}
