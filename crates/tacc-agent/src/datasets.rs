//! Datasets on a node: each source fetched once into `DATA/datasets/<key>/data` (a copy
//! of a directory or file on shared storage, or the body of an http(s) URL), then exposed
//! to every task that names it as a symbolic link at its `mount` in the working directory.
//!
//! The copy is made read-only (mode 0444/0555, owned by the agent) and is keyed by the
//! source text: a source that changes later is not fetched again (register a new name,
//! or a new path). Linking rather than copying into each working directory keeps task
//! start fast; tasks, which never run as the agent, cannot write through the link.
//!
//! A path is read with the task's own rights: the copy runs as the task's identity (a
//! user cannot name a file only root may read, like the server's database, and get it
//! copied), and, since anything running as that identity could change the copy while
//! it is made, a copy of a path is shared only by tasks of that identity (the uid is
//! part of its key). A URL is downloaded by the agent and shared by everyone.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tacc_compiler::{DatasetMount, DatasetSource, dataset_cache_key};
use tokio::io::AsyncWriteExt;

use crate::identity::StepIdentity;
use crate::layout::{SealError, SealModes};
use crate::tree_removal::remove_tree;

/// A fetched dataset: the agent's, read-only to everyone.
const READ_ONLY: SealModes = SealModes {
    top: 0o755,
    dir: 0o555,
    file: 0o444,
    executable: 0o555,
};

/// The node's dataset copies.
#[derive(Debug)]
pub(crate) struct DatasetCache {
    root: PathBuf,
    http: reqwest::Client,
    /// One lock per key: concurrent tasks wanting one dataset fetch it once.
    fetches: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl DatasetCache {
    pub fn open(root: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&root)?;
        // Interrupted fetches leave only `.fetch-*` directories, never a half `<key>`.
        for entry in std::fs::read_dir(&root)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".fetch-") {
                let _ = remove_tree(&entry.path());
            }
        }
        Ok(DatasetCache {
            root,
            http: reqwest::Client::new(),
            fetches: Mutex::new(BTreeMap::new()),
        })
    }

    /// Fetch (once) every dataset and link it into `workdir`. `Err` is a user message.
    pub async fn mount_all(
        &self,
        datasets: &[DatasetMount],
        workdir: &Path,
        who: &StepIdentity,
        log: &(dyn Fn(String) + Sync),
    ) -> Result<(), String> {
        for dataset in datasets {
            let cached = self.fetch(dataset, who, log).await?;
            let link = workdir.join(&dataset.mount);
            if link.symlink_metadata().is_ok() {
                return Err(format!(
                    "dataset `{}` mounts at `{}`, but the code snapshot already has something \
                     there; change the dataset's `mount`, or exclude that path from the code",
                    dataset.name, dataset.mount
                ));
            }
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    format!(
                        "cannot create `{}` for dataset `{}`: {e}",
                        parent.display(),
                        dataset.name
                    )
                })?;
            }
            std::os::unix::fs::symlink(&cached, &link).map_err(|e| {
                format!(
                    "cannot link dataset `{}` at `{}`: {e}",
                    dataset.name, dataset.mount
                )
            })?;
        }
        Ok(())
    }

    /// The cached copy of `dataset`'s source, fetched if this node has none.
    async fn fetch(
        &self,
        dataset: &DatasetMount,
        who: &StepIdentity,
        log: &(dyn Fn(String) + Sync),
    ) -> Result<PathBuf, String> {
        let kind = DatasetSource::of(&dataset.source);
        let mut key = dataset_cache_key(&dataset.source);
        if let (DatasetSource::Path, Some(run_as)) = (&kind, who.run_as) {
            key.push_str(&format!("-u{}", run_as.uid));
        }
        let lock = self
            .fetches
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        let _fetching = lock.lock().await;
        let cached = self.root.join(&key).join("data");
        if cached.symlink_metadata().is_ok() {
            log(format!(
                "tacc: dataset `{}` ({}) is cached on this node",
                dataset.name, dataset.source
            ));
            return Ok(cached);
        }
        log(format!(
            "tacc: fetching dataset `{}` from {}",
            dataset.name, dataset.source
        ));
        let staging = self.root.join(format!(".fetch-{key}"));
        let _ = remove_tree(&staging);
        // Written only by the identity that fetches (the task's, for a path).
        let fetcher = match kind {
            DatasetSource::Path => who.run_as,
            _ => None,
        };
        crate::layout::private_dir(&staging, fetcher)
            .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
        let target = staging.join("data");
        let fetched = match kind {
            DatasetSource::Path if who.run_as.is_some() => {
                copy_as(who, Path::new(&dataset.source), &target).await
            }
            DatasetSource::Path => {
                let source = PathBuf::from(&dataset.source);
                let target = target.clone();
                tokio::task::spawn_blocking(move || copy_read_only(&source, &target))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r)
                    .map(|_| ())
            }
            DatasetSource::Url => self.download(&dataset.source, &target).await,
            DatasetSource::Registered => Err(format!(
                "source `{}` was not resolved by the server (it is neither an absolute path nor \
                 an http(s) URL); submit the task again",
                dataset.source
            )),
        };
        let builder = fetcher.map_or_else(|| nix::unistd::geteuid().as_raw(), |r| r.uid);
        let finished = fetched
            .and_then(|()| {
                // The agent's from here on: nothing can change the copy any more.
                crate::layout::seal(&staging, builder, READ_ONLY)
                    .map_err(|e| seal_message(e, &target, &dataset.source))
            })
            .and_then(|bytes| {
                std::fs::write(staging.join("source"), &dataset.source)
                    .and_then(|()| std::fs::rename(&staging, self.root.join(&key)))
                    .map(|()| bytes)
                    .map_err(|e| e.to_string())
            });
        match finished {
            Ok(bytes) => {
                log(format!(
                    "tacc: dataset `{}` fetched ({bytes} bytes)",
                    dataset.name
                ));
                Ok(cached)
            }
            Err(why) => {
                let _ = remove_tree(&staging);
                Err(format!(
                    "cannot fetch dataset `{}` from `{}`: {why}",
                    dataset.name, dataset.source
                ))
            }
        }
    }

    async fn download(&self, url: &str, target: &Path) -> Result<(), String> {
        let mut response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| format!("the request failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "the server answered {}; check the URL",
                response.status()
            ));
        }
        let expected = response.content_length();
        let mut file = tokio::fs::File::create(target)
            .await
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        let mut received = 0u64;
        while let Some(bytes) = response
            .chunk()
            .await
            .map_err(|e| format!("the download broke off after {received} bytes: {e}"))?
        {
            received += bytes.len() as u64;
            file.write_all(&bytes)
                .await
                .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        }
        if let Some(expected) = expected.filter(|e| *e != received) {
            return Err(format!(
                "the download stopped at {received} of {expected} bytes; try again"
            ));
        }
        file.sync_all().await.map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Copies `source` to `target` as `who` (with `cp`, symbolic links copied as links), so
/// only what that identity may read is copied.
async fn copy_as(who: &StepIdentity, source: &Path, target: &Path) -> Result<(), String> {
    let output = who
        .command("cp")
        .arg("-R")
        .arg("-P")
        .arg("--")
        .arg(source)
        .arg(target)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run cp: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&output.stderr);
    let why = why.trim();
    Err(format!(
        "`{}` cannot be read by the task's account on this node: {}",
        source.display(),
        if why.is_empty() { "cp failed" } else { why }
    ))
}

/// The user's message for a copy that could not be sealed.
fn seal_message(error: SealError, target: &Path, source: &str) -> String {
    match error {
        SealError::Special(path) => {
            let shown = match path.strip_prefix(target) {
                Ok(rest) if rest.as_os_str().is_empty() => source.to_string(),
                Ok(rest) => format!("{source}/{}", rest.display()),
                Err(_) => path.display().to_string(),
            };
            format!(
                "`{shown}` is not a file or directory (a device, socket or FIFO cannot be a \
                 dataset)"
            )
        }
        other => other.to_string(),
    }
}

/// Copies a file or directory tree, leaving every copy read-only; returns bytes copied.
/// Symbolic links are copied as links; sockets, devices and FIFOs are refused.
fn copy_read_only(source: &Path, target: &Path) -> Result<u64, String> {
    let meta = std::fs::symlink_metadata(source)
        .map_err(|e| format!("`{}` cannot be read on this node: {e}", source.display()))?;
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        let link = std::fs::read_link(source).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(link, target).map_err(|e| e.to_string())?;
        return Ok(0);
    }
    if file_type.is_file() {
        let bytes = std::fs::copy(source, target)
            .map_err(|e| format!("cannot copy `{}`: {e}", source.display()))?;
        std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o444))
            .map_err(|e| e.to_string())?;
        return Ok(bytes);
    }
    if !file_type.is_dir() {
        return Err(format!(
            "`{}` is not a file or directory (a device, socket or FIFO cannot be a dataset)",
            source.display()
        ));
    }
    std::fs::create_dir(target).map_err(|e| e.to_string())?;
    let mut total = 0;
    let mut entries: Vec<_> = std::fs::read_dir(source)
        .map_err(|e| format!("cannot list `{}`: {e}", source.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        total += copy_read_only(&entry.path(), &target.join(entry.file_name()))?;
    }
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o555))
        .map_err(|e| e.to_string())?;
    Ok(total)
}
