//! Answers to the server's questions about a running attempt's working directory
//! (`tcloud ls`, `tcloud download ID PATH` on a running task), which arrive with the
//! work poll. Paths are confined to the working directory: relative, no `..`, no link
//! leading outside (the directory belongs to the task's unprivileged user, who can put
//! links anywhere, while the agent reads as root). Listings and files are bounded.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tacc_core::{ByteSize, NodeId, Timestamp};
use tacc_proto::{
    FileEntry, FileKind, MAX_LISTING_ENTRIES, NodeAnswer, NodeRequest, NodeRequestKind,
};

use crate::Shared;

/// What a question is answered with.
#[derive(Debug)]
enum Reply {
    Answer(NodeAnswer),
    File(Vec<u8>),
}

fn failed(code: &str, message: String) -> Reply {
    Reply::Answer(NodeAnswer::Failed {
        code: code.into(),
        message,
    })
}

/// Answer one question; `workdir` is the attempt's working directory when it runs here.
pub(crate) async fn answer(
    shared: Arc<Shared>,
    node: NodeId,
    request: NodeRequest,
    workdir: Option<PathBuf>,
) {
    let attempt = request.attempt;
    let reply = match workdir {
        None => failed(
            "not_found",
            format!(
                "task {} attempt {} does not run on node {} (any more)",
                attempt.task, attempt.attempt, shared.config.name
            ),
        ),
        Some(workdir) => {
            let kind = request.kind.clone();
            tokio::task::spawn_blocking(move || match kind {
                NodeRequestKind::List { path } => list(&workdir, &path),
                NodeRequestKind::Fetch { path, max_bytes } => fetch(&workdir, &path, max_bytes),
                // Sessions are served by `sessions`, never here.
                NodeRequestKind::Session { .. } => {
                    failed("bad_request", "a session is not a question".into())
                }
            })
            .await
            .unwrap_or_else(|e| failed("internal", format!("the answer failed: {e}")))
        }
    };
    let sent = match reply {
        Reply::Answer(answer) => {
            shared
                .client
                .answer_node_request(node, request.id, &answer)
                .await
        }
        Reply::File(bytes) => {
            shared
                .client
                .answer_node_file(node, request.id, bytes)
                .await
        }
    };
    if let Err(e) = sent {
        tracing::warn!("cannot answer the server's request {}: {e}", request.id);
    }
}

/// Open `relative` (a directory or a file) inside `workdir`, or say why not.
fn open(workdir: &Path, relative: &str) -> Result<std::fs::File, Reply> {
    let shown = if relative.is_empty() { "." } else { relative };
    let confined = Path::new(relative)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !confined {
        return Err(failed(
            "bad_request",
            format!(
                "`{shown}` is not inside the task's working directory (paths are relative, \
                 without `..`)"
            ),
        ));
    }
    let real_workdir = std::fs::canonicalize(workdir).map_err(|e| {
        failed(
            "not_found",
            format!("the working directory is not ready yet ({e}); try again in a moment"),
        )
    })?;
    crate::attempt::outputs::open_inside(&workdir.join(relative), &real_workdir).map_err(|e| {
        match e.kind() {
            std::io::ErrorKind::NotFound => failed(
                "not_found",
                format!("`{shown}` does not exist in the working directory"),
            ),
            _ if e.raw_os_error() == Some(nix::libc::ELOOP) => failed(
                "bad_request",
                format!("`{shown}` is a symbolic link; links are listed, never followed"),
            ),
            // `open_inside`'s own refusal: the real path lies elsewhere.
            std::io::ErrorKind::Other => failed(
                "bad_request",
                format!(
                    "`{shown}` leads outside the task's working directory; links are not \
                     followed out of it"
                ),
            ),
            _ => failed("bad_request", format!("`{shown}` cannot be read: {e}")),
        }
    })
}

fn entry_of(name: String, meta: &std::fs::Metadata) -> FileEntry {
    let kind = if meta.is_file() {
        FileKind::File
    } else if meta.is_dir() {
        FileKind::Dir
    } else if meta.file_type().is_symlink() {
        FileKind::Link
    } else {
        FileKind::Other
    };
    let mtime = u64::try_from(meta.mtime())
        .ok()
        .map(|secs| Timestamp(secs * 1000 + (meta.mtime_nsec() as u64) / 1_000_000));
    FileEntry {
        name,
        kind,
        size: if kind == FileKind::File {
            meta.len()
        } else {
            0
        },
        mtime,
    }
}

fn list(workdir: &Path, relative: &str) -> Reply {
    let opened = match open(workdir, relative) {
        Ok(opened) => opened,
        Err(reply) => return reply,
    };
    let meta = match opened.metadata() {
        Ok(meta) => meta,
        Err(e) => return failed("internal", format!("cannot read `{relative}`: {e}")),
    };
    if !meta.is_dir() {
        let name = Path::new(relative)
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        return Reply::Answer(NodeAnswer::Listing {
            entries: vec![entry_of(name, &meta)],
            truncated: false,
        });
    }
    // Read through the opened descriptor: a directory swapped for a link after the check
    // is not what gets listed.
    let dir = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
    let reader = match std::fs::read_dir(&dir) {
        Ok(reader) => reader,
        Err(e) => return failed("internal", format!("cannot list `{relative}`: {e}")),
    };
    let mut entries = Vec::new();
    let mut truncated = false;
    for item in reader.flatten() {
        if entries.len() == MAX_LISTING_ENTRIES {
            truncated = true;
            break;
        }
        let name = item.file_name();
        // `symlink_metadata` does not follow the entry itself.
        let Ok(meta) = std::fs::symlink_metadata(dir.join(&name)) else {
            continue;
        };
        entries.push(entry_of(name.to_string_lossy().into_owned(), &meta));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Reply::Answer(NodeAnswer::Listing { entries, truncated })
}

fn fetch(workdir: &Path, relative: &str, max_bytes: u64) -> Reply {
    let opened = match open(workdir, relative) {
        Ok(opened) => opened,
        Err(reply) => return reply,
    };
    let too_large = |size: String| {
        failed(
            "too_large",
            format!(
                "`{relative}` is {size}, more than the {} a running task's file may be fetched \
                 with; declare it in the task's `outputs:` and download it when the task ends",
                ByteSize::from_bytes(max_bytes)
            ),
        )
    };
    match opened.metadata() {
        Ok(meta) if meta.is_dir() => {
            return failed(
                "bad_request",
                format!("`{relative}` is a directory; list it with `tcloud ls`"),
            );
        }
        Ok(meta) if !meta.is_file() => {
            return failed("bad_request", format!("`{relative}` is not a regular file"));
        }
        Ok(meta) if meta.len() > max_bytes => {
            return too_large(ByteSize::from_bytes(meta.len()).to_string());
        }
        Ok(_) => {}
        Err(e) => return failed("internal", format!("cannot read `{relative}`: {e}")),
    }
    // The file may still grow while it is read.
    let mut bytes = Vec::new();
    match opened.take(max_bytes + 1).read_to_end(&mut bytes) {
        Ok(_) if bytes.len() as u64 > max_bytes => too_large("growing past that".into()),
        Ok(_) => Reply::File(bytes),
        Err(e) => failed("internal", format!("cannot read `{relative}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(reply: Reply) -> (Vec<FileEntry>, bool) {
        match reply {
            Reply::Answer(NodeAnswer::Listing { entries, truncated }) => (entries, truncated),
            other => panic!("{other:?}"),
        }
    }

    fn refusal(reply: Reply) -> (String, String) {
        match reply {
            Reply::Answer(NodeAnswer::Failed { code, message }) => (code, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn listings_show_kinds_and_never_follow_links_out() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("out/sub")).unwrap();
        std::fs::write(work.join("out/a.txt"), "abc").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path(), work.join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", work.join("out/passwd")).unwrap();

        let (root, truncated) = listing(list(&work, ""));
        assert!(!truncated);
        let names: Vec<(&str, FileKind)> = root.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            names,
            vec![("escape", FileKind::Link), ("out", FileKind::Dir)]
        );
        let (out, _) = listing(list(&work, "out/"));
        let a = out.iter().find(|e| e.name == "a.txt").unwrap();
        assert_eq!((a.kind, a.size), (FileKind::File, 3));
        assert!(a.mtime.is_some());
        let (one, _) = listing(list(&work, "out/a.txt"));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "a.txt");

        for (path, code) in [
            ("..", "bad_request"),
            ("out/../..", "bad_request"),
            ("/etc", "bad_request"),
            ("escape", "bad_request"),
            ("escape/secret", "bad_request"),
            ("out/passwd", "bad_request"),
            ("missing", "not_found"),
        ] {
            assert_eq!(refusal(list(&work, path)).0, code, "{path}");
            assert_eq!(refusal(fetch(&work, path, 100)).0, code, "{path}");
        }
    }

    #[test]
    fn fetched_files_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("small"), "hello").unwrap();
        std::fs::write(dir.path().join("big"), vec![0u8; 2048]).unwrap();
        match fetch(dir.path(), "small", 1024) {
            Reply::File(bytes) => assert_eq!(bytes, b"hello"),
            other => panic!("{other:?}"),
        }
        let (code, message) = refusal(fetch(dir.path(), "big", 1024));
        assert_eq!(code, "too_large");
        assert!(
            message.contains("2KiB") && message.contains("1KiB") && message.contains("outputs:"),
            "{message}"
        );
        assert_eq!(refusal(fetch(dir.path(), "", 1024)).0, "bad_request");
    }

    #[test]
    fn long_directories_are_cut_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_LISTING_ENTRIES + 5 {
            std::fs::File::create(dir.path().join(format!("f{i}"))).unwrap();
        }
        let (entries, truncated) = listing(list(dir.path(), ""));
        assert_eq!(entries.len(), MAX_LISTING_ENTRIES);
        assert!(truncated);
    }
}
