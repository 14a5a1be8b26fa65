//! Terminal safety: text that comes from a task or from another user (log output, task
//! names, reasons, node names, dataset sources, server error messages) is printed only
//! after its control characters have been made visible.
//!
//! A terminal acts on control characters: ESC starts CSI/OSC/DCS sequences that can set the
//! window title, clear the screen, move the cursor, or write the clipboard (OSC 52); `\r`
//! and backspace overwrite what was already printed; the 8-bit C1 controls (U+0080–U+009F,
//! e.g. U+009B, a one-character CSI) do the same on terminals that honour them. Every such
//! character is replaced by a visible form, so the sequence is shown, not executed:
//!
//! - C0 controls (U+0000–U+001F) other than `\n` and `\t`, and DEL: caret notation, as
//!   `cat -v` writes them (`ESC` → `^[`, `\r` → `^M`, DEL → `^?`);
//! - C1 controls: `<U+009B>`;
//! - Unicode bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069), which
//!   reorder what is displayed (the "Trojan Source" trick): `<U+202E>`;
//! - bytes that are not valid UTF-8 (a stray `0x9b` is CSI to an 8-bit terminal): `<0x9B>`.
//!
//! [`text`] keeps `\n` and `\t` (multi-line text: logs, explanations); [`field`] makes
//! them visible too, for values printed on one line or in a table cell, where a newline
//! could forge a row. [`LogSanitizer`] does the same for a byte stream cut into arbitrary
//! chunks, holding back a UTF-8 sequence split across two chunks.

use std::borrow::Cow;
use std::fmt::Write;

/// Is `c` shown as is in multi-line text?
fn is_safe(c: char, keep_layout: bool) -> bool {
    match c {
        '\n' | '\t' => keep_layout,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => false,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => false,
        _ => true,
    }
}

/// Appends the visible form of an unsafe character.
fn push_visible(out: &mut String, c: char) {
    match c {
        '\u{0}'..='\u{1f}' => {
            out.push('^');
            out.push(char::from(c as u8 + 0x40));
        }
        '\u{7f}' => out.push_str("^?"),
        _ => {
            let _ = write!(out, "<U+{:04X}>", c as u32);
        }
    }
}

fn clean(input: &str, keep_layout: bool) -> Cow<'_, str> {
    if input.chars().all(|c| is_safe(c, keep_layout)) {
        return Cow::Borrowed(input);
    }
    let mut out = String::with_capacity(input.len() + 16);
    for c in input.chars() {
        if is_safe(c, keep_layout) {
            out.push(c);
        } else {
            push_visible(&mut out, c);
        }
    }
    Cow::Owned(out)
}

/// Multi-line text: every control character made visible except `\n` and `\t`.
pub fn text(input: &str) -> Cow<'_, str> {
    clean(input, true)
}

/// A value shown on one line or in a table cell: `\n` and `\t` are made visible as well.
pub fn field(input: &str) -> String {
    clean(input, false).into_owned()
}

/// [`field`] of an optional value, empty when absent.
pub fn opt_field(input: Option<&str>) -> String {
    input.map(field).unwrap_or_default()
}

/// Makes a byte stream safe to print, chunk by chunk. The output of a stream does not
/// depend on where it was cut: a UTF-8 sequence split across chunks is held back until
/// its end arrives (or until [`LogSanitizer::finish`]).
#[derive(Debug, Default)]
pub struct LogSanitizer {
    /// The start of a UTF-8 sequence that the last chunk ended in (at most 3 bytes).
    pending: Vec<u8>,
}

impl LogSanitizer {
    pub fn new() -> Self {
        LogSanitizer::default()
    }

    /// The printable form of `chunk`, given everything pushed before it.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(chunk);
        let mut out = String::with_capacity(input.len() + 16);
        let mut rest: &[u8] = &input;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(&text(valid));
                    break;
                }
                Err(error) => {
                    let (valid, after) = rest.split_at(error.valid_up_to());
                    // `valid` is UTF-8 by construction.
                    out.push_str(&text(std::str::from_utf8(valid).unwrap_or_default()));
                    match error.error_len() {
                        Some(len) => {
                            for byte in &after[..len] {
                                let _ = write!(out, "<0x{byte:02X}>");
                            }
                            rest = &after[len..];
                        }
                        None => {
                            // The chunk ends inside a sequence that may still complete.
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// The rest of the stream: a sequence that never completed is shown byte by byte.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        for byte in std::mem::take(&mut self.pending) {
            let _ = write!(out, "<0x{byte:02X}>");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// All of `bytes` at once (a log that was read whole).
    fn bytes(bytes: &[u8]) -> String {
        let mut sanitizer = LogSanitizer::new();
        let mut out = sanitizer.push(bytes);
        out.push_str(&sanitizer.finish());
        out
    }

    /// The property every sanitised output must have.
    fn assert_inert(out: &str, keep_layout: bool) {
        for c in out.chars() {
            let allowed_control = keep_layout && (c == '\n' || c == '\t');
            assert!(
                allowed_control || !(c < ' ' || ('\u{7f}'..='\u{9f}').contains(&c)),
                "{c:?} survived in {out:?}"
            );
            assert!(
                !('\u{202a}'..='\u{202e}').contains(&c) && !('\u{2066}'..='\u{2069}').contains(&c),
                "{c:?} survived in {out:?}"
            );
        }
        for byte in out.bytes() {
            let allowed = keep_layout && (byte == b'\n' || byte == b'\t');
            assert!(
                allowed || (byte >= 0x20 && byte != 0x7f),
                "byte {byte:#x} in {out:?}"
            );
        }
    }

    #[test]
    fn plain_text_is_untouched_and_not_copied() {
        let input = "epoch 1\tloss 0.69\nnaïve — 日本語 ✓\n";
        assert!(matches!(text(input), Cow::Borrowed(s) if s == input));
        assert_eq!(field("train-resnet_50"), "train-resnet_50");
    }

    #[test]
    fn escape_sequences_are_shown_not_executed() {
        // Window title (OSC 0), clipboard write (OSC 52), screen clear, cursor movement.
        assert_eq!(text("\x1b]0;pwned\x07hi"), "^[]0;pwned^Ghi", "window title");
        assert_eq!(
            text("\x1b]52;c;cm0gLXJmIH4=\x1b\\"),
            "^[]52;c;cm0gLXJmIH4=^[\\"
        );
        assert_eq!(text("\x1b[2J\x1b[H"), "^[[2J^[[H");
        assert_eq!(text("\x1bP1$r\x1b\\"), "^[P1$r^[\\", "DCS");
        assert_eq!(text("ok\rFAKE"), "ok^MFAKE", "carriage return overwrite");
        assert_eq!(text("abc\x08\x08x"), "abc^H^Hx");
        assert_eq!(text("\x7f\0"), "^?^@");
        // C1 controls: U+009B is a one-character CSI, U+009D an OSC.
        assert_eq!(text("\u{9b}31mred"), "<U+009B>31mred");
        assert_eq!(text("\u{9d}0;t\u{9c}"), "<U+009D>0;t<U+009C>");
        assert_eq!(text("a\u{202e}gnp.exe"), "a<U+202E>gnp.exe");
    }

    #[test]
    fn fields_also_show_newlines_and_tabs() {
        assert_eq!(
            field("oom\n12  bob  running"),
            "oom^J12  bob  running",
            "a newline cannot forge a table row"
        );
        assert_eq!(field("a\tb"), "a^Ib");
        assert_eq!(text("a\tb\n"), "a\tb\n");
        assert_eq!(opt_field(None), "");
        assert_eq!(opt_field(Some("\x1b")), "^[");
    }

    #[test]
    fn invalid_utf8_is_shown_byte_by_byte() {
        // A raw 0x9b byte is CSI to an 8-bit terminal.
        assert_eq!(bytes(b"a\x9b31mb"), "a<0x9B>31mb");
        assert_eq!(bytes(b"\xff\xfe"), "<0xFF><0xFE>");
        assert_eq!(bytes(b"end\xe6\x97"), "end<0xE6><0x97>");
    }

    #[test]
    fn a_sequence_split_across_chunks_is_neither_lost_nor_let_through() {
        let mut s = LogSanitizer::new();
        let whole = "日".as_bytes();
        assert_eq!(s.push(&whole[..1]), "");
        assert_eq!(s.push(&whole[1..2]), "");
        assert_eq!(s.push(&whole[2..]), "日");
        // C1 CSI encoded in UTF-8 (0xC2 0x9B), split between chunks.
        assert_eq!(s.push(b"x\xc2"), "x");
        assert_eq!(s.push(b"\x9b2J"), "<U+009B>2J");
        // ESC at the end of one chunk, the rest of the sequence in the next.
        assert_eq!(s.push(b"\x1b"), "^[");
        assert_eq!(s.push(b"[2J"), "[2J");
        assert_eq!(s.finish(), "");
    }

    proptest! {
        #[test]
        fn sanitised_text_and_fields_are_inert(input in any::<String>()) {
            assert_inert(&text(&input), true);
            assert_inert(&field(&input), false);
        }

        #[test]
        fn sanitised_streams_are_inert_and_independent_of_chunking(
            input in proptest::collection::vec(
                prop_oneof![
                    any::<u8>(),
                    Just(0x1b),
                    Just(0x9b),
                    Just(0xc2),
                    Just(b'\r'),
                ],
                0..256,
            ),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let whole = bytes(&input);
            assert_inert(&whole, true);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
            points.sort_unstable();
            let mut sanitizer = LogSanitizer::new();
            let mut streamed = String::new();
            let mut start = 0;
            for point in points {
                let chunk = sanitizer.push(&input[start..point]);
                assert_inert(&chunk, true);
                streamed.push_str(&chunk);
                start = point;
            }
            streamed.push_str(&sanitizer.push(&input[start..]));
            streamed.push_str(&sanitizer.finish());
            prop_assert_eq!(streamed, whole);
        }

        #[test]
        fn safe_text_is_kept_exactly(input in "[a-zA-Z0-9 .,:;/_=+\\-\\n\\t\u{e9}\u{65e5}]{0,64}") {
            let cleaned = text(&input);
            prop_assert_eq!(cleaned.as_ref(), input.as_str());
        }
    }
}
