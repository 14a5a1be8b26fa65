//! One attempt's output not yet delivered to the server, in order: held in memory up to
//! [`MEMORY_BYTES`], past that appended to a file of its own under the agent's data
//! directory and read back from there. A task that prints faster than the server takes
//! its output — or while the server is away — never stalls and never grows the agent's
//! memory; nothing is lost or reordered. Only when the file cannot be written (the disk
//! is full) is output dropped, and the log then says how much and why, at the place the
//! output was dropped from: output that could be kept after it (the disk has room again)
//! comes after that line.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Output of one attempt kept in memory before it goes to the spill file.
pub(crate) const MEMORY_BYTES: usize = 2 << 20;

#[derive(Debug)]
pub(crate) struct Spool {
    /// The oldest output, in the order it came.
    memory: VecDeque<String>,
    memory_bytes: usize,
    /// Output newer than all of `memory`, while there is some.
    spill: Option<Spill>,
    path: PathBuf,
    /// Bytes ever put in, and taken out (positions in the attempt's output).
    appended: u64,
    taken: u64,
    /// Runs of output dropped because they could not be spilled, oldest first.
    gaps: VecDeque<Gap>,
}

/// A run of dropped output, in the attempt's output positions.
#[derive(Debug)]
struct Gap {
    start: u64,
    bytes: u64,
    why: String,
}

#[derive(Debug)]
struct Spill {
    file: File,
    read_at: u64,
    write_at: u64,
}

impl Spool {
    /// A spool that spills to `path` (created only when needed, removed when drained).
    pub(crate) fn new(path: PathBuf) -> Self {
        Spool {
            memory: VecDeque::new(),
            memory_bytes: 0,
            spill: None,
            path,
            appended: 0,
            taken: 0,
            gaps: VecDeque::new(),
        }
    }

    /// Bytes put in so far: the position the next output starts at.
    pub(crate) fn appended(&self) -> u64 {
        self.appended
    }

    /// Bytes taken out so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.taken == self.appended && self.gaps.is_empty()
    }

    /// Whether part of the output waits in the spill file.
    #[cfg(test)]
    pub(crate) fn spilling(&self) -> bool {
        self.spill.is_some()
    }

    pub(crate) fn append(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        let len = text.len();
        if self.spill.is_none() && self.memory_bytes + len <= MEMORY_BYTES {
            self.memory_bytes += len;
            self.memory.push_back(text);
        } else if let Err(e) = self.spill(text.as_bytes()) {
            match self.gaps.back_mut() {
                // Dropped right after the last run: one run.
                Some(gap) if gap.start + gap.bytes == self.appended => gap.bytes += len as u64,
                _ => self.gaps.push_back(Gap {
                    start: self.appended,
                    bytes: len as u64,
                    why: format!(
                        "cannot keep it in {} until the server takes it: {e}",
                        self.path.display()
                    ),
                }),
            }
        }
        self.appended += len as u64;
    }

    fn spill(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.spill.is_none() {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&self.path)?;
            self.spill = Some(Spill {
                file,
                read_at: 0,
                write_at: 0,
            });
        }
        let spill = self.spill.as_mut().expect("opened above");
        spill.file.write_all_at(bytes, spill.write_at)?;
        spill.write_at += bytes.len() as u64;
        Ok(())
    }

    /// Up to `max` bytes of the oldest output (at least one character; whole lines
    /// where they fit), or `None` when there is nothing to take. A run of dropped output
    /// comes as the line that says so, in its place.
    pub(crate) fn take(&mut self, max: usize) -> Option<String> {
        if let Some(gap) = self.gaps.front()
            && gap.start <= self.taken
        {
            // The marker takes the place of the output it stands for.
            let gap = self.gaps.pop_front().expect("looked at above");
            self.taken += gap.bytes;
            return Some(format!(
                "tacc: {} bytes of this task's output were dropped: {}\n",
                gap.bytes, gap.why
            ));
        }
        // Never past the next run of dropped output: its marker comes first.
        let max = match self.gaps.front() {
            Some(gap) => max.min(usize::try_from(gap.start - self.taken).unwrap_or(usize::MAX)),
            None => max,
        };
        if !self.memory.is_empty() {
            let mut out = String::new();
            while let Some(front) = self.memory.front_mut() {
                let room = max - out.len();
                if front.len() <= room {
                    out.push_str(front);
                    self.memory.pop_front();
                } else if out.is_empty() {
                    // One piece larger than asked for: its head, on a character boundary.
                    let mut cut = room;
                    while !front.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    if cut == 0 {
                        cut = front.chars().next().map_or(front.len(), char::len_utf8);
                    }
                    let rest = front.split_off(cut);
                    out = std::mem::replace(front, rest);
                    break;
                } else {
                    break;
                }
            }
            self.memory_bytes -= out.len();
            self.taken += out.len() as u64;
            return Some(out);
        }
        let spill = self.spill.as_mut()?;
        let unread = spill.write_at - spill.read_at;
        let mut buffer = vec![0u8; unread.min(max as u64) as usize];
        if let Err(e) = spill.file.read_exact_at(&mut buffer, spill.read_at) {
            // The file went wrong under us: what it held is gone, and the log says so.
            let lost = unread;
            self.spill = None;
            let _ = std::fs::remove_file(&self.path);
            self.taken += lost;
            return Some(format!(
                "tacc: {lost} bytes of this task's output were lost: cannot read them back \
                 from {}: {e}\n",
                self.path.display()
            ));
        }
        // Whole characters (the output went in as text: only the end of what was read
        // can be a character cut short), and whole lines where they fit.
        let mut cut = buffer.len();
        if let Err(e) = std::str::from_utf8(&buffer) {
            if e.error_len().is_none() && e.valid_up_to() > 0 {
                cut = e.valid_up_to();
            }
        }
        if (buffer.len() as u64) < unread {
            // `str::rfind` searches with the standard library's optimised memrchr; a
            // byte-by-byte search from the end was a twentieth of the agent's time
            // reading back a task's long lines (debug build).
            let newline = match std::str::from_utf8(&buffer[..cut]) {
                Ok(text) => text.rfind('\n'),
                Err(_) => buffer[..cut].iter().rposition(|b| *b == b'\n'),
            };
            if let Some(newline) = newline {
                cut = newline + 1;
            }
        }
        buffer.truncate(cut);
        spill.read_at += cut as u64;
        if spill.read_at == spill.write_at {
            // Drained: later output goes to memory again.
            self.spill = None;
            let _ = std::fs::remove_file(&self.path);
        }
        self.taken += cut as u64;
        Some(
            String::from_utf8(buffer)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        )
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if self.spill.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_memory_bound_spills_and_comes_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let mut spool = Spool::new(path.clone());
        let lines: Vec<String> = (0..200_000)
            .map(|i| format!("line {i:>8} {}\n", "x".repeat(i % 50)))
            .collect();
        let total: usize = lines.iter().map(String::len).sum();
        assert!(total > 3 * MEMORY_BYTES, "the test must spill");
        let mut out = String::new();
        for (i, line) in lines.iter().enumerate() {
            spool.append(line.clone());
            // Take a little now and then, as a slow server would.
            if i % 1000 == 0 {
                out.push_str(&spool.take(300).unwrap());
            }
        }
        assert!(spool.spilling() && path.exists());
        assert!(spool.memory_bytes <= MEMORY_BYTES);
        while let Some(chunk) = spool.take(64 << 10) {
            out.push_str(&chunk);
        }
        assert_eq!(out, lines.concat());
        assert!(spool.is_empty() && !path.exists());
        assert_eq!(spool.taken(), total as u64);
        // Drained, it holds output in memory again.
        spool.append("after\n".into());
        assert!(!spool.spilling());
        assert_eq!(spool.take(100).as_deref(), Some("after\n"));
    }

    #[test]
    fn spilled_output_comes_back_in_whole_lines_and_whole_characters() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(dir.path().join("spool"));
        spool.append("a".repeat(MEMORY_BYTES));
        // Lines of at most 86 bytes, with two-byte characters.
        let lines: Vec<String> = (0..2000)
            .map(|i| format!("é{i} {}\n", "ü".repeat(i % 40)))
            .collect();
        for line in &lines {
            spool.append(line.clone());
        }
        let long = format!("{}\n", "ü".repeat(1000));
        spool.append(long.clone());
        assert!(spool.spilling());
        assert_eq!(spool.take(MEMORY_BYTES).unwrap().len(), MEMORY_BYTES);
        let mut out = String::new();
        while out.len() < lines.concat().len() {
            // A take of 101 bytes holds at least one whole line, and ends with one.
            let chunk = spool.take(101).unwrap();
            assert!(chunk.ends_with('\n'), "{chunk:?}");
            out.push_str(&chunk);
        }
        assert_eq!(out, lines.concat());
        // A line longer than a take comes back a whole character short of the limit.
        let mut rest = String::new();
        while let Some(chunk) = spool.take(101) {
            assert!(chunk.len() == 100 || rest.len() + chunk.len() == long.len());
            rest.push_str(&chunk);
        }
        assert_eq!(rest, long);
    }

    #[test]
    fn output_kept_after_a_drop_comes_after_the_marker() {
        let mut spool = Spool::new("/nonexistent/dir/spool".into());
        spool.append("a".repeat(MEMORY_BYTES - 10));
        spool.append("b".repeat(20));
        // Memory has room again once some is taken; what comes then follows the marker.
        assert_eq!(spool.take(100).unwrap(), "a".repeat(100));
        spool.append("later\n".into());
        let mut out = String::new();
        while let Some(chunk) = spool.take(1 << 20) {
            out.push_str(&chunk);
        }
        let marker_at = out
            .find("tacc: 20 bytes")
            .unwrap_or_else(|| panic!("no marker: {}", &out[out.len() - 300..]));
        assert_eq!(out[..marker_at], "a".repeat(MEMORY_BYTES - 110));
        assert!(out.ends_with("\nlater\n"), "{}", &out[out.len() - 300..]);
        assert_eq!(spool.taken(), spool.appended());
        assert!(spool.is_empty());
    }

    #[test]
    fn output_that_cannot_be_spilled_is_dropped_with_a_marker_in_its_place() {
        let mut spool = Spool::new("/nonexistent/dir/spool".into());
        spool.append("a".repeat(MEMORY_BYTES));
        spool.append("lost\n".into());
        spool.append("lost too\n".into());
        assert_eq!(spool.take(MEMORY_BYTES).unwrap().len(), MEMORY_BYTES);
        let marker = spool.take(1000).unwrap();
        assert!(
            marker.contains("14 bytes of this task's output were dropped"),
            "{marker}"
        );
        assert!(spool.is_empty());
    }
}
