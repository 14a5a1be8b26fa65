//! The real `tcloud` binary against a real embedded cluster (`taccd dev`, started by
//! `tcloud up`), as a user would drive it. `taccd` must be built first (`scripts/test.sh`
//! does `cargo build --workspace --bins`).
//!
//! `tcloud up` logs in as the local cluster's admin (the token `taccd dev` writes to its
//! data directory); other identities are created with `tcloud admin user add` and log in
//! from a TACC_HOME of their own.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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
        self.tcloud_with(args, None, &[])
    }

    /// `tcloud ARGS` with `stdin` piped in (else none) and extra environment variables.
    fn tcloud_with(&self, args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tcloud"));
        command
            .args(args)
            .current_dir(repo_root())
            .env("TACC_HOME", self.home.path())
            .env("TACC_TACCD", taccd_binary())
            .env("USER", "alice")
            .env_remove("TACC_SERVER")
            .env_remove("TACC_TOKEN")
            .envs(env.iter().copied())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// `tcloud ARGS` run from directory `cwd`.
    fn tcloud_in(&self, cwd: &Path, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tcloud"))
            .args(args)
            .current_dir(cwd)
            .env("TACC_HOME", self.home.path())
            .env("TACC_TACCD", taccd_binary())
            .env("USER", "alice")
            .env_remove("TACC_SERVER")
            .env_remove("TACC_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The nodes, once the local agent has registered (a restarted cluster lists its node
    /// as the store kept it, `down`, until its agent registers again).
    fn nodes(&self) -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let nodes = self.json(&["nodes", "--json"]);
            let nodes = nodes.as_array().unwrap().clone();
            if nodes.iter().any(|node| node["state"] == "up") {
                return nodes;
            }
            assert!(std::time::Instant::now() < deadline, "no node registered");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A directory with `task.yaml` holding `yaml`.
    fn task_dir(&self, name: &str, yaml: &str) -> String {
        let dir = self.home.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("task.yaml"), yaml).unwrap();
        dir.to_str().unwrap().to_string()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn config_text(&self) -> String {
        std::fs::read_to_string(self.home.path().join("config.toml")).unwrap_or_default()
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
        // Whatever the test left running goes too (a plain `down` refuses while tasks run).
        let _ = self.tcloud(&["down", "--force"]);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A second person at the same cluster: their own TACC_HOME and profile `lab`.
fn colleague(admin: &User, name: &str, role: &str) -> (User, String) {
    let token = admin
        .ok(&["admin", "user", "add", name, "--role", role])
        .trim()
        .to_string();
    assert!(token.starts_with("tacc_"), "{token}");
    let other = User::new();
    other.ok(&["config", "add", "lab", &admin.url()]);
    other.ok(&["config", "use", "lab"]);
    let out = other.tcloud_with(
        &["login", "--token-stdin", "--profile", "lab"],
        Some(format!("{token}\n").as_bytes()),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        format!("Logged in to {} as {name} ({role})", admin.url())
    );
    (other, token)
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
    user.ok(&[
        "download",
        &task.to_string(),
        "--dest",
        dest.to_str().unwrap(),
    ]);
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
    assert!(listed["tasks"].as_array().unwrap().len() >= 2, "{listed}");
    assert_eq!(listed["groups"], serde_json::json!([]), "{listed}");
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

/// A task file with three mistakes takes one run of `tcloud check`: every mistake is
/// printed like a compiler error (location, source line, caret, help), in file order, and
/// `--json` lists them with their places.
#[test]
fn check_reports_every_mistake_of_a_file_in_file_order() {
    let user = User::new();
    let dir = user.home.path().join("three");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        "name: three\nresources:\n  cpus: -2\n  memroy: 4GiB\n  time_limit: 5 fortnights\nrun: python train.py\n",
    )
    .unwrap();
    let out = user.tcloud(&["check", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let place = |line: usize| {
        err.find(&format!("task.yaml:{line}:"))
            .unwrap_or_else(|| panic!("line {line} missing from:\n{err}"))
    };
    assert!(place(3) < place(4) && place(4) < place(5), "{err}");
    assert!(err.contains(" 3 |   cpus: -2\n"), "{err}");
    assert!(err.contains("|         ^^"), "{err}");
    assert_eq!(err.matches("= help: ").count(), 3, "{err}");
    assert!(err.contains("has 3 errors"), "{err}");

    let out = user.tcloud(&["check", "--json", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let lines: Vec<u64> = json["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{json}"))
        .iter()
        .map(|e| e["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, vec![3, 4, 5], "{json}");
    assert!(
        json["errors"][1]["help"]
            .as_str()
            .unwrap()
            .contains("memory")
    );
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

// ------------------------------------------------------------ without a server

#[test]
fn config_is_private_and_secrets_and_tokens_are_never_arguments() {
    let user = User::new();
    user.ok(&["config", "add", "lab", "http://127.0.0.1:9"]);
    let path = user.home.path().join("config.toml");
    assert_eq!(mode(&path), 0o600);

    // A looser file is tightened the next time tcloud writes it.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    user.ok(&["config", "use", "lab"]);
    assert_eq!(mode(&path), 0o600);

    // Values are read from stdin, never taken as arguments.
    let out = user.tcloud(&["secret", "set", "KEY", "value"]);
    assert_eq!(out.status.code(), Some(2));
    let out = user.tcloud_with(&["secret", "set", "KEY"], Some(b"\n"), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    let out = user.tcloud_with(&["login", "--token-stdin"], Some(b""), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // A token that cannot be checked is not stored.
    let out = user.tcloud_with(&["login", "--token-stdin"], Some(b"tacc_x\n"), &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was stored"),
        "{}",
        stderr(&out)
    );
    assert!(!user.config_text().contains("tacc_x"));

    let out = user.tcloud(&["whoami"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

// ------------------------------------------------------------ needs server-side auth

#[test]
fn up_logs_in_as_the_local_admin_in_a_private_config() {
    let user = User::new();
    user.up();
    let path = user.home.path().join("config.toml");
    assert_eq!(mode(&path), 0o600);
    let text = user.config_text();
    assert!(text.contains("token = \"tacc_"), "{text}");
    let me = user.json(&["whoami", "--json"]);
    assert_eq!(me["role"], "admin", "{me}");
    assert_eq!(me["server"], user.url());
    // Already running: up again keeps working and keeps the token.
    user.up();
    assert_eq!(user.json(&["whoami", "--json"])["role"], "admin");

    // Logged out, the server refuses; the message says how to get back in.
    user.ok(&["logout"]);
    assert!(!user.config_text().contains("tacc_"));
    let out = user.tcloud(&["ps"]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("tcloud up"), "{}", stderr(&out));
    user.up();
    user.ok(&["ps"]);

    // TACC_TOKEN overrides the profile.
    let out = user.tcloud_with(&["ps"], None, &[("TACC_TOKEN", "tacc_bogus")]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("TACC_TOKEN"), "{}", stderr(&out));
}

#[test]
fn login_admin_and_secrets_through_the_cli() {
    let admin = User::new();
    admin.up();
    let (bob, _) = colleague(&admin, "bob", "user");
    let me = bob.json(&["whoami", "--json"]);
    assert_eq!(me["name"], "bob", "{me}");
    assert_eq!(me["role"], "user", "{me}");
    assert_eq!(mode(&bob.home.path().join("config.toml")), 0o600);

    // A bad token is refused and not stored.
    let before = bob.config_text();
    let out = bob.tcloud_with(
        &["login", "--token-stdin", "--profile", "lab"],
        Some(b"tacc_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"),
        &[],
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was stored"),
        "{}",
        stderr(&out)
    );
    assert_eq!(bob.config_text(), before);

    // Admin commands are not bob's.
    let out = bob.tcloud(&["admin", "user", "ls"]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    // Said once: the server's message names its kind, and tcloud does not repeat it
    // (it printed `error: not allowed: not allowed: user bob is not an admin`).
    assert!(
        stderr(&out).starts_with("error: not allowed: user bob is not an admin"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stderr(&out).matches("not allowed").count(),
        1,
        "{}",
        stderr(&out)
    );

    // Secrets: the value goes in on stdin and never comes out.
    let value = "s3cr3t-value-0123456789";
    let out = bob.tcloud_with(
        &["secret", "set", "HF_TOKEN"],
        Some(format!("{value}\n").as_bytes()),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = bob.ok(&["secret", "ls"]);
    assert!(
        listed.contains("HF_TOKEN") && !listed.contains(value),
        "{listed}"
    );
    let listed = bob.json(&["secret", "ls", "--json"]);
    assert_eq!(listed[0]["name"], "HF_TOKEN", "{listed}");
    assert!(!listed.to_string().contains(value));
    // A task that uses it: the CLI shows the secret's name, never its value.
    let dir = bob.home.path().join("uses-secret");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        "name: uses-secret\nenvironment:\n  secrets: [HF_TOKEN]\nrun: echo \"token is $HF_TOKEN\"\n",
    )
    .unwrap();
    let task = bob.json(&["submit", dir.to_str().unwrap(), "--json"])["task_id"]
        .as_u64()
        .unwrap()
        .to_string();
    let logs = bob.ok(&["logs", "-f", &task]);
    assert!(logs.contains("token is ***"), "{logs}");
    for args in [
        vec!["show", task.as_str()],
        vec!["show", task.as_str(), "--json"],
        vec!["show", "--instruction", task.as_str()],
        vec!["logs", task.as_str()],
        vec!["ps", "--all", "--json"],
    ] {
        let out = bob.tcloud(&args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(
            !text.contains(value),
            "`tcloud {args:?}` shows the secret: {text}"
        );
    }
    bob.ok(&["secret", "rm", "HF_TOKEN"]);
    assert_eq!(bob.json(&["secret", "ls", "--json"]), serde_json::json!([]));

    // Admin views; revoking bob's token logs him out.
    let users = admin.ok(&["admin", "user", "ls"]);
    assert!(users.contains("bob") && users.contains("ROLE"), "{users}");
    let tokens = admin.json(&["admin", "token", "ls", "--json"]);
    let bobs = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["user"] == "bob")
        .unwrap_or_else(|| panic!("no token of bob in {tokens}"));
    assert!(
        !tokens.to_string().contains("tacc_"),
        "tokens are never listed"
    );
    let id = bobs["id"].as_u64().unwrap().to_string();
    admin.ok(&["admin", "token", "revoke", &id]);
    let out = bob.tcloud(&["whoami"]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("tcloud login"), "{}", stderr(&out));

    let join = admin.ok(&["admin", "agent-token", "--ttl", "1h"]);
    assert!(join.trim().starts_with("tacc_"), "{join}");
    let audit = admin.json(&["admin", "audit", "--json", "--limit", "100"]);
    assert!(!audit.as_array().unwrap().is_empty(), "{audit}");
    assert!(admin.ok(&["admin", "audit"]).contains("ACTION"));
}

#[test]
fn escape_sequences_in_task_output_are_neutralised_unless_raw() {
    let user = User::new();
    user.up();
    let dir = user.home.path().join("esc");
    std::fs::create_dir_all(&dir).unwrap();
    // Window title, screen clear, clipboard write (OSC 52), a raw 8-bit CSI byte, and a
    // carriage return that would overwrite the line.
    std::fs::write(
        dir.join("emit.sh"),
        "printf '\\033]0;pwned\\007\\033[2J\\033]52;c;Zm9v\\007\\302\\233x\\rFAKE\\nDONE\\n'\n",
    )
    .unwrap();
    std::fs::write(dir.join("task.yaml"), "name: esc\nrun: sh emit.sh\n").unwrap();
    let task = user.json(&["submit", dir.to_str().unwrap(), "--json"])["task_id"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = user.tcloud(&["logs", "-f", &task]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown = out.stdout.clone();
    for forbidden in [0x1bu8, 0x07, 0x9b, b'\r'] {
        assert!(
            !shown.contains(&forbidden),
            "byte {forbidden:#x} reached the terminal: {:?}",
            String::from_utf8_lossy(&shown)
        );
    }
    let text = String::from_utf8(shown).unwrap();
    for visible in [
        "^[]0;pwned^G",
        "^[[2J",
        "^[]52;c;Zm9v^G",
        "<U+009B>x",
        "^MFAKE",
        "DONE",
    ] {
        assert!(text.contains(visible), "{visible} not shown in {text:?}");
    }
    let plain = user.ok(&["logs", &task]);
    assert!(
        !plain.contains('\u{1b}') && plain.contains("^[[2J"),
        "{plain:?}"
    );
    let raw = user.tcloud(&["logs", &task, "--raw"]);
    assert!(raw.stdout.contains(&0x1b) && raw.stdout.contains(&0x9b));
}

#[test]
fn up_offers_typed_fake_gpus_and_tasks_are_placed_by_gpu_type() {
    let user = User::new();
    let port = user.port.to_string();
    user.ok(&["up", "--port", &port, "--gpus", "2", "--gpu-type", "A100"]);
    let nodes = user.nodes();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["capacity"]["gpus"], 2, "{nodes:?}");
    assert_eq!(nodes[0]["gpu_type"], "A100", "{nodes:?}");

    let a100 = user.task_dir(
        "a100",
        "name: a100\nresources: {cpus: 0.5, gpus: 1, gpu_type: A100}\nrun: echo gpus=$CUDA_VISIBLE_DEVICES\n",
    );
    let ran = user.ok(&["submit", &a100, "-f"]);
    assert!(ran.contains("gpus=0") || ran.contains("gpus=1"), "{ran}");

    let h100 = user.task_dir(
        "h100",
        "name: h100\nresources: {cpus: 0.5, gpus: 1, gpu_type: H100}\nrun: echo h100-ran\n",
    );
    let out = user.tcloud(&["submit", &h100, "-f"]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("H100") && !said.contains("h100-ran"),
        "{said}"
    );

    // Running with other options: said so, with how to restart, and not a success.
    let out = user.tcloud(&["up", "--port", &port, "--gpus", "4"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--gpus 2 --gpu-type A100")
            && err.contains("tcloud down && tcloud up --gpus 4"),
        "{err}"
    );
    // The same options again, or none: it just runs.
    user.ok(&["up", "--port", &port, "--gpus", "2", "--gpu-type", "A100"]);
    user.up();
}

#[test]
fn up_save_stores_the_options_in_the_profile_and_a_plain_up_repeats_them() {
    let user = User::new();
    let port = user.port.to_string();
    let home = user.home.path();
    std::fs::write(home.join("sched.toml"), "policy = \"fifo\"\n").unwrap();
    // A relative --config is taken from the current directory and stored absolute.
    let out = user.tcloud_in(
        home,
        &[
            "up",
            "--port",
            &port,
            "--config",
            "sched.toml",
            "--gpus",
            "1",
            "--gpu-type",
            "T4",
            "--save",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = user.config_text();
    let absolute = home.join("sched.toml");
    assert!(
        text.contains(&format!("up_config = \"{}\"", absolute.display()))
            && text.contains("up_gpus = 1")
            && text.contains("up_gpu_type = \"T4\""),
        "{text}"
    );
    assert!(text.contains("token = "), "{text}");

    user.ok(&["down"]);
    user.up();
    let nodes = user.nodes();
    assert_eq!(nodes[0]["gpu_type"], "T4", "{nodes:?}");
    let long = user.task_dir("long", "name: long\nrun: sleep 300\n");
    let task = user.json(&["submit", &long, "--json"])["task_id"]
        .as_u64()
        .unwrap()
        .to_string();
    let why = user.ok(&["why", &task]);
    assert!(why.contains("policy: fifo"), "{why}");
    user.ok(&["cancel", &task]);

    // A flag wins over the profile.
    user.ok(&["down"]);
    user.ok(&["up", "--port", &port, "--gpu-type", "V100"]);
    assert_eq!(user.nodes()[0]["gpu_type"], "V100");

    // A missing configuration file is refused before anything starts.
    user.ok(&["down"]);
    let out = user.tcloud_in(home, &["up", "--port", &port, "--config", "missing.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&home.join("missing.toml").display().to_string()),
        "{}",
        stderr(&out)
    );
}
