//! Multi-host benchmark (needs scripts/ci/setup-netns.sh): 1000 trivial single-node tasks
//! over three networked agents (TLS over the bridge) beside the same on the embedded
//! cluster, in one run; and one 3-node task printing 1,000,000 numbered lines, followed
//! to the end, checked line by line. Run with `cargo bench -p taccd --bench netns`;
//! figures go to docs/BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::netns::*;
use common::*;
use futures::StreamExt;
use tacc_client::{Client, TaskQuery};
use tacc_core::TaskState;

const TASKS: usize = 1000;
const TRIVIAL: &str = "name: trivial\nresources: {cpus: 0.1, memory: 16MiB}\nrun: \"true\"\n";
const LINES: u64 = 1_000_000;

/// Submit `TASKS` trivial tasks from 16 concurrent submitters; seconds to the last end.
async fn throughput(client: &Client, root: &std::path::Path) -> (f64, f64) {
    let warm = submit(client, root, "warm", TRIVIAL, &[]).await;
    wait_terminal(client, warm).await;
    let started = Instant::now();
    let ids: Vec<tacc_core::TaskId> = futures::stream::iter(0..TASKS)
        .map(|_| submit(client, root, "trivial", TRIVIAL, &[]))
        .buffer_unordered(16)
        .collect()
        .await;
    let submitted = started.elapsed().as_secs_f64();
    eventually("all tasks to finish", Duration::from_secs(900), || {
        let client = client.clone();
        async move {
            let open = client
                .list_tasks(&TaskQuery {
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
    let total = started.elapsed().as_secs_f64();
    for id in [ids[0], *ids.iter().max().unwrap()] {
        assert_eq!(
            client.get_task(id).await.unwrap().state,
            TaskState::Succeeded
        );
    }
    (submitted, total)
}

/// Peak resident memory of process `pid` (kB, VmHWM).
fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    if !network_ready("netns benchmark") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();

        let embedded = start("dev", &dir.path().join("dev"), &[]).await;
        let (submitted, total) = throughput(&embedded.client(), &dir.path().join("e")).await;
        println!(
            "embedded cluster: {TASKS} trivial tasks submitted in {submitted:.2} s, all finished in {total:.2} s ({:.0} tasks/s)",
            TASKS as f64 / total
        );
        drop(embedded);

        let cluster = Cluster::start(&dir.path().join("net"), &[]).await;
        let agents: Vec<Daemon> = (1..=3)
            .map(|h| cluster.agent(h, &format!("bench-h{h}"), &[]))
            .collect();
        wait_nodes(&cluster.client, 3).await;
        let (submitted, total) = throughput(&cluster.client, &dir.path().join("n")).await;
        println!(
            "3 networked agents (TLS over the bridge): {TASKS} trivial tasks submitted in {submitted:.2} s, all finished in {total:.2} s ({:.0} tasks/s)",
            TASKS as f64 / total
        );

        // One task, three ranks, 1,000,000 numbered lines in all, followed live.
        let per_rank = LINES.div_ceil(3);
        let yaml = format!(
            "name: lines\nresources: {{nodes: 3, cpus: 1, memory: 256MiB}}\nrun: |\n  n={per_rank}\n  if [ \"$RANK\" = 2 ]; then n=$(({LINES} - 2 * {per_rank})); fi\n  seq 1 $n | sed \"s/^/line $RANK /\"\n"
        );
        let started = Instant::now();
        let task = submit(&cluster.client, &cluster.root, "lines", &yaml, &[]).await;
        let mut follow = cluster.client.follow_logs(task, 0).await.unwrap();
        let mut text = Vec::new();
        while let Some(chunk) = follow.next().await {
            text.extend_from_slice(&chunk.unwrap());
        }
        let elapsed = started.elapsed().as_secs_f64();
        let view = cluster.client.get_task(task).await.unwrap();
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        let text = String::from_utf8(text).unwrap();
        let mut next: BTreeMap<u32, u64> = BTreeMap::new();
        let mut counted = 0u64;
        for line in text.lines() {
            let Some(rest) = line.split_once("] line ").map(|(_, r)| r) else {
                continue;
            };
            let (rank, number) = rest.split_once(' ').unwrap();
            let (rank, number): (u32, u64) = (rank.parse().unwrap(), number.parse().unwrap());
            let expected = next.entry(rank).or_insert(1);
            assert_eq!(number, *expected, "rank {rank}: lost, duplicated or reordered");
            *expected += 1;
            counted += 1;
        }
        assert_eq!(counted, LINES, "every line exactly once");
        let rss: Vec<String> = agents
            .iter()
            .map(|a| format!("{} MiB", peak_rss_kb(a.pid()) / 1024))
            .collect();
        println!(
            "1,000,000 lines from 3 ranks followed live: {elapsed:.2} s ({:.0} lines/s end to end), every line once and in order per rank; agents' peak RSS {}",
            LINES as f64 / elapsed,
            rss.join(", ")
        );
    });
}
