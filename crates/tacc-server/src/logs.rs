//! Durable task logs: one append-only file per task, read by byte offset, with
//! notification so followers see new output as soon as it is written.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tacc_core::TaskId;
use tokio::sync::Notify;

#[derive(Debug)]
pub struct LogBook {
    dir: PathBuf,
    watchers: Mutex<BTreeMap<TaskId, Arc<Notify>>>,
    /// Bytes kept per task; what comes past it is dropped after one marker line.
    max_bytes: u64,
    /// Bytes written to every log (`tacc_log_bytes_total`).
    written: prometheus::IntCounter,
}

/// The line that ends a log cut at the cap.
pub const TRUNCATED_MARKER: &str = "[tacc] log truncated: this task wrote more than";

impl LogBook {
    pub fn open(dir: PathBuf, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(LogBook {
            dir,
            watchers: Mutex::new(BTreeMap::new()),
            max_bytes,
            written: crate::metrics::Metrics::log_bytes_counter(),
        })
    }

    /// The counter of bytes written, for the server's metrics.
    pub fn written_counter(&self) -> prometheus::IntCounter {
        self.written.clone()
    }

    fn path(&self, task: TaskId) -> PathBuf {
        self.dir.join(format!("{task}.log"))
    }

    /// Append `line` (with its newline) as a line of its own: a log whose last line was
    /// cut short (an attempt that died mid-line) gets a newline first.
    pub fn append_line(&self, task: TaskId, line: &str) -> std::io::Result<()> {
        let ends_mid_line = match std::fs::File::open(self.path(task)) {
            Ok(mut file) if file.metadata()?.len() > 0 => {
                let mut last = [0u8; 1];
                file.seek(SeekFrom::End(-1))?;
                file.read_exact(&mut last)?;
                last[0] != b'\n'
            }
            _ => false,
        };
        let text = format!("{}{line}", if ends_mid_line { "\n" } else { "" });
        self.append(task, &text)
    }

    /// Append text to the task's log. Written before this returns, so a crash of the
    /// server after it returns loses nothing.
    pub fn append(&self, task: TaskId, text: &str) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(task))?;
        let size = file.metadata()?.len();
        if size >= self.max_bytes {
            // Already cut (the marker was written when the cap was reached).
            return Ok(());
        }
        let room = usize::try_from(self.max_bytes - size).unwrap_or(usize::MAX);
        let written = if text.len() < room {
            file.write_all(text.as_bytes()).map(|()| text.len())
        } else {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let marker = format!(
                "\n{TRUNCATED_MARKER} {} bytes; the rest of its output was dropped \
                 (taccd server --max-log)\n",
                self.max_bytes
            );
            file.write_all(&text.as_bytes()[..cut])
                .and_then(|()| file.write_all(marker.as_bytes()))
                .map(|()| cut + marker.len())
        };
        match written {
            Ok(bytes) => self.written.inc_by(bytes as u64),
            Err(e) => {
                // Part of the text may be in (the disk filled up midway): take it out,
                // so the sender's retry of the whole text leaves it in the log once.
                let _ = file.set_len(size);
                return Err(e);
            }
        }
        self.wake(task);
        Ok(())
    }

    /// Wake the followers of a task (new output, or the task ended).
    pub fn wake(&self, task: TaskId) {
        if let Some(notify) = self.watchers.lock().unwrap().get(&task) {
            notify.notify_waiters();
        }
    }

    pub fn watcher(&self, task: TaskId) -> Arc<Notify> {
        self.watchers
            .lock()
            .unwrap()
            .entry(task)
            .or_default()
            .clone()
    }

    /// How many bytes the task's log holds (0 when there is none yet).
    pub fn len(&self, task: TaskId) -> std::io::Result<u64> {
        match std::fs::metadata(self.path(task)) {
            Ok(meta) => Ok(meta.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Up to `max` bytes from `offset`; empty at the end (or when there is no log yet).
    pub fn read(&self, task: TaskId, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        let mut file = match std::fs::File::open(self.path(task)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(offset))?;
        let mut buffer = Vec::new();
        file.take(max as u64).read_to_end(&mut buffer)?;
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_past_its_cap_is_cut_once_with_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let book = LogBook::open(dir.path().to_path_buf(), 10).unwrap();
        book.append(TaskId(1), "12345\n").unwrap();
        book.append(TaskId(1), "67890abc\n").unwrap();
        book.append(TaskId(1), "extra\n").unwrap();
        let text = String::from_utf8(book.read(TaskId(1), 0, usize::MAX).unwrap()).unwrap();
        assert!(text.starts_with("12345\n6789"), "{text}");
        assert_eq!(text.matches(TRUNCATED_MARKER).count(), 1, "{text}");
        assert!(!text.contains("extra"), "{text}");
        assert_eq!(book.written_counter().get(), text.len() as u64);
    }
}
