//! Snapshot of the simulator report on the 1,000-job trace excerpt in tests/data: pool mode (256 GPUs)
//! for the four pool policies, node mode (32 × 8 GPUs) for fairshare and drf. Run with
//! `UPDATE_SNAPSHOTS=1` to accept a deliberate change.

use std::path::PathBuf;

use tacc_scheduler::pool::PoolPolicy;
use tacc_sim::{NodeOptions, Report, load_trace, run_nodes, run_pool};

fn excerpt() -> PathBuf {
    // Kept inside the repository (tests/data/README.md says where it comes from), so the
    // tests pass on a fresh clone with nothing beside it.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/excerpt_1000.csv")
}

/// The report without the wall time, which varies from run to run.
fn stable(report: &Report) -> serde_json::Value {
    let mut value = serde_json::to_value(report).unwrap();
    let object = value.as_object_mut().unwrap();
    object.remove("wall_time_s");
    for (_, v) in object.iter_mut() {
        if let Some(x) = v.as_f64().filter(|x| x.fract() != 0.0) {
            *v = serde_json::json!((x * 1e6).round() / 1e6);
        }
    }
    value
}

#[test]
fn excerpt_report_matches_snapshot() {
    let jobs = load_trace(&excerpt(), None).unwrap();
    assert_eq!(jobs.len(), 1000);
    let mut reports: Vec<serde_json::Value> = PoolPolicy::ALL
        .into_iter()
        .map(|policy| stable(&run_pool(&jobs, policy, 256)))
        .collect();
    for policy in ["fairshare", "drf"] {
        let mut options = NodeOptions::new(32, 8);
        options.proportional_guarantees = true;
        reports.push(stable(&run_nodes(&jobs, policy, &options).unwrap()));
    }
    let actual = serde_json::to_string_pretty(&reports).unwrap() + "\n";
    let snapshot =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/excerpt_1000.json");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&snapshot, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&snapshot).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create it)",
            snapshot.display()
        )
    });
    assert_eq!(
        actual, expected,
        "report changed; if deliberate, rerun with UPDATE_SNAPSHOTS=1"
    );
}
