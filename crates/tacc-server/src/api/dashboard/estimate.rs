//! A queued task's start estimate on the task page: the range, what it rests on, and the
//! fewer-GPUs what-if, as sentences (from the typed `StartEstimateView` of `why`).

use tacc_core::Timestamp;
use tacc_proto::{LatestStartView, ShapeWhatIf, StartEstimateView};

use super::render::{clock, relative};

/// "in 5 min (2026-… UTC)", or "now" for a time reached or less than a second away (the
/// estimate's "now" was taken a moment after the page's).
fn when(at: Timestamp, now: Timestamp) -> String {
    if at.millis_since(now) < 1_000 {
        "now".into()
    } else {
        format!("{} ({})", relative(at, now), clock(at))
    }
}

fn latest_text(latest: &LatestStartView, now: Timestamp) -> String {
    match latest {
        LatestStartView::At { at } => when(*at, now),
        LatestStartView::Unknown { .. } => "unknown".into(),
        LatestStartView::BeyondHorizon { after } => {
            format!("later than {}", when(*after, now))
        }
    }
}

/// The lines of the estimate, first the range.
pub(super) fn lines(
    estimate: &StartEstimateView,
    fewer_gpus: Option<&ShapeWhatIf>,
    now: Timestamp,
) -> Vec<String> {
    let earliest = when(estimate.earliest, now);
    let latest = latest_text(&estimate.latest, now);
    let mut lines = vec![if earliest == latest {
        format!("Starts {latest}")
    } else {
        format!("Starts no earlier than {earliest}, no later than {latest}")
    }];
    for end in &estimate.after {
        lines.push(format!(
            "when task {} ends at its time limit ({})",
            end.task,
            clock(end.at)
        ));
    }
    lines.extend(estimate.basis.iter().cloned());
    if let Some(what_if) = fewer_gpus {
        lines.push(format!(
            "with {} GPU(s) per node it would start {}{}",
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
