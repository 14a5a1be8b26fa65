//! Task arrays end to end on a real dev cluster: one submission queues a group of
//! elements that each see their index, `tcloud ps` folds the group into one line, a group
//! is cancelled in one command, a rerun takes only the failed elements with their
//! indices; webhook notifications (signed, retried, one per group) and the history of
//! ended tasks.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::webhook::{Receiver, sign};
use common::*;
use futures::StreamExt;
use tacc_client::{Client, HistoryQuery};
use tacc_core::{GroupId, TaskState};
use tacc_proto::{GroupDetail, SubmitReply, SubmitTask};

/// Write `task.yaml` into a new directory and submit it; the reply names the group.
async fn submit_array(client: &Client, root: &Path, name: &str, yaml: &str) -> SubmitReply {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), yaml).unwrap();
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    client
        .submit(&SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: Some(dir.display().to_string()),
            wait_for_capacity: false,
        })
        .await
        .unwrap()
}

async fn wait_group_finished(client: &Client, group: GroupId) -> GroupDetail {
    eventually(&format!("group {group} to finish"), DEADLINE, || {
        let client = client.clone();
        async move {
            let detail = client.get_group(group).await.ok()?;
            detail.group.is_finished().then_some(detail)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_runs_every_index_groups_in_ps_and_reruns_only_failed_elements() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    // Indices 3, 10 and 17 fail.
    let reply = submit_array(
        &client,
        dir.path(),
        "sweep",
        "name: sweep\nresources: {cpus: 0.5}\narray: 0-19\nrun: |\n  echo \"index $TACC_ARRAY_INDEX of $TACC_ARRAY_GROUP\"\n  test $((TACC_ARRAY_INDEX % 7)) -ne 3\n",
    )
    .await;
    let submitted = reply.group.expect("an array makes a group");
    assert_eq!(submitted.elements, 20);
    let group = submitted.group;

    let detail = wait_group_finished(&client, group).await;
    assert_eq!(detail.elements.len(), 20);
    let indices: Vec<u32> = detail.elements.iter().map(|e| e.index).collect();
    assert_eq!(indices, (0..20).collect::<Vec<_>>());
    for element in &detail.elements {
        let log = log_text(&client, element.task_id).await;
        assert!(
            log.contains(&format!("index {} of {group}", element.index)),
            "element {} logged: {log}",
            element.index
        );
        let expected = if element.index % 7 == 3 {
            TaskState::Failed
        } else {
            TaskState::Succeeded
        };
        assert_eq!(element.state, expected, "{element:?}");
    }
    let counts: BTreeMap<TaskState, u64> =
        [(TaskState::Succeeded, 17), (TaskState::Failed, 3)].into();
    assert_eq!(detail.group.counts, counts);

    // `tcloud ps` shows the group as one line with its counts, and expands on request.
    let home = dir.path().join("home");
    let table = tcloud(&daemon, &home, &["ps", "--all"]);
    let line = table
        .lines()
        .find(|l| l.starts_with(&group.to_string()))
        .unwrap_or_else(|| panic!("no line for {group} in:\n{table}"));
    assert!(
        line.contains("sweep")
            && line.contains("array 20")
            && line.contains("SUCCEEDED 17 · FAILED 3"),
        "{line}"
    );
    assert!(
        !table.lines().any(|l| l
            .trim_start()
            .starts_with(&detail.elements[0].task_id.to_string())),
        "elements are folded into their group:\n{table}"
    );
    let expanded = tcloud(&daemon, &home, &["ps", &group.to_string()]);
    assert_eq!(
        expanded.lines().filter(|l| l.contains("failed")).count(),
        3,
        "{expanded}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&tcloud(&daemon, &home, &["ps", "--all", "--json"])).unwrap();
    assert_eq!(json["groups"][0]["counts"]["failed"], 3, "{json}");
    assert_eq!(json["tasks"], serde_json::json!([]), "{json}");

    // Rerun: only the failed elements, with their indices, as a new group.
    let rerun = client.rerun_group_failed(group).await.unwrap();
    let again = rerun.group.expect("a rerun makes a group");
    assert_eq!(again.elements, 3);
    let rerun_detail = wait_group_finished(&client, again.group).await;
    let rerun_indices: Vec<u32> = rerun_detail.elements.iter().map(|e| e.index).collect();
    assert_eq!(rerun_indices, [3, 10, 17]);
    assert_eq!(rerun_detail.group.rerun_of, Some(group));
    for element in &rerun_detail.elements {
        let log = log_text(&client, element.task_id).await;
        assert!(
            log.contains(&format!("index {} of {}", element.index, again.group)),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_group_stops_every_unfinished_element() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let client = daemon.client();
    let marker = format!("array-cancel-{}", std::process::id());
    let reply = submit_array(
        &client,
        dir.path(),
        "long",
        &format!(
            "name: long\nresources: {{cpus: 1}}\narray: 0-19\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 300\n"
        ),
    )
    .await;
    let group = reply.group.unwrap().group;
    // Two run (one CPU each), the rest wait.
    eventually("two elements to run", DEADLINE, || {
        let client = client.clone();
        async move {
            let detail = client.get_group(group).await.ok()?;
            (detail.group.counts.get(&TaskState::Running) == Some(&2)).then_some(())
        }
    })
    .await;
    let home = dir.path().join("home");
    let said = tcloud(&daemon, &home, &["cancel", &group.to_string()]);
    assert!(
        said.contains("cancelled 20 unfinished element(s)"),
        "{said}"
    );
    let detail = wait_group_finished(&client, group).await;
    assert_eq!(
        detail.group.counts,
        BTreeMap::from([(TaskState::Cancelled, 20)])
    );
    wait_no_processes(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_an_array_is_answered_when_its_last_element_ends() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let client = daemon.client();
    // Two at a time, a second each: the array takes two seconds at least.
    let reply = submit_array(
        &client,
        dir.path(),
        "naps",
        "name: naps\nresources: {cpus: 1}\narray: 0-3\nrun: sleep 1\n",
    )
    .await;
    let group = reply.group.unwrap().group;
    // A short wait is answered when it is over, the array still open.
    let early = client
        .group_summary_when_ended(group, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(!early.is_finished(), "{early:?}");
    // A long one is answered once the last element has ended, with its end counted.
    let ended = client
        .group_summary_when_ended(group, Duration::from_secs(25))
        .await
        .unwrap();
    assert!(ended.is_finished(), "answered before the end: {ended:?}");
    assert_eq!(ended.counts, BTreeMap::from([(TaskState::Succeeded, 4)]));
    // An ended group is answered at once.
    let again = client
        .group_summary_when_ended(group, Duration::from_secs(25))
        .await
        .unwrap();
    assert_eq!(again.counts, ended.counts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_notifies_once_signed_and_retried_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    // The receiver listens on loopback, an internal address: the operator allows it.
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "4", "--webhook-allow-private"],
    )
    .await;
    let client = daemon.client();
    let key = "hook-key-of-the-test";
    client
        .put_secret("HOOK_KEY", key.as_bytes().to_vec())
        .await
        .unwrap();
    // The receiver refuses the first delivery: the platform must try again.
    let (receiver, url) = Receiver::start(1).await;
    let reply = submit_array(
        &client,
        dir.path(),
        "notified",
        &format!(
            "name: notified\nresources: {{cpus: 0.5}}\narray: 0-5\nnotify: {{webhook: \"{url}\", secret: HOOK_KEY}}\nrun: test $TACC_ARRAY_INDEX -ne 4\n"
        ),
    )
    .await;
    let group = reply.group.unwrap().group;
    wait_group_finished(&client, group).await;
    let requests = eventually("the notification to be delivered", DEADLINE, || {
        let receiver = receiver.clone();
        async move {
            let requests = receiver.requests();
            (requests.len() >= 2).then_some(requests)
        }
    })
    .await;
    assert_eq!(
        requests.len(),
        2,
        "one refused try, one delivery: {requests:?}"
    );
    let (headers, body) = &requests[1];
    assert_eq!(requests[0].1, *body, "the retry carries the same event");
    assert_eq!(headers.get("x-tacc-signature"), Some(&sign(key, body)));
    let event: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(event["event"], "group.ended");
    assert_eq!(event["group"]["id"], group.to_string());
    assert_eq!(event["group"]["counts"]["succeeded"], 5, "{event}");
    assert_eq!(event["group"]["counts"]["failed"], 1, "{event}");

    // A single task notifies for itself.
    let (single, single_url) = Receiver::start(0).await;
    let task = submit(
        &client,
        dir.path(),
        "single",
        &format!(
            "name: single\nnotify: {{webhook: \"{single_url}\", secret: HOOK_KEY}}\nrun: exit 3\n"
        ),
        &[],
    )
    .await;
    wait_terminal(&client, task).await;
    let delivered = eventually("the task's notification", DEADLINE, || {
        let single = single.clone();
        async move { single.requests().into_iter().next() }
    })
    .await;
    let event: serde_json::Value = serde_json::from_str(&delivered.1).unwrap();
    assert_eq!(event["event"], "task.ended");
    assert_eq!(event["task"]["id"], task.0);
    assert_eq!(event["task"]["state"], "failed");
    assert_eq!(event["task"]["exit_code"], 3);
    assert_eq!(
        delivered.0.get("x-tacc-signature"),
        Some(&sign(key, &delivered.1))
    );
    // The whole group ended long ago and still notified once.
    assert_eq!(receiver.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_ended_tasks_by_name_state_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let admin = daemon.client();
    let alice = daemon.user_client("alice", None, "user").await;
    let mut ended = Vec::new();
    for (name, run) in [("train", "true"), ("train", "exit 1"), ("eval", "true")] {
        let task = submit(
            &alice,
            dir.path(),
            &format!("{name}-{}", ended.len()),
            &format!("name: {name}\nrun: {run}\n"),
            &[],
        )
        .await;
        wait_terminal(&alice, task).await;
        ended.push(task);
    }
    let bobs = submit(
        &admin,
        dir.path(),
        "admins",
        "name: train\nrun: true\n",
        &[],
    )
    .await;
    wait_terminal(&admin, bobs).await;

    let ids = |page: tacc_proto::HistoryPage| page.tasks.iter().map(|t| t.id).collect::<Vec<_>>();
    let all = alice.history(&HistoryQuery::default()).await.unwrap();
    assert_eq!(
        ids(all),
        [ended[2], ended[1], ended[0]],
        "alice sees her own, newest end first"
    );
    let trains = alice
        .history(&HistoryQuery {
            name: Some("train".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(trains), [ended[1], ended[0]]);
    let failed = alice
        .history(&HistoryQuery {
            states: vec![TaskState::Failed],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(failed), [ended[1]]);
    let paged = alice
        .history(&HistoryQuery {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    let next = paged.next.clone().expect("a second page");
    let second = alice
        .history(&HistoryQuery {
            limit: Some(2),
            before: Some(next),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(second), [ended[0]]);
    let refused = alice
        .history(&HistoryQuery {
            user: Some("tester".into()),
            ..Default::default()
        })
        .await;
    assert!(refused.is_err(), "a user reads only their own history");
    let by_admin = admin
        .history(&HistoryQuery {
            user: Some("alice".into()),
            name: Some("train".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(by_admin), [ended[1], ended[0]]);
    let home = dir.path().join("home");
    let table = tcloud(
        &daemon,
        &home,
        &["history", "--state", "failed", "--since", "1h"],
    );
    assert!(
        table.contains("train") && table.contains("failed"),
        "{table}"
    );
}

/// Figures for docs/BENCHMARKS.md, not a check: run by hand with
/// `cargo test -p taccd --test arrays scale -- --ignored --nocapture`. A 10,000-element
/// array: how long the one request takes and how fast its elements run, beside single
/// submissions of the same trivial task; then `tcloud ps` with 100,000 tasks stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of several minutes; run by hand"]
async fn scale() {
    const TRIVIAL: &str = "name: trivial\nresources: {cpus: 0.1, memory: 16MiB}\nrun: \"true\"\n";
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();

    // Single submissions, 500 of them, 16 at a time.
    let task_dir = dir.path().join("single");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(task_dir.join("task.yaml"), TRIVIAL).unwrap();
    let loaded = tacc_schema::load_task(&task_dir).unwrap();
    let snapshot = upload(&client, &loaded.code_root).await;
    let single = SubmitTask {
        translated: Vec::new(),
        spec: serde_json::to_value(&loaded.spec).unwrap(),
        snapshot: snapshot.clone(),
        source: None,
        wait_for_capacity: false,
    };
    let started = std::time::Instant::now();
    let ids: Vec<_> = futures::stream::iter(0..500)
        .map(|_| {
            let client = client.clone();
            let single = single.clone();
            async move { client.submit(&single).await.unwrap().task_id }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for id in &ids {
        wait_terminal(&client, *id).await;
    }
    let took = started.elapsed().as_secs_f64();
    println!(
        "500 single submissions, first submit -> last finished: {took:.2} s ({:.0} tasks/s)",
        500.0 / took
    );

    // One array of 10,000.
    let mut spec = loaded.spec.clone();
    spec.array = Some("0-9999".parse().unwrap());
    let array = SubmitTask {
        translated: Vec::new(),
        spec: serde_json::to_value(&spec).unwrap(),
        snapshot: snapshot.clone(),
        source: None,
        wait_for_capacity: false,
    };
    let started = std::time::Instant::now();
    let reply = client.submit(&array).await.unwrap();
    let accepted = started.elapsed().as_secs_f64();
    let group = reply.group.unwrap().group;
    println!(
        "10,000-element array accepted (durable) in {:.0} ms",
        accepted * 1000.0
    );
    let long = std::time::Duration::from_secs(1800);
    eventually("the array to finish", long, || {
        let client = client.clone();
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let summary = client.group_summary(group).await.ok()?;
            summary.is_finished().then_some(())
        }
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    let detail = client.get_group(group).await.unwrap();
    assert_eq!(
        detail.group.counts.get(&TaskState::Succeeded),
        Some(&10_000)
    );
    println!(
        "10,000-element array, submit -> last finished: {took:.1} s ({:.0} tasks/s)",
        10_000.0 / took
    );

    // Fill the store to 100,000 tasks: nine more arrays, cancelled while queued.
    for _ in 0..9 {
        let reply = client.submit(&array).await.unwrap();
        client
            .cancel_group(reply.group.unwrap().group)
            .await
            .unwrap();
    }
    let home = dir.path().join("home");
    for args in [&["ps"][..], &["ps", "--all"][..], &["history"][..]] {
        let started = std::time::Instant::now();
        tcloud(&daemon, &home, args);
        println!(
            "tcloud {} with 100,500 tasks stored: {:.0} ms",
            args.join(" "),
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
}
