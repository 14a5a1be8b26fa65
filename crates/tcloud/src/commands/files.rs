//! A task's files: `tcloud ls` (a running task's live working directory on any node, or
//! the outputs a task kept) and `tcloud download` (kept outputs of every rank, or one
//! file of a running task's working directory).
//!
//! Names come from the task (and so from whoever wrote it): they go through
//! [`crate::sanitize`] before they are printed, and through [`safe_join`] before they
//! become local paths.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tacc_client::Client;
use tacc_core::{AttemptNo, TaskId};
use tacc_proto::{FileKind, FileListing, MAX_LISTING_ENTRIES, MAX_LIVE_FILE_BYTES, OutputFile};

use super::Ctx;
use crate::errors::{CliError, FAILURE};
use crate::format::{self, ago, now, out, out_json, print_table, table};
use crate::sanitize::field;
use crate::upload::byte_bar;

/// Files at least this large (in total) get a download progress bar.
const BAR_THRESHOLD: u64 = 8 << 20;
/// How long `download` waits for ranks still uploading the outputs of an ended attempt.
const PENDING_DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------- ls

pub async fn ls(
    ctx: &Ctx,
    id: TaskId,
    path: Option<String>,
    rank: Option<u32>,
    attempt: Option<u32>,
    as_json: bool,
) -> Result<()> {
    let client = ctx.client()?;
    let listing = client
        .list_files(
            id,
            path.as_deref().unwrap_or(""),
            rank,
            attempt.map(AttemptNo),
        )
        .await?;
    if as_json {
        return out_json(&listing);
    }
    eprintln!("{}", listing_title(&listing));
    if listing.entries.is_empty() {
        out(if listing.live {
            "(empty)"
        } else {
            "(no kept outputs here)"
        })?;
    } else {
        let now = now();
        let mut t = table(["TYPE", "SIZE", "MODIFIED", "NAME"]);
        for entry in &listing.entries {
            let mut name = field(&entry.name);
            if entry.kind == FileKind::Dir {
                name.push('/');
            }
            t.add_row([
                entry.kind.as_str().to_string(),
                match entry.kind {
                    FileKind::File => format::size(entry.size),
                    FileKind::Dir if !listing.live => format::size(entry.size),
                    _ => "-".to_string(),
                },
                entry.mtime.map_or_else(|| "-".to_string(), |t| ago(t, now)),
                name,
            ]);
        }
        print_table(&t)?;
    }
    if listing.truncated {
        eprintln!("(only the first {MAX_LISTING_ENTRIES} entries are listed: list a subdirectory)");
    }
    Ok(())
}

/// `task 12 attempt 1, rank 1 on n2 (live): out/`.
fn listing_title(listing: &FileListing) -> String {
    let place = if listing.path.is_empty() {
        ".".to_string()
    } else {
        field(&listing.path)
    };
    let whose = match (listing.live, listing.rank, &listing.node) {
        (true, Some(rank), Some(node)) => {
            format!("rank {rank} on {} (live working directory)", field(node))
        }
        (true, _, _) => "live working directory".to_string(),
        (false, Some(rank), _) => format!("kept outputs of rank {rank}"),
        (false, None, _) => {
            "kept outputs (paths several ranks wrote are listed as rank-R/PATH)".to_string()
        }
    };
    format!(
        "task {} attempt {}, {whose}: {place}",
        listing.task, listing.attempt
    )
}

// ---------------------------------------------------------------- download

/// `dest` joined with the server-given relative `path`, or `None` when the path is empty,
/// absolute or climbs out of `dest` with `..`.
pub fn safe_join(dest: &Path, path: &str) -> Option<PathBuf> {
    let mut joined = dest.to_path_buf();
    let mut depth = 0;
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => {
                joined.push(part);
                depth += 1;
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (depth > 0).then_some(joined)
}

/// A path the user typed, as the server names things: `a/b`, no `./`, no trailing `/`.
fn normalised(path: &str) -> String {
    path.split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// How an output is named locally and matched against PATH: its rank-qualified name
/// (every rank), or its own path (one rank asked for).
fn local_name(file: &OutputFile, rank: Option<u32>) -> &str {
    if rank.is_some() || file.name.is_empty() {
        &file.path
    } else {
        &file.name
    }
}

fn under(name: &str, wanted: &str) -> bool {
    wanted.is_empty()
        || name == wanted
        || name
            .strip_prefix(wanted)
            .is_some_and(|rest| rest.starts_with('/'))
}

pub async fn download(
    ctx: &Ctx,
    id: TaskId,
    path: Option<String>,
    rank: Option<u32>,
    attempt: Option<u32>,
    dest: Option<PathBuf>,
) -> Result<()> {
    let client = ctx.client()?;
    let task = client.get_task(id).await?;
    let dest = dest.unwrap_or_else(|| PathBuf::from("tacc-outputs").join(id.to_string()));
    let live = !task.state.is_terminal()
        && !task.nodes.is_empty()
        && attempt.is_none_or(|a| a == task.attempt.0);
    match path {
        Some(path) if live => live_file(&client, id, &path, rank, &dest).await,
        path => kept(&client, &task, path, rank, attempt, &dest).await,
    }
}

/// One file of the running attempt's working directory.
async fn live_file(
    client: &Client,
    id: TaskId,
    path: &str,
    rank: Option<u32>,
    dest: &Path,
) -> Result<()> {
    let bytes = client.get_live_file(id, path, rank).await?;
    let Some(target) = safe_join(dest, path) else {
        return Err(CliError::invalid(format!(
            "`{}` is not a path inside the task's working directory",
            field(path)
        ))
        .into());
    };
    let written = write_inside(dest, &target, &bytes)?;
    out(format!(
        "{}  ({})",
        field(&written.display().to_string()),
        format::size(bytes.len() as u64)
    ))?;
    eprintln!(
        "Fetched {} from the live working directory of task {id} (rank {}); a running task's \
         files may be fetched up to {} each — declare bigger ones in `outputs:` to get them \
         when it ends",
        field(path),
        rank.unwrap_or(0),
        format::size(MAX_LIVE_FILE_BYTES)
    );
    Ok(())
}

/// Write `bytes` at `target` inside `dest`, creating directories; a link inside DEST must
/// not lead the write elsewhere.
fn write_inside(dest: &Path, target: &Path, bytes: &[u8]) -> Result<PathBuf> {
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let dest_real = std::fs::canonicalize(dest)
        .with_context(|| format!("cannot resolve {}", dest.display()))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let parent_real = std::fs::canonicalize(parent)
            .with_context(|| format!("cannot resolve {}", parent.display()))?;
        if !parent_real.starts_with(&dest_real) {
            return Err(CliError::new(
                FAILURE,
                format!(
                    "refusing to write {}: it would escape {}",
                    field(&target.display().to_string()),
                    dest.display()
                ),
            )
            .into());
        }
    }
    std::fs::write(target, bytes).with_context(|| format!("cannot write {}", target.display()))?;
    Ok(target.to_path_buf())
}

/// Wait (bounded) for ranks of an ended task that are still uploading their outputs.
async fn settled_outputs(client: &Client, task: &tacc_proto::TaskView) -> Result<Vec<OutputFile>> {
    let end = Instant::now() + PENDING_DEADLINE;
    let mut told = false;
    loop {
        let (files, pending) = client.list_outputs_pending(task.id).await?;
        if pending.is_empty() || !task.state.is_terminal() {
            return Ok(files);
        }
        let ranks: Vec<String> = pending
            .iter()
            .map(|(attempt, rank)| format!("rank {rank} (attempt {attempt})"))
            .collect();
        if Instant::now() >= end {
            eprintln!(
                "warning: {} still uploading outputs after {} s; what they kept so far is \
                 downloaded — run this again later for the rest",
                ranks.join(", "),
                PENDING_DEADLINE.as_secs()
            );
            return Ok(files);
        }
        if !told {
            eprintln!(
                "waiting for {} to finish uploading outputs…",
                ranks.join(", ")
            );
            told = true;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The outputs an attempt kept (every rank's, or one rank's), all or those under PATH.
async fn kept(
    client: &Client,
    task: &tacc_proto::TaskView,
    path: Option<String>,
    rank: Option<u32>,
    attempt: Option<u32>,
    dest: &Path,
) -> Result<()> {
    let id = task.id;
    let outputs = settled_outputs(client, task).await?;
    if outputs.is_empty() {
        let note = if task.state.is_terminal() {
            "it declared none, or none of them existed when it ended".to_string()
        } else {
            format!(
                "outputs are kept when an attempt ends; fetch a file of its live working \
                 directory now with `tcloud download {id} PATH` (see `tcloud ls {id}`)"
            )
        };
        out(format!("task {id} ({}) has no outputs: {note}", task.state))?;
        return Ok(());
    }
    let latest = outputs.iter().map(|o| o.attempt.0).max().unwrap_or(1);
    let chosen = attempt.unwrap_or(latest);
    let of_attempt: Vec<&OutputFile> = outputs.iter().filter(|o| o.attempt.0 == chosen).collect();
    if of_attempt.is_empty() {
        let mut attempts: Vec<u32> = outputs.iter().map(|o| o.attempt.0).collect();
        attempts.dedup();
        return Err(CliError::not_found(format!(
            "attempt {chosen} of task {id} has no outputs; attempts with outputs: {}",
            attempts
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into());
    }
    let wanted = path.as_deref().map(normalised).unwrap_or_default();
    let files: Vec<&OutputFile> = of_attempt
        .into_iter()
        .filter(|o| rank.is_none_or(|r| r == o.rank))
        .filter(|o| under(local_name(o, rank), &wanted))
        .collect();
    if files.is_empty() {
        let place = match (&path, rank) {
            (Some(path), Some(rank)) => format!(" at `{}` on rank {rank}", field(path)),
            (Some(path), None) => format!(" at `{}`", field(path)),
            (None, Some(rank)) => format!(" on rank {rank}"),
            (None, None) => String::new(),
        };
        return Err(CliError::not_found(format!(
            "attempt {chosen} of task {id} kept no output{place}; list what it kept with \
             `tcloud ls {id}` (the destination directory is given with --dest DIR)"
        ))
        .into());
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let bar = byte_bar(total, total >= BAR_THRESHOLD, "downloading");
    let mut written = Vec::new();
    let mut refused = 0;
    for file in &files {
        let name = local_name(file, rank);
        let Some(target) = safe_join(dest, name) else {
            bar.suspend(|| {
                eprintln!(
                    "warning: refusing output path `{}`: it would escape {}",
                    field(name),
                    dest.display()
                )
            });
            refused += 1;
            continue;
        };
        let bytes = client
            .get_rank_output(id, AttemptNo(chosen), file.rank, &file.path)
            .await?;
        match bar.suspend(|| write_inside(dest, &target, &bytes)) {
            Ok(path) => written.push((path, bytes.len() as u64)),
            Err(e) => {
                bar.suspend(|| eprintln!("warning: {e:#}"));
                refused += 1;
                continue;
            }
        }
        bar.inc(file.size);
    }
    bar.finish_and_clear();
    for (path, size) in &written {
        out(format!(
            "{}  ({})",
            field(&path.display().to_string()),
            format::size(*size)
        ))?;
    }
    eprintln!(
        "Downloaded {} file(s), {}, of task {id} attempt {chosen} into {}",
        written.len(),
        format::size(written.iter().map(|(_, s)| s).sum()),
        dest.display()
    );
    if refused > 0 {
        return Err(
            CliError::new(FAILURE, format!("refused {refused} unsafe output path(s)")).into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_join_refuses_escapes() {
        let dest = Path::new("/tmp/out");
        assert_eq!(
            safe_join(dest, "results/m.json"),
            Some(PathBuf::from("/tmp/out/results/m.json"))
        );
        assert_eq!(safe_join(dest, "./a"), Some(PathBuf::from("/tmp/out/a")));
        assert_eq!(safe_join(dest, "../etc/passwd"), None);
        assert_eq!(safe_join(dest, "a/../../b"), None);
        assert_eq!(safe_join(dest, "/etc/passwd"), None);
        assert_eq!(safe_join(dest, ""), None);
        assert_eq!(safe_join(dest, "."), None);
    }

    #[test]
    fn paths_select_whole_components() {
        assert!(under("out/same.txt", ""));
        assert!(under("out/same.txt", "out"));
        assert!(under("out/same.txt", "out/same.txt"));
        assert!(!under("outside/x", "out"));
        assert_eq!(normalised("./out/"), "out");
        assert_eq!(normalised("rank-1//out/x"), "rank-1/out/x");
    }

    #[test]
    fn collisions_are_downloaded_under_rank_qualified_names_unless_one_rank_is_asked_for() {
        let file = OutputFile {
            path: "out/same.txt".into(),
            size: 1,
            attempt: AttemptNo(1),
            rank: 1,
            name: "rank-1/out/same.txt".into(),
        };
        assert_eq!(local_name(&file, None), "rank-1/out/same.txt");
        assert_eq!(local_name(&file, Some(1)), "out/same.txt");
        let old_server = OutputFile {
            name: String::new(),
            ..file
        };
        assert_eq!(local_name(&old_server, None), "out/same.txt");
    }
}
