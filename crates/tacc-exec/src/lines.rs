//! Cuts a byte stream of task output into [`OutputLine`]s with a bounded buffer: a line
//! longer than [`MAX_LINE_BYTES`] leaves as several pieces, all but the last marked
//! [`OutputLine::partial`], so a task that prints one endless line costs the agent at
//! most one piece of memory per stream, never the whole line. Pieces are cut on UTF-8
//! character boundaries, so no character is mangled by the cut.

use crate::{OutputLine, OutputSender, Stream};

/// The longest piece of one line forwarded at once (bytes, before the newline).
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// The unfinished line of one stream.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    stream: Stream,
    pending: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn new(stream: Stream) -> Self {
        LineSplitter {
            stream,
            pending: Vec::new(),
        }
    }

    /// Take `bytes`, sending every finished line and every full piece of a long one
    /// (waiting while `output` is full); false once nobody listens any more.
    pub(crate) async fn push(&mut self, mut bytes: &[u8], output: &OutputSender) -> bool {
        while !bytes.is_empty() {
            let room = MAX_LINE_BYTES - self.pending.len();
            let window = &bytes[..bytes.len().min(room)];
            if let Some(newline) = window.iter().position(|b| *b == b'\n') {
                self.pending.extend_from_slice(&window[..newline]);
                bytes = &bytes[newline + 1..];
                if !self.send(false, output).await {
                    return false;
                }
                continue;
            }
            self.pending.extend_from_slice(window);
            bytes = &bytes[window.len()..];
            if self.pending.len() >= MAX_LINE_BYTES && !self.send(true, output).await {
                return false;
            }
        }
        true
    }

    /// The stream ended: what is left is the last line, without its newline.
    pub(crate) async fn finish(&mut self, output: &OutputSender) {
        if !self.pending.is_empty() {
            self.send(false, output).await;
        }
    }

    /// Bytes taken but not sent yet (the start of an unfinished line).
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    async fn send(&mut self, partial: bool, output: &OutputSender) -> bool {
        // A piece ends before a character the cut would split; its first bytes open the
        // next piece.
        let cut = if partial {
            match std::str::from_utf8(&self.pending) {
                Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
                _ => self.pending.len(),
            }
        } else {
            self.pending.len()
        };
        let text = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        output
            .send(OutputLine {
                stream: self.stream,
                text,
                partial,
            })
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<OutputLine> {
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (tx, mut rx) = crate::output_channel();
            let splitting = tokio::spawn(async move {
                let mut splitter = LineSplitter::new(Stream::Stdout);
                for chunk in &chunks {
                    assert!(splitter.push(chunk, &tx).await);
                }
                splitter.finish(&tx).await;
            });
            let mut lines = Vec::new();
            while let Some(line) = rx.recv().await {
                lines.push(line);
            }
            splitting.await.unwrap();
            lines
        })
    }

    #[test]
    fn lines_across_chunks_are_joined_and_the_last_one_kept() {
        let lines = split(&[b"a\nb", b"c\n", b"tail"]);
        let texts: Vec<(&str, bool)> = lines.iter().map(|l| (l.text.as_str(), l.partial)).collect();
        assert_eq!(texts, [("a", false), ("bc", false), ("tail", false)]);
    }

    #[test]
    fn a_line_longer_than_the_bound_leaves_in_pieces_that_rejoin_exactly() {
        // Multi-byte characters, so a cut at the bound would fall inside one.
        let line = "é".repeat(MAX_LINE_BYTES) + "end";
        let bytes = format!("{line}\nnext\n");
        let lines = split(&[bytes.as_bytes()]);
        assert!(lines.len() > 2, "{}", lines.len());
        let (last_piece, rest) = lines.split_at(lines.len() - 1);
        assert_eq!(rest[0].text, "next");
        assert!(!last_piece.last().unwrap().partial);
        assert!(last_piece[..last_piece.len() - 1].iter().all(|l| l.partial));
        assert!(last_piece.iter().all(|l| l.text.len() <= MAX_LINE_BYTES));
        let joined: String = last_piece.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(joined, line);
    }
}
