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
}

impl LogBook {
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(LogBook {
            dir,
            watchers: Mutex::new(BTreeMap::new()),
        })
    }

    fn path(&self, task: TaskId) -> PathBuf {
        self.dir.join(format!("{task}.log"))
    }

    /// Append text to the task's log. Written before this returns, so a crash of the
    /// server after it returns loses nothing.
    pub fn append(&self, task: TaskId, text: &str) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(task))?;
        file.write_all(text.as_bytes())?;
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
