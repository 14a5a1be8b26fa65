//! `tcloud why`'s start estimate: the range the scheduler's projection gives, what it
//! rests on, and the what-ifs (fewer GPUs, other nodes), laid out for a terminal. The
//! words are `tacc_proto::estimate_text`'s, shared with the dashboard; this file only
//! says instants as a terminal does and lays the lines out.

use tacc_core::Timestamp;
use tacc_proto::TaskExplanation;
use tacc_proto::estimate_text::{Instants, estimate_text};

use super::usage::utc;
use crate::format::short_duration;
use crate::sanitize::field;

/// Instants as `tcloud` prints them: "in 5m (2026-11-27T12:40:00Z)".
struct Terminal(Timestamp);

impl Instants for Terminal {
    fn now(&self) -> Timestamp {
        self.0
    }
    fn ahead(&self, at: Timestamp) -> String {
        format!(
            "in {} ({})",
            short_duration(at.millis_since(self.0)),
            utc(at)
        )
    }
    fn clock(&self, at: Timestamp) -> String {
        utc(at)
    }
}

/// The estimate of `why` as lines: the range first, then what it rests on, then the
/// what-ifs; none when it has no estimate. Every line passes the terminal sanitiser: the
/// basis and label values come from the server.
pub(super) fn lines(why: &TaskExplanation, now: Timestamp) -> Vec<String> {
    let Some(text) = estimate_text(why, &Terminal(now)) else {
        return Vec::new();
    };
    let mut lines = vec![format!("estimated start: {}", text.range)];
    if let Some(likely) = &text.likely {
        lines.push(format!("  {likely}"));
    }
    if !text.rests_on.is_empty() {
        lines.push(format!("  rests on: {}", text.rests_on.join("; ")));
    }
    lines.extend(text.what_ifs.iter().map(|w| format!("  {w}")));
    lines.into_iter().map(|line| field(&line)).collect()
}

#[cfg(test)]
mod tests {
    use tacc_core::{TaskId, TaskState};
    use tacc_proto::{LatestStartView, NodesWhatIf, ShapeWhatIf, StartEstimateView, TaskEndView};

    use super::*;

    #[test]
    fn a_range_says_what_it_rests_on_and_the_what_ifs() {
        let now = Timestamp::from_secs(1_700_000_000);
        let end = Timestamp::from_secs(1_700_000_600);
        // The server's "now" may be a moment ahead of this machine's clock.
        let why = TaskExplanation {
            task_id: TaskId(42),
            state: TaskState::Queued,
            reason: None,
            queue_position: Some(0),
            estimated_start: Some(end),
            start_estimate: Some(StartEstimateView {
                earliest: Timestamp(now.0 + 300),
                latest: LatestStartView::At { at: end },
                after: vec![TaskEndView {
                    task: TaskId(41),
                    at: end,
                }],
                basis: vec!["bob may run 1 task at a time".into()],
                likely: None,
            }),
            fewer_gpus: Some(ShapeWhatIf {
                gpus_per_node: 2,
                latest: LatestStartView::At { at: now },
                sooner: true,
            }),
            other_nodes: vec![NodesWhatIf {
                label: "pool".into(),
                value: "b\u{1b}[2J".into(),
                latest: LatestStartView::At { at: now },
                sooner: true,
            }],
            policy: "fairshare".into(),
            details: vec![],
            adaptive: None,
        };
        let lines = lines(&why, now);
        assert_eq!(
            lines,
            vec![
                "estimated start: no earlier than now, no later than in 10m (2023-11-14T22:23:20Z)"
                    .to_string(),
                "  rests on: starts when task 41 ends (time limit 2023-11-14T22:23:20Z); bob may run 1 task at a time"
                    .to_string(),
                "  with 2 GPU(s) per node: now (sooner)".to_string(),
                format!("  on nodes labelled pool={}: now (sooner)", field("b\u{1b}[2J")),
            ]
        );
        assert!(!lines[3].contains('\u{1b}'), "{lines:?}");
    }
}
