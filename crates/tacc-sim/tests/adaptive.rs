//! Adaptive allocation in the simulator, end to end: on a one-node cluster an
//! input-heavy job beside an over-provisioned one finishes sooner with `--adaptive`, and
//! a job queued for CPUs starts as soon as the over-provisioned job is shrunk (exact
//! times: the replay is deterministic); with a neutral model the replay reproduces the
//! recorded plain node-mode results, adaptation on or off.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use tacc_sim::{NodeOptions, SpeedModel, TraceJob, load_trace, replay_nodes, run_compare};

/// The first id `{prefix}-N` the model puts in `class`.
fn id_in_class(model: &SpeedModel, class: &str, prefix: &str) -> String {
    let want = model.class_named(class).unwrap();
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|id| model.class_of(id) == want)
        .unwrap()
}

fn job(job_id: String, submit_s: u64, duration_s: u64) -> TraceJob {
    TraceJob {
        job_id,
        submit_s,
        duration_s,
        gpus: 1,
        vc: "vc1".into(),
    }
}

/// One node with 4 GPUs but 14 CPUs: the over-provisioned job (8 CPUs) and the
/// input-heavy one (4) leave 2, too few for the balanced job (4) submitted 10 s later.
fn scenario(model: &SpeedModel) -> (Vec<TraceJob>, NodeOptions) {
    let jobs = vec![
        job(id_in_class(model, "over_provisioned", "over"), 0, 3600),
        job(id_in_class(model, "input_heavy", "input"), 0, 3600),
        job(id_in_class(model, "balanced", "queued"), 10, 1800),
    ];
    let mut options = NodeOptions::new(1, 4);
    options.cpus_per_node = Some(14);
    options.memory_gib_per_node = Some(256);
    (jobs, options)
}

/// (start, finish) of each job in seconds, in trace order.
fn times(jobs: &[TraceJob], options: &NodeOptions, adaptive: bool) -> Vec<(f64, f64)> {
    let model = SpeedModel::default_model();
    let replay = replay_nodes(jobs, "fairshare", options, &model, adaptive).unwrap();
    assert_eq!(replay.outcomes.len(), jobs.len());
    let mut out = vec![(0.0, 0.0); jobs.len()];
    for o in &replay.outcomes {
        let finish = o.finish_ms as f64 / 1000.0;
        out[o.job] = (finish - o.held_ms as f64 / 1000.0, finish);
    }
    out
}

#[test]
fn a_starved_job_speeds_up_and_a_queued_job_starts_when_the_idle_one_shrinks() {
    let model = SpeedModel::default_model();
    let (jobs, options) = scenario(&model);
    // Static: the input-heavy job runs its trace duration; the queued job waits for the
    // first job to end.
    assert_eq!(
        times(&jobs, &options, false),
        vec![(0.0, 3600.0), (0.0, 3600.0), (3600.0, 5400.0)]
    );
    // Adaptive, sampling every 60 s, a verdict after 3 samples:
    // t=180  the over-provisioned job shrinks 8 → 1.3 CPUs (its peak 1 × 1.25, rounded
    //        up to 0.1); the freed CPUs start the queued job at once; the input-heavy
    //        job (input-bound: GPU 50 % busy, CPU quota used up) grows 4 → 6 CPUs:
    //        3,420 s left at speed 0.5 become 2,280 s at 0.75;
    // t=360  it is still short of CPU (GPU 75 %): 6 → 8.7 CPUs, all the node has left
    //        (14 − 1.3 − 4), which is past its saturation of 8: 2,100 s left at 0.75
    //        become 1,575 s at full speed, so it ends at 360 + 1,575 = 1,935.
    assert_eq!(
        times(&jobs, &options, true),
        vec![(0.0, 3600.0), (0.0, 1935.0), (180.0, 1980.0)]
    );
}

#[test]
fn the_comparison_counts_the_reallocations_and_utilisation() {
    let model = SpeedModel::default_model();
    let (jobs, options) = scenario(&model);
    let [fixed, adaptive] = run_compare(&jobs, "fairshare", &options, &model).unwrap();
    assert_eq!(fixed.reallocations.total, 0);
    // The shrink (CPU and memory at once) and the two grows.
    assert_eq!(adaptive.reallocations.total, 3);
    assert_eq!(adaptive.reallocations.cpu_grows, 2);
    assert_eq!(adaptive.reallocations.cpu_shrinks, 1);
    assert_eq!(adaptive.reallocations.memory_shrinks, 1);
    assert_eq!(adaptive.reallocations.rejected, 0);
    assert_eq!(fixed.avg_queue_s, 3590.0 / 3.0);
    assert_eq!(adaptive.avg_queue_s, 170.0 / 3.0);
    assert_eq!(fixed.avg_jct_s, (3600.0 + 3600.0 + 5390.0) / 3.0);
    assert_eq!(adaptive.avg_jct_s, (3600.0 + 1935.0 + 1970.0) / 3.0);
    assert_eq!(adaptive.classes["input_heavy"].avg_run_s, 1935.0);
    assert!(adaptive.gpu_busy > fixed.gpu_busy, "{adaptive:?}");
}

#[test]
fn tacc_sim_adaptive_prints_both_rows_as_json() {
    let model = SpeedModel::default_model();
    let (jobs, _) = scenario(&model);
    let mut trace = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        trace,
        "job_id,user,submit_time_s,duration_s,num_gpus,num_nodes,status,vc"
    )
    .unwrap();
    for j in &jobs {
        writeln!(
            trace,
            "{},,{},{},{},,,{}",
            j.job_id, j.submit_s, j.duration_s, j.gpus, j.vc
        )
        .unwrap();
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tacc-sim"))
        .arg(trace.path())
        .args([
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--cpus-per-node",
            "14",
            "--memory-per-node",
            "256",
            "--adaptive",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tacc-sim failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["allocation"], "static");
    assert_eq!(rows[1]["allocation"], "adaptive");
    assert_eq!(rows[0]["classes"]["input_heavy"]["avg_jct_s"], 3600.0);
    assert_eq!(rows[1]["classes"]["input_heavy"]["avg_jct_s"], 1935.0);
    assert_eq!(rows[1]["classes"]["balanced"]["avg_queue_s"], 170.0);
    assert_eq!(rows[1]["reallocations"]["total"], 3);
}

fn excerpt() -> PathBuf {
    // Kept inside the repository (tests/data/README.md says where it comes from), so the
    // tests pass on a fresh clone with nothing beside it.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/excerpt_1000.csv")
}

/// The neutral model (speed independent of CPUs, every job at the default request)
/// gives the node-mode figures recorded in the snapshot before the speed model existed,
/// with adaptation off and on (nothing is input-bound or idle, so nothing changes).
#[test]
fn a_neutral_model_reproduces_the_recorded_node_mode_results() {
    let jobs = load_trace(&excerpt(), None).unwrap();
    let snapshot: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/excerpt_1000.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut options = NodeOptions::new(32, 8);
    options.proportional_guarantees = true;
    for policy in ["fairshare", "drf"] {
        let recorded = snapshot
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["policy"] == policy && r["mode"] == "32 nodes x 8 GPUs")
            .unwrap();
        let reports = run_compare(&jobs, policy, &options, &SpeedModel::neutral()).unwrap();
        for report in &reports {
            let round = |x: f64| (x * 1e6).round() / 1e6;
            assert_eq!(report.jobs_done as u64, recorded["jobs_done"]);
            assert_eq!(report.jobs_dropped as u64, recorded["jobs_dropped"]);
            assert_eq!(report.preemptions, recorded["preemptions"]);
            assert_eq!(round(report.avg_jct_s), recorded["avg_jct_s"]);
            assert_eq!(round(report.p50_jct_s), recorded["p50_jct_s"]);
            assert_eq!(round(report.p99_jct_s), recorded["p99_jct_s"]);
            assert_eq!(round(report.makespan_s), recorded["makespan_s"]);
            assert_eq!(
                report.reallocations.total, 0,
                "{policy} {}",
                report.allocation
            );
        }
    }
}
