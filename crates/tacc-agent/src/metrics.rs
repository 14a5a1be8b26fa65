//! Tails the file a running attempt appends its metrics to (`$TACC_METRICS`, one JSON
//! object per line with a `step`) and sends the lines to the server in the ordered report
//! stream. Bounded: a line longer than [`MAX_LINE_BYTES`] is skipped, at most
//! [`MAX_LINES_PER_SECOND`] lines a second are sent (the rest are dropped, said once in
//! the task's log), and the file is opened without following links (it lies in a
//! directory the task owns, while the agent reads as root).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tacc_proto::{AgentReport, AttemptRef, MetricLine};
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// Longer lines are skipped.
pub(crate) const MAX_LINE_BYTES: usize = 4096;
/// More lines in a second are dropped.
pub(crate) const MAX_LINES_PER_SECOND: usize = 100;
/// How often the file is read while the attempt runs.
const TICK: Duration = Duration::from_millis(250);

/// The file's unread end, and what is held back of an unfinished last line.
#[derive(Debug, Default)]
struct Tail {
    offset: u64,
    partial: Vec<u8>,
    /// A line too long is skipped up to its end.
    skipping: bool,
}

impl Tail {
    /// The whole lines appended since the last read.
    fn read(&mut self, path: &Path) -> Vec<String> {
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits(),
            )
            .open(path)
        else {
            return Vec::new();
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Vec::new();
        }
        self.read_from(&mut file)
    }

    fn read_from(&mut self, file: &mut File) -> Vec<String> {
        let mut bytes = Vec::new();
        // At most a second's worth of long lines per read, so a huge file cannot stall us.
        let budget = (MAX_LINE_BYTES * MAX_LINES_PER_SECOND) as u64;
        if file.seek(SeekFrom::Start(self.offset)).is_err()
            || file.take(budget).read_to_end(&mut bytes).is_err()
        {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        let mut lines = Vec::new();
        for byte in bytes {
            if byte == b'\n' {
                if !self.skipping {
                    lines.push(String::from_utf8_lossy(&self.partial).into_owned());
                }
                self.partial.clear();
                self.skipping = false;
            } else if !self.skipping {
                self.partial.push(byte);
                if self.partial.len() > MAX_LINE_BYTES {
                    self.partial.clear();
                    self.skipping = true;
                }
            }
        }
        lines
    }
}

/// One line as a metric point: a JSON object with a whole `step` and numeric values;
/// `None` for anything else (other fields are ignored).
pub(crate) fn parse_line(line: &str) -> Option<MetricLine> {
    let serde_json::Value::Object(fields) = serde_json::from_str(line.trim()).ok()? else {
        return None;
    };
    let step = fields.get("step")?.as_u64()?;
    let values = fields
        .iter()
        .filter(|(name, _)| name.as_str() != "step" && name.len() <= 64)
        .filter_map(|(name, value)| Some((name.clone(), value.as_f64()?)))
        .filter(|(_, value)| value.is_finite())
        .collect();
    Some(MetricLine { step, values })
}

/// Tail `path` until `stop`, then read it one last time, so every line written before
/// the attempt ended is sent before its end is reported. Returns when all are sent.
pub(crate) async fn follow(
    shared: Arc<Shared>,
    attempt: AttemptRef,
    path: PathBuf,
    stop: CancellationToken,
) {
    let mut tail = Tail::default();
    let mut window = tokio::time::Instant::now();
    let mut sent_in_window = 0usize;
    let mut warned = false;
    // The first read a tick in: a short attempt's lines are all read once, at its end.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    loop {
        let last = tokio::select! {
            _ = ticker.tick() => false,
            _ = stop.cancelled() => true,
        };
        if window.elapsed() >= Duration::from_secs(1) {
            window = tokio::time::Instant::now();
            sent_in_window = 0;
        }
        let lines = tail.read(&path);
        let mut points = Vec::new();
        for line in lines {
            let Some(point) = parse_line(&line) else {
                continue;
            };
            if sent_in_window >= MAX_LINES_PER_SECOND {
                if !warned {
                    warned = true;
                    crate::attempt::report(
                        &shared,
                        AgentReport::Log {
                            attempt,
                            text: format!(
                                "[tacc] more than {MAX_LINES_PER_SECOND} metric lines a second: the excess is dropped; report every few steps instead\n"
                            ),
                            offset: None,
                        },
                    );
                }
                continue;
            }
            sent_in_window += 1;
            points.push(point);
        }
        if !points.is_empty() {
            crate::attempt::report(&shared, AgentReport::Metrics { attempt, points });
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn lines_parse_to_a_step_and_numeric_values() {
        let point = parse_line(r#"{"step": 10, "val_loss": 0.31, "note": "x", "acc": 1}"#).unwrap();
        assert_eq!(point.step, 10);
        assert_eq!(point.values.len(), 2);
        assert_eq!(point.values["val_loss"], 0.31);
        assert!(parse_line(r#"{"val_loss": 0.31}"#).is_none(), "no step");
        assert!(parse_line(r#"{"step": -1}"#).is_none());
        assert!(parse_line("not json").is_none());
        assert!(parse_line("[1, 2]").is_none());
    }

    #[test]
    fn the_tail_returns_whole_new_lines_and_skips_long_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut file = File::create(&path).unwrap();
        let mut tail = Tail::default();
        assert!(tail.read(&dir.path().join("absent")).is_empty());
        write!(file, "{{\"step\": 1}}\n{{\"step\"").unwrap();
        assert_eq!(tail.read(&path), [r#"{"step": 1}"#]);
        write!(
            file,
            ": 2}}\n{}\n{{\"step\": 3}}\n",
            "x".repeat(MAX_LINE_BYTES + 10)
        )
        .unwrap();
        assert_eq!(tail.read(&path), [r#"{"step": 2}"#, r#"{"step": 3}"#]);
        assert!(tail.read(&path).is_empty());
        // A link is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(Tail::default().read(&link).is_empty());
    }
}
