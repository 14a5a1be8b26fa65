//! The real `tcloud` binary against a real embedded cluster (`taccd dev`, started by
//! `tcloud up`), as a user would drive it. `taccd` must be built first (`scripts/test.sh`
//! does `cargo build --workspace --bins`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn taccd_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_tcloud")).with_file_name("taccd");
    assert!(
        path.exists(),
        "{} is missing: build every binary first with `cargo build --workspace --bins` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A user's environment: own TACC_HOME (config and local cluster data), own port.
struct User {
    home: tempfile::TempDir,
    port: u16,
}

impl User {
    fn new() -> User {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        User {
            home: tempfile::tempdir().unwrap(),
            port,
        }
    }

    fn tcloud(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tcloud"))
            .args(args)
            .current_dir(repo_root())
            .env("TACC_HOME", self.home.path())
            .env("TACC_TACCD", taccd_binary())
            .env("USER", "alice")
            .env_remove("TACC_SERVER")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.tcloud(args);
        assert!(
            out.status.success(),
            "tcloud {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let text = self.ok(args);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("tcloud {args:?} printed no JSON ({e}): {text}"))
    }

    fn up(&self) {
        self.ok(&["up", "--port", &self.port.to_string()]);
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = self.tcloud(&["down"]);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn quickstart_runs_end_to_end_and_a_resubmission_uploads_nothing() {
    let user = User::new();
    user.up();
    let submitted = user.json(&["submit", "examples/quickstart", "--json"]);
    let task = submitted["task_id"].as_u64().expect("task_id");
    assert!(
        submitted["uploaded_bytes"].as_u64().unwrap() > 0,
        "{submitted}"
    );
    assert_eq!(
        submitted["uploaded_bytes"], submitted["total_bytes"],
        "first upload sends everything"
    );

    let log = user.ok(&["logs", "-f", &task.to_string()]);
    assert!(log.contains("epoch  20"), "{log}");
    assert!(log.contains("test accuracy"), "{log}");

    let shown = user.json(&["show", &task.to_string(), "--json"]);
    assert_eq!(shown["state"], "succeeded", "{shown}");
    let outputs: Vec<&str> = shown["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert!(outputs.contains(&"results/metrics.json"), "{shown}");
    let states: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["queued", "starting", "running", "succeeded"]);

    let human = user.ok(&["show", &task.to_string()]);
    assert!(
        human.contains("succeeded") && human.contains("results/metrics.json"),
        "{human}"
    );

    let dest = user.home.path().join("downloaded");
    user.ok(&["download", &task.to_string(), dest.to_str().unwrap()]);
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dest.join("results/metrics.json")).unwrap())
            .unwrap();
    assert!(
        metrics["test_accuracy"].as_f64().unwrap() > 0.7,
        "{metrics}"
    );

    // Same code again: the server has every chunk, nothing is uploaded.
    let again = user.json(&["submit", "examples/quickstart", "--json"]);
    assert_eq!(again["uploaded_bytes"], 0, "{again}");
    assert_eq!(again["snapshot"], submitted["snapshot"]);

    let listed = user.json(&["ps", "--all", "--json"]);
    assert!(listed.as_array().unwrap().len() >= 2);
    let table = user.ok(&["ps", "--all"]);
    assert!(
        table.contains("quickstart") && table.contains("ID"),
        "{table}"
    );
}

#[test]
fn legacy_tuxiv_directories_submit_with_warnings() {
    let user = User::new();
    user.up();
    let out = user.tcloud(&["submit", "examples/tuxiv-hello", "--follow"]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("partition=gpu") && err.contains("not supported"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from task"),
        "{out:?}"
    );
}

#[test]
fn invalid_task_files_exit_2_with_a_located_message_and_submit_nothing() {
    let user = User::new();
    let dir = user.home.path().join("bad");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        "name: bad\nresources:\n  memroy: 4GiB\nrun: python train.py\n",
    )
    .unwrap();
    let out = user.tcloud(&["check", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("task.yaml:3:3"), "{err}");
    assert!(err.contains("did you mean `memory`"), "{err}");

    // submit fails the same way before contacting any server (none runs here).
    let out = user.tcloud(&["submit", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("did you mean `memory`"));

    for (yaml, expected) in [
        ("name: x\nrun: ''\n", "run"),
        ("name: x\nresources: {gpus: -1}\nrun: 'true'\n", "gpus"),
        (
            "name: x\nresources: {time_limit: 4 hours later}\nrun: 'true'\n",
            "time_limit",
        ),
        (
            "name: x\nresources: {memory: lots}\nrun: 'true'\n",
            "memory",
        ),
        ("name: x\n", "run"),
    ] {
        std::fs::write(dir.join("task.yaml"), yaml).unwrap();
        let out = user.tcloud(&["check", dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{yaml}");
        let err = stderr(&out);
        assert!(
            err.contains("task.yaml:") && err.contains(expected),
            "{yaml}: {err}"
        );
    }
}

#[test]
fn an_unreachable_server_is_one_line_and_exit_3() {
    let user = User::new();
    let url = format!("http://127.0.0.1:{}", user.port);
    let out = user.tcloud(&["--server", &url, "ps"]);
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&url) && err.contains("tcloud up"), "{err}");
}

#[test]
fn unknown_tasks_exit_4_and_cancel_stops_a_running_task() {
    let user = User::new();
    user.up();
    let out = user.tcloud(&["show", "999"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("999"));

    let dir = user.home.path().join("long");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        "name: long\nrun: |\n  echo waiting\n  sleep 300\n",
    )
    .unwrap();
    let task = user.json(&["submit", dir.to_str().unwrap(), "--json"])["task_id"]
        .as_u64()
        .unwrap()
        .to_string();
    let why = user.ok(&["why", &task]);
    assert!(
        why.contains(&format!("task {task} is")) && why.contains("policy: fairshare"),
        "{why}"
    );
    let why = user.json(&["why", &task, "--json"]);
    assert_eq!(why["task_id"].as_u64().unwrap().to_string(), task);
    let table = user.ok(&["ps"]);
    assert!(table.contains("START") && table.contains("long"), "{table}");
    let cancelled = user.ok(&["cancel", &task]);
    assert!(cancelled.contains("cancelled"), "{cancelled}");
    assert_eq!(user.json(&["show", &task, "--json"])["state"], "cancelled");
    let out = user.tcloud(&["logs", "-f", &task]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "a cancelled task did not succeed"
    );
}

#[test]
fn config_use_switches_the_cluster_by_one_line() {
    let user = User::new();
    user.ok(&["config", "add", "lab", "http://127.0.0.1:9"]);
    user.ok(&["config", "use", "lab"]);
    let path = user.home.path().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.lines().any(|l| l.trim() == "current = \"lab\""),
        "{text}"
    );
    let out = user.tcloud(&["ps"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("127.0.0.1:9"), "{}", stderr(&out));
    user.ok(&["config", "use", "local"]);
    let after = std::fs::read_to_string(&path).unwrap();
    let changed: Vec<(&str, &str)> = text
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(changed.len(), 1, "exactly one line changes: {changed:?}");
    let out = user.tcloud(&["config", "use", "nowhere"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("lab"),
        "lists the known profiles: {}",
        stderr(&out)
    );
}
