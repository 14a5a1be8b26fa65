//! How adaptive allocation is shown to people: the classifier's verdict with its
//! evidence (`tcloud why`, `tcloud top`), the allocation in force against the request and
//! the bounds, and the recorded history of the signals (`tcloud top ID`, `tcloud show`).

use tacc_core::ByteSize;
use tacc_proto::AdaptiveView;

use crate::format::{ago, now};
use crate::sanitize::field;

/// `verdict: cpu_bound` and its evidence, then the allocation and what may move it.
pub fn verdict_lines(view: &AdaptiveView) -> Vec<String> {
    let mut lines = Vec::new();
    match &view.verdict {
        Some(verdict) => {
            lines.push(format!(
                "verdict: {} (CPU {}, memory {}; classifier {})",
                field(&verdict.bottleneck),
                field(&verdict.cpu),
                field(&verdict.memory),
                field(&view.classifier)
            ));
            for evidence in &verdict.evidence {
                lines.push(format!("  {}", field(evidence)));
            }
        }
        None => lines.push("verdict: none (the task is not running)".into()),
    }
    lines.push(allocation_line(view));
    lines
}

/// `allocation: 1.00 CPUs, 256MiB per node (asked 0.50 CPUs, 256MiB; may move 0.50–1.00 CPUs, …)`.
pub fn allocation_line(view: &AdaptiveView) -> String {
    let now = &view.allocation;
    let asked = &view.requested;
    let range = match &view.bounds {
        Some(b) => format!(
            "may move within {}–{} CPUs, {}–{} (adaptive {}, policy {})",
            cores(b.min_cpu_millis),
            cores(b.max_cpu_millis),
            ByteSize::from_bytes(b.min_memory_bytes),
            ByteSize::from_bytes(b.max_memory_bytes),
            field(&view.mode),
            field(&view.policy)
        ),
        None => format!(
            "does not move (adaptive {}; bounds come from `adaptive:` in the task file)",
            field(&view.mode)
        ),
    };
    format!(
        "allocation: {} CPUs, {} per node (asked {} CPUs, {}); {range}",
        cores(now.cpu_millis),
        ByteSize::from_bytes(now.memory_bytes),
        cores(asked.cpu_millis),
        ByteSize::from_bytes(asked.memory_bytes),
    )
}

/// `0.50`: CPUs as the classifier's evidence writes them.
fn cores(millis: u64) -> String {
    format!("{:.2}", millis as f64 / 1000.0)
}

/// The recorded signal history, newest last: one line per point.
pub fn history_lines(view: &AdaptiveView, last: usize) -> Vec<String> {
    let now = now();
    let skip = view.series.len().saturating_sub(last);
    let mut lines = vec![format!(
        "{:<10} {:>4} {:>13} {:>9} {:>17} {:>6} {:>4}  VERDICT",
        "WHEN", "TRY", "CPU/QUOTA", "THROTTLED", "MEMORY/LIMIT", "STALL", "GPU"
    )];
    for point in view.series.iter().skip(skip) {
        let opt = |v: Option<u32>, scale: f64, unit: &str| {
            v.map_or("-".to_string(), |v| {
                format!("{:.0}{unit}", f64::from(v) / scale)
            })
        };
        lines.push(format!(
            "{:<10} {:>4} {:>13} {:>9} {:>17} {:>6} {:>4}  {}",
            ago(point.at, now),
            point.attempt.to_string(),
            format!(
                "{}/{}",
                point.cpu_used_millis.map_or("-".to_string(), cores),
                cores(point.cpu_quota_millis)
            ),
            opt(point.cpu_throttled_permille, 10.0, "%"),
            format!(
                "{}/{}",
                point
                    .memory_used_bytes
                    .map_or("-".to_string(), |b| ByteSize::from_bytes(b).to_string()),
                ByteSize::from_bytes(point.memory_limit_bytes)
            ),
            opt(point.memory_pressure_permille, 10.0, "%"),
            opt(point.gpu_percent, 1.0, "%"),
            field(&point.bottleneck)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, Resources, Timestamp};
    use tacc_proto::{AdaptiveBounds, SignalPoint, VerdictView};

    fn view() -> AdaptiveView {
        AdaptiveView {
            mode: "on".into(),
            classifier: "rules".into(),
            policy: "step".into(),
            requested: Resources::new(500, 256 << 20, 0),
            allocation: Resources::new(1000, 256 << 20, 0),
            bounds: Some(AdaptiveBounds {
                min_cpu_millis: 500,
                max_cpu_millis: 1000,
                min_memory_bytes: 256 << 20,
                max_memory_bytes: 256 << 20,
            }),
            verdict: Some(VerdictView {
                at: Timestamp(1),
                bottleneck: "cpu_bound".into(),
                cpu: "short".into(),
                memory: "idle\x1b[2J".into(),
                evidence: vec!["CPU 0.98 of 1.00 cores used".into()],
            }),
            changes: Vec::new(),
            series: vec![SignalPoint {
                at: Timestamp(1),
                attempt: AttemptNo(1),
                cpu_used_millis: Some(980),
                cpu_quota_millis: 1000,
                cpu_throttled_permille: Some(420),
                memory_used_bytes: Some(1 << 20),
                memory_limit_bytes: 256 << 20,
                memory_pressure_permille: None,
                gpu_percent: None,
                bottleneck: "cpu_bound".into(),
            }],
        }
    }

    #[test]
    fn the_verdict_shows_its_evidence_and_the_range_it_moves_in() {
        let lines = verdict_lines(&view());
        assert!(
            lines[0].starts_with("verdict: cpu_bound (CPU short"),
            "{lines:?}"
        );
        assert!(
            !lines[0].contains('\x1b'),
            "task text is made safe: {lines:?}"
        );
        assert_eq!(lines[1], "  CPU 0.98 of 1.00 cores used");
        assert!(
            lines[2].contains("allocation: 1.00 CPUs, 256MiB per node (asked 0.50 CPUs"),
            "{lines:?}"
        );
        let history = history_lines(&view(), 10);
        assert!(history[1].contains("0.98/1.00"), "{history:?}");
        assert!(history[1].contains("42%"), "{history:?}");
    }
}
