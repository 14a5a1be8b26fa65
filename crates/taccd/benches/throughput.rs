//! Throughput of trivial tasks on the embedded cluster (`taccd dev`), for
//! `bench/throughput.sh`, which runs HyperQueue beside it: N tasks `true`, each with a
//! fresh working directory and a log, every acknowledged submit and every terminal state
//! durable. Queues the N tasks as one array (`TACC_BENCH_MODE=array`, the default, as
//! HyperQueue's `--array`) or as N single submissions over HTTP from 16 concurrent
//! clients (`TACC_BENCH_MODE=single`), waits until none is open, and prints one JSON
//! line: tasks/s from the first submit to the last end, the daemon's own CPU (user +
//! system, not its children's) per task, and the same N spawns of `true` bare. N comes
//! from `TACC_BENCH_TASKS` (default 1000); `TACC_BENCH_LOG=FILE` keeps the daemon's log.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use tacc_core::TaskState;
use tacc_proto::SubmitTask;

const TASK: &str = "name: trivial\nresources: {cpus: 0.1, memory: 16MiB}\nrun: \"true\"\n";
const SUBMITTERS: usize = 16;

/// User + system CPU seconds the process itself used so far (`/proc/PID/stat` fields 14, 15).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// The embedded cluster's agent (a process of its own: `DATA/embedded-agent.json`).
fn embedded_agent_pid(data_dir: &std::path::Path) -> u32 {
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data_dir.join("embedded-agent.json")).expect("the embedded agent's record"),
    )
    .unwrap();
    record["process"]["pid"].as_u64().expect("its pid") as u32
}

fn main() {
    let tasks: usize = std::env::var("TACC_BENCH_TASKS")
        .ok()
        .map(|n| n.parse().expect("TACC_BENCH_TASKS is a number"))
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        // HyperQueue caps no queue: the per-user queue and submit limits lifted past N, as
        // `bench/lib.sh`'s `taccd_lifted` does for the CLI run (else an array past 10,000
        // elements is refused).
        let limit = (tasks * 2).to_string();
        let lifted = [
            "--max-queued",
            limit.as_str(),
            "--submit-burst",
            limit.as_str(),
        ];
        let daemon = start("dev", &dir.path().join("d"), &lifted).await;
        let pid = daemon.child.id();
        let client = daemon.client();
        let task_dir = dir.path().join("trivial");
        std::fs::create_dir_all(&task_dir).unwrap();
        std::fs::write(task_dir.join("task.yaml"), TASK).unwrap();
        let loaded = tacc_schema::load_task(&task_dir).unwrap();
        let snapshot = upload(&client, &loaded.code_root).await;
        let submit = SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: None,
            wait_for_capacity: false,
        };
        let warm = client.submit(&submit).await.unwrap().task_id;
        wait_terminal(&client, warm).await;

        let array = std::env::var("TACC_BENCH_MODE").as_deref() != Ok("single");
        // The daemon's CPU is its server's and its agent's (not the tasks').
        let agent = embedded_agent_pid(&dir.path().join("d"));
        let cpu_before = cpu_secs(pid) + cpu_secs(agent);
        let started = Instant::now();
        if array {
            let mut spec = submit.spec.clone();
            spec["array"] = serde_json::json!(format!("1-{tasks}"));
            let reply = client
                .submit(&SubmitTask {
                    translated: Vec::new(),
                    spec,
                    ..submit.clone()
                })
                .await
                .unwrap();
            let group = reply.group.expect("an array makes a group").group;
            let submitted = started.elapsed();
            eprintln!(
                "array of {tasks} accepted in {:.3} s",
                submitted.as_secs_f64()
            );
            eventually("the array to finish", Duration::from_secs(3600), || {
                let client = client.clone();
                async move {
                    let view = client.group_summary(group).await.ok()?;
                    view.is_finished().then_some(())
                }
            })
            .await;
            let view = client.group_summary(group).await.unwrap();
            assert_eq!(
                view.counts.get(&TaskState::Succeeded).copied(),
                Some(tasks as u64),
                "{view:?}"
            );
        } else {
            let ids: Vec<tacc_core::TaskId> = futures::stream::iter(0..tasks)
                .map(|_| {
                    let client = client.clone();
                    let submit = submit.clone();
                    async move { client.submit(&submit).await.unwrap().task_id }
                })
                .buffer_unordered(SUBMITTERS)
                .collect()
                .await;
            eventually("all tasks to finish", Duration::from_secs(3600), || {
                let client = client.clone();
                async move {
                    let open = client
                        .list_tasks(&tacc_client::TaskQuery {
                            states: vec![
                                TaskState::Queued,
                                TaskState::Starting,
                                TaskState::Running,
                            ],
                            limit: Some(1),
                            ..Default::default()
                        })
                        .await
                        .ok()?;
                    open.is_empty().then_some(())
                }
            })
            .await;
            let last = *ids.iter().max().unwrap();
            assert_eq!(
                client.get_task(last).await.unwrap().state,
                TaskState::Succeeded
            );
        }
        let total = started.elapsed();
        let cpu = cpu_secs(pid) + cpu_secs(agent) - cpu_before;

        if let Ok(keep) = std::env::var("TACC_BENCH_LOG") {
            std::fs::copy(dir.path().join("d/dev.log"), &keep).unwrap();
            std::fs::copy(dir.path().join("d/agent.log"), format!("{keep}.agent")).unwrap();
        }
        let bare_started = Instant::now();
        for _ in 0..tasks.min(5000) {
            std::process::Command::new("true").status().unwrap();
        }
        let bare_per_s = tasks.min(5000) as f64 / bare_started.elapsed().as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "tasks": tasks,
                "mode": if array { "array" } else { "single" },
                "total_s": total.as_secs_f64(),
                "tasks_per_s": tasks as f64 / total.as_secs_f64(),
                "cpu_ms_per_task": cpu * 1000.0 / tasks as f64,
                "bare_spawn_per_s": bare_per_s,
            })
        );
    });
}
