//! How a queued task's start estimate reads for people: the one wording that `tcloud why`
//! and the dashboard's task page both show, from the wire form of `why`
//! ([`TaskExplanation`]). It lives here, beside the types it reads, because these are the
//! only crates both the server and the CLI depend on. Each place says instants its own way
//! (an RFC 3339 time in a terminal, a clock and a relative time on a web page): it passes
//! [`Instants`]; everything else is worded here once.

use tacc_core::{TaskId, Timestamp, labels};

use crate::{LatestStartView, NodesWhatIf, ShapeWhatIf, TaskExplanation};

/// How one place writes instants.
pub trait Instants {
    /// The moment the estimate is read at.
    fn now(&self) -> Timestamp;
    /// An instant a second or more ahead of now: "in 5m (2026-11-27T12:40:00Z)".
    fn ahead(&self, at: Timestamp) -> String;
    /// An instant as a time of day with its date: "2026-11-27T12:40:00Z".
    fn clock(&self, at: Timestamp) -> String;
}

/// A start estimate as sentences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstimateText {
    /// "now", or "no earlier than now, no later than in 10m (…)".
    pub range: String,
    /// What it rests on: the ends it waits for, the limits that hold it.
    pub rests_on: Vec<String>,
    /// What-ifs: "with 2 GPU(s) per node: now (sooner)".
    pub what_ifs: Vec<String>,
    /// "likely in 20m (…): task 41 usually runs 20m (median of …)", where the history
    /// of the tasks ahead gives one.
    pub likely: Option<String>,
}

/// "now" for an instant reached or less than a second away (the estimate's "now" was
/// taken a moment before or after the reader's), else [`Instants::ahead`].
fn when(at: Timestamp, instants: &dyn Instants) -> String {
    if at.millis_since(instants.now()) < 1_000 {
        "now".into()
    } else {
        instants.ahead(at)
    }
}

fn latest_text(latest: &LatestStartView, instants: &dyn Instants) -> String {
    match latest {
        LatestStartView::At { at } => when(*at, instants),
        LatestStartView::Unknown { .. } => "unknown".into(),
        LatestStartView::BeyondHorizon { after } => {
            format!("later than {}", when(*after, instants))
        }
    }
}

fn sooner(sooner: bool) -> &'static str {
    if sooner { " (sooner)" } else { " (no sooner)" }
}

fn fewer_gpus_text(what_if: &ShapeWhatIf, instants: &dyn Instants) -> String {
    format!(
        "with {} GPU(s) per node: {}{}",
        what_if.gpus_per_node,
        latest_text(&what_if.latest, instants),
        sooner(what_if.sooner)
    )
}

fn other_nodes_text(what_if: &NodesWhatIf, instants: &dyn Instants) -> String {
    let nodes = if what_if.label == labels::SLURM_PARTITION {
        format!("in partition {}", what_if.value)
    } else {
        format!("on nodes labelled {}={}", what_if.label, what_if.value)
    };
    format!(
        "{nodes}: {}{}",
        latest_text(&what_if.latest, instants),
        sooner(what_if.sooner)
    )
}

fn end_text(task: TaskId, at: Timestamp, instants: &dyn Instants) -> String {
    format!(
        "starts when task {task} ends (time limit {})",
        instants.clock(at)
    )
}

/// The start estimate of `why`, worded; `None` when it has none (not queued, or no node
/// can run it yet).
pub fn estimate_text(why: &TaskExplanation, instants: &dyn Instants) -> Option<EstimateText> {
    let estimate = why.start_estimate.as_ref()?;
    let earliest = when(estimate.earliest, instants);
    let latest = latest_text(&estimate.latest, instants);
    let range = if earliest == latest {
        latest
    } else {
        format!("no earlier than {earliest}, no later than {latest}")
    };
    let mut rests_on: Vec<String> = estimate
        .after
        .iter()
        .map(|end| end_text(end.task, end.at, instants))
        .collect();
    rests_on.extend(estimate.basis.iter().cloned());
    let mut what_ifs: Vec<String> = why
        .fewer_gpus
        .iter()
        .map(|what_if| fewer_gpus_text(what_if, instants))
        .collect();
    what_ifs.extend(
        why.other_nodes
            .iter()
            .map(|what_if| other_nodes_text(what_if, instants)),
    );
    let likely = estimate.likely.as_ref().map(|likely| {
        format!(
            "likely {}: {}",
            when(likely.at, instants),
            likely.because.join("; ")
        )
    });
    Some(EstimateText {
        range,
        rests_on,
        what_ifs,
        likely,
    })
}

#[cfg(test)]
mod tests {
    use tacc_core::TaskState;

    use super::*;
    use crate::{StartEstimateView, TaskEndView};

    struct Plain(Timestamp);

    impl Instants for Plain {
        fn now(&self) -> Timestamp {
            self.0
        }
        fn ahead(&self, at: Timestamp) -> String {
            format!("in {}s", at.millis_since(self.0) / 1000)
        }
        fn clock(&self, at: Timestamp) -> String {
            format!("@{}", at.as_millis() / 1000)
        }
    }

    fn why(latest: Timestamp) -> TaskExplanation {
        TaskExplanation {
            task_id: TaskId(42),
            state: TaskState::Queued,
            reason: None,
            queue_position: Some(0),
            estimated_start: Some(latest),
            start_estimate: Some(StartEstimateView {
                earliest: Timestamp::from_secs(100),
                latest: LatestStartView::At { at: latest },
                after: vec![TaskEndView {
                    task: TaskId(41),
                    at: latest,
                }],
                basis: vec!["bob may run 1 task at a time".into()],
                likely: None,
            }),
            fewer_gpus: Some(ShapeWhatIf {
                gpus_per_node: 2,
                latest: LatestStartView::At {
                    at: Timestamp::from_secs(100),
                },
                sooner: true,
            }),
            other_nodes: vec![
                NodesWhatIf {
                    label: labels::SLURM_PARTITION.into(),
                    value: "long".into(),
                    latest: LatestStartView::BeyondHorizon { after: latest },
                    sooner: false,
                },
                NodesWhatIf {
                    label: "pool".into(),
                    value: "b".into(),
                    latest: LatestStartView::Unknown {
                        no_time_limit: vec![],
                    },
                    sooner: false,
                },
            ],
            policy: "fairshare".into(),
            details: vec![],
            adaptive: None,
        }
    }

    #[test]
    fn an_estimate_reads_as_a_range_what_it_rests_on_and_the_what_ifs() {
        let text = estimate_text(
            &why(Timestamp::from_secs(700)),
            &Plain(Timestamp::from_secs(100)),
        )
        .unwrap();
        assert_eq!(text.range, "no earlier than now, no later than in 600s");
        assert_eq!(
            text.rests_on,
            [
                "starts when task 41 ends (time limit @700)",
                "bob may run 1 task at a time"
            ]
        );
        assert_eq!(
            text.what_ifs,
            [
                "with 2 GPU(s) per node: now (sooner)",
                "in partition long: later than in 600s (no sooner)",
                "on nodes labelled pool=b: unknown (no sooner)",
            ]
        );
    }

    #[test]
    fn a_start_less_than_a_second_away_is_now_and_the_range_collapses() {
        // The reader's clock a moment behind the server's.
        let text =
            estimate_text(&why(Timestamp::from_secs(100)), &Plain(Timestamp(99_500))).unwrap();
        assert_eq!(text.range, "now");
    }

    #[test]
    fn a_likelier_start_says_the_history_it_rests_on() {
        let mut why = why(Timestamp::from_secs(700));
        if let Some(estimate) = why.start_estimate.as_mut() {
            estimate.likely = Some(crate::LikelyStartView {
                at: Timestamp::from_secs(160),
                because: vec!["task 41 usually runs 1m (median of bob's last 5 runs of x)".into()],
            });
        }
        let text = estimate_text(&why, &Plain(Timestamp::from_secs(100))).unwrap();
        assert_eq!(
            text.likely.as_deref(),
            Some("likely in 60s: task 41 usually runs 1m (median of bob's last 5 runs of x)")
        );
    }
}
