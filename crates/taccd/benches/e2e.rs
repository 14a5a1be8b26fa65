//! End-to-end benchmark on the embedded cluster (`taccd dev`), through the HTTP API the
//! CLI uses: submit→finished latency of a trivial task, and the time to run 1000 trivial
//! tasks, beside the cost of spawning the same process bare. Run with
//! `cargo bench -p taccd --bench e2e`; figures go to docs/BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use tacc_core::TaskState;
use tacc_proto::SubmitTask;

const LATENCY_RUNS: usize = 50;
const THROUGHPUT_TASKS: usize = 1000;
const TASK: &str = "name: trivial\nresources: {cpus: 0.1, memory: 16MiB}\nrun: \"true\"\n";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Everything `tcloud submit` does: scan, offer the manifest, commit, submit.
async fn submit_dir(client: &tacc_client::Client, dir: &std::path::Path) -> tacc_core::TaskId {
    let loaded = tacc_schema::load_task(dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    client
        .submit(&SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap()
        .task_id
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let daemon = start("dev", &dir.path().join("d"), &[]).await;
        let client = daemon.client();
        let task_dir = dir.path().join("trivial");
        std::fs::create_dir_all(&task_dir).unwrap();
        std::fs::write(task_dir.join("task.yaml"), TASK).unwrap();

        // Warm-up: the first task pays for the snapshot upload and the node's caches.
        let warm = submit_dir(&client, &task_dir).await;
        wait_terminal(&client, warm).await;

        let mut latencies = Vec::new();
        for _ in 0..LATENCY_RUNS {
            let started = Instant::now();
            let task = submit_dir(&client, &task_dir).await;
            let mut logs = client.follow_logs(task, 0).await.unwrap();
            while logs.next().await.is_some() {}
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(client.get_task(task).await.unwrap().state, TaskState::Succeeded);
        }
        latencies.sort_by(f64::total_cmp);
        println!(
            "submit->finished latency, trivial task ({LATENCY_RUNS} runs): median {:.1} ms, p99 {:.1} ms, min {:.1} ms",
            percentile(&latencies, 50.0),
            percentile(&latencies, 99.0),
            latencies[0]
        );

        let started = Instant::now();
        let ids: Vec<tacc_core::TaskId> = futures::stream::iter(0..THROUGHPUT_TASKS)
            .map(|_| submit_dir(&client, &task_dir))
            .buffer_unordered(16)
            .collect()
            .await;
        let submitted = started.elapsed();
        let last = *ids.iter().max().unwrap();
        eventually("all tasks to finish", Duration::from_secs(600), || {
            let client = client.clone();
            async move {
                let open = client
                    .list_tasks(&tacc_client::TaskQuery {
                        states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                        limit: Some(1),
                        ..Default::default()
                    })
                    .await
                    .ok()?;
                open.is_empty().then_some(())
            }
        })
        .await;
        let total = started.elapsed();
        let succeeded = client
            .list_tasks(&tacc_client::TaskQuery {
                states: vec![TaskState::Succeeded],
                ..Default::default()
            })
            .await
            .unwrap()
            .len();
        assert_eq!(client.get_task(last).await.unwrap().state, TaskState::Succeeded);
        println!(
            "{THROUGHPUT_TASKS} trivial tasks: all submitted in {:.2} s, all finished in {:.2} s ({:.0} tasks/s); {succeeded} succeeded in total",
            submitted.as_secs_f64(),
            total.as_secs_f64(),
            THROUGHPUT_TASKS as f64 / total.as_secs_f64()
        );

        let started = Instant::now();
        for _ in 0..THROUGHPUT_TASKS {
            std::process::Command::new("bash").args(["-c", "true"]).status().unwrap();
        }
        let bare = started.elapsed();
        println!(
            "baseline: {THROUGHPUT_TASKS} bare `bash -c true` spawned one after another: {:.2} s ({:.0} /s)",
            bare.as_secs_f64(),
            THROUGHPUT_TASKS as f64 / bare.as_secs_f64()
        );
    });
}
