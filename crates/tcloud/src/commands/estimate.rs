//! `tcloud why`'s start estimate: the range the scheduler's projection gives, what it
//! rests on, and the fewer-GPUs what-if.

use tacc_core::Timestamp;
use tacc_proto::{LatestStartView, ShapeWhatIf, StartEstimateView};

use super::usage::utc;
use crate::format::short_duration;
use crate::sanitize::field;

/// "now" for a time reached or less than a second away (the server's clock and this
/// machine's may differ a little), else "in 5m (2026-11-27T12:40:00Z)".
fn when(at: Timestamp, now: Timestamp) -> String {
    if at.millis_since(now) < 1_000 {
        "now".into()
    } else {
        format!("in {} ({})", short_duration(at.millis_since(now)), utc(at))
    }
}

fn latest_text(latest: &LatestStartView, now: Timestamp) -> String {
    match latest {
        LatestStartView::At { at } => when(*at, now),
        LatestStartView::Unknown { .. } => "unknown".into(),
        LatestStartView::BeyondHorizon { after } => format!("later than {}", when(*after, now)),
    }
}

/// The estimate as lines: the range first, then what it rests on, then the what-if.
pub(super) fn lines(
    estimate: &StartEstimateView,
    fewer_gpus: Option<&ShapeWhatIf>,
    now: Timestamp,
) -> Vec<String> {
    let earliest = when(estimate.earliest, now);
    let latest = latest_text(&estimate.latest, now);
    let mut lines = vec![if earliest == latest {
        format!("estimated start: {latest}")
    } else {
        format!("estimated start: no earlier than {earliest}, no later than {latest}")
    }];
    let mut basis: Vec<String> = estimate
        .after
        .iter()
        .map(|end| {
            format!(
                "starts when task {} ends (time limit {})",
                end.task,
                utc(end.at)
            )
        })
        .collect();
    basis.extend(estimate.basis.iter().map(|b| field(b)));
    if !basis.is_empty() {
        lines.push(format!("  rests on: {}", basis.join("; ")));
    }
    if let Some(what_if) = fewer_gpus {
        lines.push(format!(
            "  with {} GPU(s) per node: {}{}",
            what_if.gpus_per_node,
            latest_text(&what_if.latest, now),
            if what_if.sooner {
                " (sooner)"
            } else {
                " (no sooner)"
            }
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use tacc_core::TaskId;
    use tacc_proto::TaskEndView;

    use super::*;

    #[test]
    fn a_range_says_what_it_rests_on_and_the_what_if() {
        let now = Timestamp::from_secs(1_700_000_000);
        let end = Timestamp::from_secs(1_700_000_600);
        // The server's "now" may be a moment ahead of this machine's clock.
        let estimate = StartEstimateView {
            earliest: Timestamp(now.0 + 300),
            latest: LatestStartView::At { at: end },
            after: vec![TaskEndView {
                task: TaskId(41),
                at: end,
            }],
            basis: vec!["bob may run 1 task at a time".into()],
        };
        let what_if = ShapeWhatIf {
            gpus_per_node: 2,
            latest: LatestStartView::At { at: now },
            sooner: true,
        };
        let lines = lines(&estimate, Some(&what_if), now);
        assert_eq!(
            lines,
            vec![
                "estimated start: no earlier than now, no later than in 10m (2023-11-14T22:23:20Z)"
                    .to_string(),
                "  rests on: starts when task 41 ends (time limit 2023-11-14T22:23:20Z); bob may run 1 task at a time"
                    .to_string(),
                "  with 2 GPU(s) per node: now (sooner)".to_string(),
            ]
        );
    }
}
