//! A queued task's start estimate on the task page: the range, what it rests on, and the
//! what-ifs (fewer GPUs, other nodes). The words are `tacc_proto::estimate_text`'s,
//! shared with `tcloud why`; this file only says instants as the dashboard does (a
//! relative time with its clock) and lays the lines out.

use tacc_core::Timestamp;
use tacc_proto::TaskExplanation;
use tacc_proto::estimate_text::{Instants, estimate_text};

use super::render::{clock, relative};

/// Instants as the dashboard shows them: "in 5 min (2026-… UTC)".
struct Page(Timestamp);

impl Instants for Page {
    fn now(&self) -> Timestamp {
        self.0
    }
    fn ahead(&self, at: Timestamp) -> String {
        format!("{} ({})", relative(at, self.0), clock(at))
    }
    fn clock(&self, at: Timestamp) -> String {
        clock(at)
    }
}

/// The lines of the estimate, first the range; none when it has no estimate.
pub(super) fn lines(why: &TaskExplanation, now: Timestamp) -> Option<Vec<String>> {
    let text = estimate_text(why, &Page(now))?;
    let mut lines = vec![format!("Starts {}", text.range)];
    lines.extend(text.likely);
    lines.extend(text.rests_on);
    lines.extend(text.what_ifs);
    Some(lines)
}
