//! Follows one rank's stdout and stderr files on the shared disk, from where a previous
//! life of the agent stopped. The files are read a bounded piece at a time and cut into
//! lines of at most [`crate::MAX_LINE_BYTES`], and reading waits while the reader of the
//! output is behind: a rank that wrote gigabytes costs the agent a piece of memory, never
//! the files' size.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::lines::LineSplitter;
use crate::{OutputSender, Stream};

/// Bytes read from one file at a time.
const READ_PIECE: u64 = 1 << 20;
/// Bytes forwarded from one file per look, so the job's supervisor gets back to its
/// other duties (cancel, time limit) while a rank writes faster than it is forwarded.
const FORWARD_PER_LOOK: u64 = 64 << 20;

/// One followed file.
#[derive(Debug)]
struct Followed {
    path: PathBuf,
    splitter: LineSplitter,
    /// Bytes of the file read so far.
    read: u64,
}

#[derive(Debug)]
pub(super) struct Tail {
    files: [Followed; 2],
    /// Where the forwarded offsets are kept for the agent's next life.
    offsets: PathBuf,
}

impl Tail {
    pub(super) fn resume(dir: &Path, rank: u32) -> Tail {
        let offsets = dir.join(format!("offsets-{rank}"));
        let saved: Vec<u64> = std::fs::read_to_string(&offsets)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let followed = |name: String, stream: Stream, index: usize| Followed {
            path: dir.join(name),
            splitter: LineSplitter::new(stream),
            read: saved.get(index).copied().unwrap_or(0),
        };
        Tail {
            files: [
                followed(format!("out-{rank}.log"), Stream::Stdout, 0),
                followed(format!("err-{rank}.log"), Stream::Stderr, 1),
            ],
            offsets,
        }
    }

    /// Forward what is new (waiting while `output` is full); at the end (`last`), a
    /// final unterminated line too.
    pub(super) async fn forward(&mut self, output: &OutputSender, last: bool) {
        let mut moved = false;
        for followed in &mut self.files {
            let Ok(mut file) = std::fs::File::open(&followed.path) else {
                continue;
            };
            let mut forwarded = 0;
            while last || forwarded < FORWARD_PER_LOOK {
                if file.seek(SeekFrom::Start(followed.read)).is_err() {
                    break;
                }
                let mut piece = Vec::new();
                match (&mut file).take(READ_PIECE).read_to_end(&mut piece) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => {
                        followed.read += read as u64;
                        forwarded += read as u64;
                        moved = true;
                        if !followed.splitter.push(&piece, output).await {
                            return;
                        }
                    }
                }
            }
            if last {
                followed.splitter.finish(output).await;
            }
        }
        if moved {
            // What was sent, so a restarted agent resumes where the output stopped.
            let done: Vec<String> = self
                .files
                .iter()
                .map(|f| (f.read - f.splitter.pending_len() as u64).to_string())
                .collect();
            let _ = std::fs::write(&self.offsets, done.join(" "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_forwarded_once_across_looks_and_lives() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out-0.log");
        std::fs::write(&out, "one\ntw").unwrap();
        let (tx, mut rx) = crate::output_channel();
        let mut tail = Tail::resume(dir.path(), 0);
        tail.forward(&tx, false).await;
        assert_eq!(rx.recv().await.unwrap().text, "one");
        assert!(rx.try_recv().is_err(), "an unfinished line waits");
        // The agent's next life resumes after what was sent.
        std::fs::write(&out, "one\ntwo\nthree").unwrap();
        let mut next = Tail::resume(dir.path(), 0);
        next.forward(&tx, true).await;
        drop(tx);
        let mut rest = Vec::new();
        while let Some(line) = rx.recv().await {
            rest.push(line.text);
        }
        assert_eq!(rest, ["two", "three"]);
    }

    #[tokio::test]
    async fn a_large_file_waits_for_its_reader() {
        let dir = tempfile::tempdir().unwrap();
        let line = "x".repeat(1000);
        let lines = 4 * crate::OUTPUT_BUFFER_LINES;
        std::fs::write(
            dir.path().join("out-0.log"),
            format!("{line}\n").repeat(lines),
        )
        .unwrap();
        let (tx, mut rx) = crate::output_channel();
        let forwarding = tokio::spawn(async move {
            let mut tail = Tail::resume(dir.path(), 0);
            tail.forward(&tx, true).await;
        });
        let mut received = 0;
        while let Some(got) = rx.recv().await {
            assert!(
                rx.len() < crate::OUTPUT_BUFFER_LINES,
                "more in flight than the bound"
            );
            assert_eq!(got.text.len(), 1000);
            received += 1;
        }
        forwarding.await.unwrap();
        assert_eq!(received, lines);
    }
}
