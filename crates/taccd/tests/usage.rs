//! Usage accounting and fair-share standing against a real `taccd dev` cluster and the
//! real `tcloud` binary: short tasks of two users in two groups (one retried, one still
//! running), then `tcloud usage` shows each user's CPU-hours — exactly what their task
//! events say they held, and plausible for what they ran — to whom may see them: alice
//! her own, not bob's; her group's admin the group; an admin everyone. The table, the
//! plots (SVG parsed as XML, PNG by signature and size) and `tcloud usage --fairshare`
//! (the policy's factor from its own inputs) are checked too. `tcloud` must be built
//! beside `taccd` (`cargo build -p taccd -p tcloud --bins`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use tacc_client::Client;
use tacc_core::TaskState;
use tacc_proto::{CreateUser, TaskEventView};

/// The `tcloud` binary built beside `taccd`.
fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build -p taccd -p tcloud --bins`",
        path.display()
    );
    path
}

/// Someone on the cluster: their token, and a client acting as them.
struct Person {
    token: String,
    client: Client,
}

async fn person(daemon: &Daemon, name: &str, group: &str, role: &str) -> Person {
    let created = daemon
        .client()
        .create_user(&CreateUser {
            name: name.into(),
            group: Some(group.into()),
            role: role.parse().unwrap(),
            token_ttl_secs: None,
        })
        .await
        .unwrap();
    let token = created.token.token;
    Person {
        client: Client::new(&daemon.url).with_token(token.clone()),
        token,
    }
}

fn tcloud(daemon: &Daemon, home: &Path, token: &str, args: &[&str]) -> Output {
    Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", token)
        .output()
        .unwrap()
}

fn tcloud_ok(daemon: &Daemon, home: &Path, token: &str, args: &[&str]) -> String {
    let output = tcloud(daemon, home, token, args);
    assert!(
        output.status.success(),
        "tcloud {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn tcloud_json(daemon: &Daemon, home: &Path, token: &str, args: &[&str]) -> serde_json::Value {
    let text = tcloud_ok(daemon, home, token, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("tcloud {args:?}: no JSON ({e}): {text}"))
}

/// The rows of a usage report by name.
fn rows(report: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

fn row<'a>(rows: &'a [(String, serde_json::Value)], name: &str) -> &'a serde_json::Value {
    &rows
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:?}"))
        .1
}

/// Seconds a finished task held its resources by its own events, computed here
/// independently: each attempt from `starting` to the next event that is not its
/// `running`; and how many attempts.
fn seconds_held(events: &[TaskEventView]) -> (f64, u64) {
    let mut held_ms = 0u64;
    let mut attempts = 0;
    let mut i = 0;
    while i < events.len() {
        if events[i].state == TaskState::Starting {
            let start = events[i].at.as_millis();
            let attempt = events[i].attempt;
            let mut j = i + 1;
            while j < events.len()
                && events[j].attempt == attempt
                && events[j].state == TaskState::Running
            {
                j += 1;
            }
            let end = events.get(j).expect("a finished attempt has an end").at;
            held_ms += end.as_millis() - start;
            attempts += 1;
            i = j;
        } else {
            i += 1;
        }
    }
    (held_ms as f64 / 1000.0, attempts)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_accounted_per_user_and_shown_to_whom_it_may_be() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "policy = \"fairshare\"\n\n[groups.vision]\nshare = 3\n\n[groups.nlp]\nshare = 1\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let alice = person(&daemon, "alice", "vision", "user").await;
    let bob = person(&daemon, "bob", "nlp", "user").await;
    let lead = person(&daemon, "lead", "vision", "group-admin").await;
    let home = dir.path().join("home");

    let marker = format!("usage-{}", std::process::id());
    let short = |cpus: &str| {
        format!(
            "name: short\nresources: {{cpus: {cpus}, memory: 128MiB}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 1\n"
        )
    };
    let a1 = submit(&alice.client, dir.path(), "a1", &short("1"), &[]).await;
    // Fails once, succeeds on its retry: two attempts, each charged.
    let a2 = submit(
        &alice.client,
        dir.path(),
        "a2",
        "name: retried\nresources: {cpus: 0.5, memory: 128MiB}\nretry: {max_attempts: 2, on: [failed]}\nrun: |\n  sleep 1\n  test \"$TACC_ATTEMPT\" = 2\n",
        &[],
    )
    .await;
    let b1 = submit(&bob.client, dir.path(), "b1", &short("0.5"), &[]).await;
    let mut expected = std::collections::BTreeMap::new();
    for (task, user, cpus) in [(a1, "alice", 1.0), (a2, "alice", 0.5), (b1, "bob", 0.5)] {
        let view = wait_terminal(&daemon.client(), task).await;
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        let events = daemon.client().task_events(task).await.unwrap();
        let (secs, attempts) = seconds_held(&events);
        // (CPU-seconds, memory GiB-seconds, attempts, tasks); every task asks for 128 MiB.
        let entry = expected.entry(user).or_insert((0.0, 0.0, 0u64, 0u64));
        entry.0 += secs * cpus;
        entry.1 += secs * 0.125;
        entry.2 += attempts;
        entry.3 += 1;
    }
    assert_eq!(expected["alice"].2, 3, "a1 once, a2 twice");

    // The admin sees both users, each exactly as their events say, and plausibly: every
    // attempt slept a second, and none took a minute.
    let report = tcloud_json(&daemon, &home, &daemon.token, &["usage", "--json"]);
    let all = rows(&report);
    assert_eq!(all.len(), 2, "{report}");
    for (user, (cpu_secs, memory_secs, attempts, tasks)) in &expected {
        let row = row(&all, user);
        let cpu_hours = row["cpu_hours"].as_f64().unwrap();
        assert!(
            close(cpu_hours, cpu_secs / 3600.0),
            "{user}: {row} vs {cpu_secs} CPU-s"
        );
        let memory = row["memory_gib_hours"].as_f64().unwrap();
        assert!(
            close(memory, memory_secs / 3600.0),
            "{user}: {row} vs {memory_secs} GiB-s"
        );
        assert_eq!(row["attempts"], *attempts, "{row}");
        assert_eq!(row["tasks"], *tasks, "{row}");
        assert_eq!(row["gpu_hours"], 0.0);
        let floor = match *user {
            "alice" => 1.0 + 0.5 * 2.0,
            _ => 0.5,
        } / 3600.0;
        assert!(
            cpu_hours >= floor && cpu_hours < 60.0 / 3600.0,
            "{user}: {cpu_hours}"
        );
    }
    assert_eq!(row(&all, "alice")["group"], "vision");
    assert_eq!(report["total"]["attempts"], 4);

    // Alice sees her own usage only, and may not ask for bob's.
    let mine = tcloud_json(&daemon, &home, &alice.token, &["usage", "--json"]);
    let names: Vec<String> = rows(&mine).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["alice"]);
    let refused = tcloud(&daemon, &home, &alice.token, &["usage", "--user", "bob"]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("only their own usage"), "{stderr}");
    let refused = tcloud(&daemon, &home, &alice.token, &["usage", "--group", "nlp"]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    // Vision's group admin sees vision's users, not nlp's; by group, vision alone.
    let group = tcloud_json(&daemon, &home, &lead.token, &["usage", "--json"]);
    let names: Vec<String> = rows(&group).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["alice"]);
    let by_group = tcloud_json(
        &daemon,
        &home,
        &daemon.token,
        &["usage", "--by", "group", "--json"],
    );
    let groups = rows(&by_group);
    assert!(close(
        row(&groups, "vision")["cpu_hours"].as_f64().unwrap(),
        expected["alice"].0 / 3600.0
    ));
    assert!(close(
        row(&groups, "nlp")["cpu_hours"].as_f64().unwrap(),
        expected["bob"].0 / 3600.0
    ));
    // A window that ended before the tasks ran holds nothing.
    let before = tcloud_json(
        &daemon,
        &home,
        &daemon.token,
        &["usage", "--since", "2w", "--until", "1w", "--json"],
    );
    assert!(rows(&before).is_empty(), "{before}");
    let bad = tcloud(
        &daemon,
        &home,
        &daemon.token,
        &["usage", "--since", "yesterday"],
    );
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("RFC 3339"));

    // A running attempt counts up to now: bob's usage grows while it runs.
    let long = submit(
        &bob.client,
        dir.path(),
        "long",
        &format!(
            "name: long\nresources: {{cpus: 0.5, memory: 128MiB}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 300\n"
        ),
        &[],
    )
    .await;
    wait_state(&bob.client, long, &[TaskState::Running]).await;
    let first = tcloud_json(&daemon, &home, &bob.token, &["usage", "--json"]);
    assert_eq!(row(&rows(&first), "bob")["running"], 1, "{first}");
    let first_hours = row(&rows(&first), "bob")["cpu_hours"].as_f64().unwrap();
    eventually("bob's usage to grow while his task runs", DEADLINE, || {
        let later = tcloud_json(&daemon, &home, &bob.token, &["usage", "--json"]);
        let grown = row(&rows(&later), "bob")["cpu_hours"].as_f64().unwrap() > first_hours;
        async move { grown.then_some(()) }
    })
    .await;

    // The table, as a person reads it.
    let table = tcloud_ok(&daemon, &home, &daemon.token, &["usage"]);
    eprintln!("{table}");
    let header = table.lines().nth(1).unwrap();
    for column in [
        "USER",
        "GROUP",
        "TASKS",
        "ATTEMPTS",
        "RUNNING",
        "CPU-H",
        "GPU-H",
        "MEM-GiB-H",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let alice_line = table.lines().find(|l| l.starts_with("alice")).unwrap();
    assert!(alice_line.contains("vision"), "{alice_line}");
    assert!(table.lines().any(|l| l.starts_with("total")), "{table}");

    // Plots: an SVG with a stack per user, and a PNG of the chart's size.
    let svg = dir.path().join("usage.svg");
    tcloud_ok(
        &daemon,
        &home,
        &daemon.token,
        &[
            "usage",
            "--since",
            "1h",
            "--plot",
            svg.to_str().unwrap(),
            "--metric",
            "cpu-hours",
        ],
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    let document = roxmltree::Document::parse(&text).expect("well-formed SVG");
    assert_eq!(document.root_element().attribute("width"), Some("960"));
    let texts: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for expected in ["alice", "bob", "CPU-hours"] {
        assert!(texts.contains(&expected), "{expected} in {texts:?}");
    }
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("CPU-hours per hour by user")),
        "{texts:?}"
    );
    let png = dir.path().join("usage.png");
    tcloud_ok(
        &daemon,
        &home,
        &daemon.token,
        &["usage", "--plot", png.to_str().unwrap()],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((word(16), word(20)), (960, 480));

    // Fair share: every group's factor is the policy's formula of its own inputs.
    let shares = tcloud_json(
        &daemon,
        &home,
        &daemon.token,
        &["usage", "--fairshare", "--json"],
    );
    assert_eq!(shares["policy"], "fairshare");
    let groups = shares["groups"].as_array().unwrap();
    let names: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["nlp", "vision"], "{shares}");
    let (mut norm_sum, mut effective_sum) = (0.0, 0.0);
    for group in groups {
        let f = |key: &str| group[key].as_f64().unwrap();
        assert!(f("decayed_usage") > 0.0, "{group}");
        assert!(
            close(
                f("fairshare"),
                (-f("effective_usage") / f("normalized_share")).exp2()
            ),
            "{group}"
        );
        norm_sum += f("normalized_share");
        effective_sum += f("effective_usage");
    }
    assert!(
        close(norm_sum, 1.0) && close(effective_sum, 1.0),
        "{shares}"
    );
    assert_eq!(groups[1]["share"], 3.0);
    assert_eq!(groups[1]["normalized_share"], 0.75);
    // Bob's running task is held against nlp and bob now.
    assert_eq!(groups[0]["allocated"]["running"], 1, "{shares}");
    assert_eq!(groups[0]["allocated"]["cpu_millis"], 500, "{shares}");
    let users = shares["users"].as_array().unwrap();
    let bob_share = users.iter().find(|u| u["user"] == "bob").unwrap();
    assert_eq!(bob_share["group"], "nlp");
    assert_eq!(bob_share["fairshare"], groups[0]["fairshare"]);
    // Alice sees her own line and her group's only.
    let hers = tcloud_json(
        &daemon,
        &home,
        &alice.token,
        &["usage", "--fairshare", "--json"],
    );
    let names: Vec<&str> = hers["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["vision"]);
    let names: Vec<&str> = hers["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["alice"]);
    let table = tcloud_ok(&daemon, &home, &daemon.token, &["usage", "--fairshare"]);
    eprintln!("{table}");
    assert!(
        table.contains("FAIRSHARE") && table.contains("NORM-SHARE"),
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("vision")), "{table}");

    bob.client.cancel(long).await.unwrap();
    wait_terminal(&bob.client, long).await;
    wait_no_processes(&marker).await;
}
