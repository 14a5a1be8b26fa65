//! Where a daemon's own log lines go (standard error, which `tcloud up` and `taccd dev`
//! point at a file in the data directory): a writer that never fails. A line that cannot
//! be written — the disk holding the log file is full — is dropped and counted
//! ([`lines_dropped`], the `tacc_log_lines_dropped_total` metric), and the next line that
//! can be written is preceded by one saying how many were lost.
//!
//! Why not plain `std::io::stderr`: tracing-subscriber reports a failed write with
//! `eprintln!`, which panics when standard error cannot be written either, in whatever
//! thread logged: the agent's reporter died that way and a server's reply became an
//! empty one (issue 22). A daemon must outlive a full disk.

use std::io::{self, Write};
use std::sync::LazyLock;
use std::sync::Mutex;

use prometheus::IntCounter;

/// Log lines of this process dropped because they could not be written.
static DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new(
        "tacc_log_lines_dropped_total",
        "Lines of the daemon's own log dropped because they could not be written (e.g. the \
         disk holding the log file was full).",
    )
    .expect("a valid metric definition")
});

/// Drops not yet told in the log, and whether the last failed write may have left half
/// a line behind (the notice then starts on a line of its own).
static UNTOLD: Mutex<(u64, bool)> = Mutex::new((0, false));

/// The counter of dropped lines (the same one for the whole process: every server in
/// it registers it).
pub fn lines_dropped() -> IntCounter {
    DROPPED.clone()
}

/// The writer `tracing_subscriber::fmt().with_writer(tacc_server::daemon_log::stderr)`
/// takes: standard error, never failing.
pub fn stderr() -> NeverFails<io::Stderr> {
    NeverFails(io::stderr())
}

/// A writer that swallows its target's errors, counting each failed write (the
/// formatter writes one line at a time) as a dropped line.
#[derive(Debug)]
pub struct NeverFails<W>(pub W);

impl<W: Write> NeverFails<W> {
    /// Write all of `buf`; `Err` with how many bytes went out before it failed.
    fn write_whole(&mut self, mut buf: &[u8]) -> Result<(), usize> {
        let mut written = 0;
        while !buf.is_empty() {
            match self.0.write(buf) {
                Ok(0) => return Err(written),
                Ok(n) => {
                    written += n;
                    buf = &buf[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(written),
            }
        }
        Ok(())
    }
}

impl<W: Write> Write for NeverFails<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut untold = UNTOLD.lock().unwrap_or_else(|e| e.into_inner());
        if untold.0 > 0 {
            let notice = format!(
                "{}taccd: {} line(s) of this log could not be written (is the disk full?) and \
                 were dropped\n",
                if untold.1 { "\n" } else { "" },
                untold.0
            );
            match self.write_whole(notice.as_bytes()) {
                Ok(()) => *untold = (0, false),
                Err(partial) => {
                    untold.0 += 1;
                    untold.1 |= partial > 0;
                    DROPPED.inc();
                    return Ok(buf.len());
                }
            }
        }
        if let Err(partial) = self.write_whole(buf) {
            untold.0 += 1;
            untold.1 |= partial > 0;
            DROPPED.inc();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails while `full` says so, keeping what it accepted.
    struct Disk<'a> {
        full: &'a std::cell::Cell<bool>,
        kept: &'a std::cell::RefCell<Vec<u8>>,
    }

    impl Write for Disk<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.full.get() {
                return Err(io::Error::from_raw_os_error(28));
            }
            self.kept.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_that_cannot_be_written_are_dropped_counted_and_told() {
        let full = std::cell::Cell::new(false);
        let kept = std::cell::RefCell::new(Vec::new());
        let mut log = NeverFails(Disk {
            full: &full,
            kept: &kept,
        });
        let before = lines_dropped().get();
        log.write_all(b"one\n").unwrap();
        full.set(true);
        // Never an error, so nothing above ever reports one (with a panic).
        log.write_all(b"two\n").unwrap();
        log.write_all(b"three\n").unwrap();
        log.flush().unwrap();
        assert!(lines_dropped().get() >= before + 2);
        full.set(false);
        log.write_all(b"four\n").unwrap();
        let text = String::from_utf8(kept.borrow().clone()).unwrap();
        // (Another test of this process may have dropped lines too: the count is the
        // process's.)
        assert!(text.contains("one\n"), "{text}");
        assert!(!text.contains("two") && !text.contains("three"), "{text}");
        assert!(text.ends_with("were dropped\nfour\n"), "{text}");
    }

    #[test]
    fn dev_full_never_fails() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut log = NeverFails(file);
        let before = lines_dropped().get();
        log.write_all(b"a line\n").unwrap();
        assert!(lines_dropped().get() > before);
    }
}
