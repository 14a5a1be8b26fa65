//! Tasks cannot touch what is not theirs: real `taccd dev` clusters whose agent runs as
//! root, real tasks that try to read the server's and the agent's state, another user's
//! working directory, and to write into the shared caches. Every attempt must fail while
//! the task's own working directory works; secrets reach the task and never its log.
//!
//! Needs root (the agent must be able to switch identities): elsewhere the tests say
//! SKIPPED loudly and pass, except in CI (`CI=true`), where not being root fails.

mod common;

use std::path::Path;

use common::*;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: must run as root in CI: tasks are isolated only under a root agent");
    }
    use std::io::Write;
    let _ = write!(
        std::io::stderr(),
        "\n######## SKIPPED {test}: not root, so the agent runs tasks as itself and cannot isolate them.\n######## Run the tests as root (scripts/test.sh in CI does) to check task isolation.\n"
    );
    false
}

/// Submit `yaml` as `client`'s user and wait for its end; the view and the log.
async fn run_task(client: &Client, root: &Path, name: &str, yaml: &str) -> (TaskState, String) {
    let task = submit(client, root, name, yaml, &[]).await;
    let view = wait_terminal(client, task).await;
    let log = log_text(client, task).await;
    (view.state, log)
}

/// The value of `KEY=value` on a line of `log`.
fn field<'a>(log: &'a str, key: &str) -> Option<&'a str> {
    log.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}=")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_as_their_user_s_own_uid_never_root() {
    if !root_or_skip("tasks_run_as_their_user_s_own_uid_never_root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let base = 3_100_000;
    let daemon = start("dev", &data, &["--task-uid-base", &base.to_string()]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let bob = daemon.user_client("bob", None, "user").await;
    let yaml = "name: who\nrun: |\n  echo uid=$(id -u)\n  echo gid=$(id -g)\n  echo groups=$(id -G)\n  echo home=$HOME\n  echo user=$USER\n  echo workdir=$(stat -c '%a %u' \"$TACC_WORKDIR\")\n  echo homedir=$(stat -c '%a %u' \"$HOME\")\n  touch \"$HOME/cache-file\" && echo home-writable\n";

    let (state, log) = run_task(&alice, dir.path(), "alice-who", yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(field(&log, "uid"), Some(base.to_string().as_str()), "{log}");
    assert_eq!(field(&log, "gid"), Some(base.to_string().as_str()), "{log}");
    // No supplementary group of root's (or anyone's) survives.
    assert_eq!(
        field(&log, "groups"),
        Some(base.to_string().as_str()),
        "{log}"
    );
    assert_eq!(field(&log, "user"), Some("alice"), "{log}");
    let home = data.join("agent/users/alice");
    assert_eq!(field(&log, "home"), Some(home.to_str().unwrap()), "{log}");
    assert_eq!(
        field(&log, "workdir"),
        Some(format!("700 {base}").as_str()),
        "{log}"
    );
    assert_eq!(
        field(&log, "homedir"),
        Some(format!("700 {base}").as_str()),
        "{log}"
    );
    assert!(log.contains("home-writable"), "{log}");

    // Another user gets another uid; the first keeps theirs.
    let (state, log) = run_task(&bob, dir.path(), "bob-who", yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(
        field(&log, "uid"),
        Some((base + 1).to_string().as_str()),
        "{log}"
    );
    let (_, log) = run_task(&alice, dir.path(), "alice-again", yaml).await;
    assert_eq!(field(&log, "uid"), Some(base.to_string().as_str()), "{log}");

    // The admin's tasks are no exception: root on the server is not root on the node.
    let (state, log) = run_task(&daemon.client(), dir.path(), "admin-who", yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_ne!(field(&log, "uid"), Some("0"), "{log}");
    // The server allocates the uids; the agent keeps no table of its own.
    assert!(!data.join("agent/task-uids.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cannot_read_state_or_another_user_s_work_nor_write_the_caches() {
    if !root_or_skip("a_task_cannot_read_state_or_another_user_s_work_nor_write_the_caches") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let daemon = start("dev", &data, &["--task-uid-base", "3200000"]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let bob = daemon.user_client("bob", None, "user").await;
    let corpus = dir.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::write(corpus.join("a.txt"), "shared data\n").unwrap();

    // Bob's task keeps a private file in its working directory while it runs.
    let bobs = submit(
        &bob,
        dir.path(),
        "bob-private",
        "name: private\nrun: |\n  echo bob-model-weights > model.txt\n  echo \"workdir=$TACC_WORKDIR\"\n  sleep 300\n",
        &[],
    )
    .await;
    let bob_workdir = eventually("bob's task to print its workdir", DEADLINE, || {
        let bob = bob.clone();
        async move {
            let log = log_text(&bob, bobs).await;
            field(&log, "workdir").map(str::to_string)
        }
    })
    .await;

    let data_text = data.display().to_string();
    let script = format!(
        r#"D={data_text}
B={bob_workdir}
try() {{ if sh -c "$2" >/dev/null 2>&1; then echo "ALLOWED $1"; else echo "DENIED $1"; fi; }}
try read-database "cat $D/tacc.db"
try read-database-wal "cat $D/tacc.db-wal"
try read-admin-token "cat $D/admin.token"
try read-secret-key "cat $D/secret.key"
try list-data-dir "ls $D"
try list-logs "ls $D/logs"
try read-node-credential "cat $D/agent/node.token"
try read-uid-table "cat $D/agent/task-uids.json"
try list-agent-run "ls $D/agent/run"
try write-agent-run "touch $D/agent/run/planted"
try list-agent-dir "ls $D/agent"
try list-other-workdirs "ls $D/agent/work"
try list-bob-workdir "ls $B"
try read-bob-file "cat $B/model.txt"
try read-bob-home "ls $D/agent/users/bob"
try write-dataset "touch data/corpus/planted"
try overwrite-dataset "echo x >> data/corpus/a.txt"
try write-dataset-cache "touch $D/agent/datasets/planted"
try write-env "touch $VIRTUAL_ENV/planted"
try overwrite-env-python "echo x >> $VIRTUAL_ENV/pyvenv.cfg"
try write-env-cache "touch $D/agent/envs/planted"
try write-file-cache "touch $D/agent/files/planted"
try list-file-cache "ls $D/agent/files"
try list-chunk-cache "ls $D/agent/chunks"
try list-server-chunks "ls $D/chunks"
echo mine > mine.txt && cat mine.txt
echo more >> task.yaml && echo code-writable
cat data/corpus/a.txt
python -c 'import sys; print("python=" + sys.prefix)'
"#
    );
    let yaml = format!(
        "name: attacker\nenvironment:\n  python: \"3\"\ndatasets:\n  - {{name: corpus, source: '{}', mount: data/corpus}}\nrun: |\n{}",
        corpus.display(),
        script
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    let (state, log) = run_task(&alice, dir.path(), "attacker", &yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert!(!log.contains("ALLOWED"), "{log}");
    assert_eq!(log.matches("DENIED ").count(), 25, "{log}");
    assert!(log.contains("mine\n"), "{log}");
    assert!(log.contains("code-writable"), "{log}");
    assert!(log.contains("shared data"), "{log}");
    assert!(
        log.contains("python=") && log.contains("/agent/envs/"),
        "{log}"
    );
    assert!(!log.contains("bob-model-weights"), "{log}");
    for planted in [
        "agent/run/planted",
        "agent/datasets/planted",
        "agent/envs/planted",
        "agent/files/planted",
    ] {
        assert!(!data.join(planted).exists(), "{planted}");
    }
    alice_cannot_cancel_or_see(&alice, bobs).await;
    bob.cancel(bobs).await.unwrap();
    wait_terminal(&bob, bobs).await;
}

/// Another user's task is invisible to alice (404), so she cannot stop it either.
async fn alice_cannot_cancel_or_see(alice: &Client, bobs: TaskId) {
    assert!(alice.get_task(bobs).await.is_err());
    assert!(alice.cancel(bobs).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_path_is_read_with_the_task_s_rights_not_the_agent_s() {
    if !root_or_skip("a_dataset_path_is_read_with_the_task_s_rights_not_the_agent_s") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let daemon = start("dev", &data, &["--task-uid-base", "3300000"]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    // The server's database as a "dataset": the agent (root) could copy it, the task's
    // account cannot, so the attempt fails and nothing is cached.
    let yaml = format!(
        "name: steal\ndatasets:\n  - {{name: db, source: '{}', mount: data/db}}\nrun: cat data/db\n",
        data.join("tacc.db").display()
    );
    let task = submit(&alice, dir.path(), "steal", &yaml, &[]).await;
    let view = wait_terminal(&alice, task).await;
    assert_eq!(view.state, TaskState::Failed);
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("dataset_fetch_failed"), "{reason}");
    assert!(
        reason.contains("cannot be read by the task's account"),
        "{reason}"
    );
    let cached: Vec<_> = std::fs::read_dir(data.join("agent/datasets"))
        .unwrap()
        .flatten()
        .collect();
    assert!(cached.is_empty(), "{cached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_task_and_is_masked_in_its_log() {
    if !root_or_skip("a_secret_reaches_the_task_and_is_masked_in_its_log") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let daemon = start("dev", &data, &["--task-uid-base", "3400000"]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let value = "hf_Zq8s3cr3t-value-4711";
    alice
        .put_secret("HF_TOKEN", value.as_bytes().to_vec())
        .await
        .unwrap();
    let yaml = "name: secret\nenvironment:\n  secrets: [HF_TOKEN]\nrun: |\n  echo \"token is $HF_TOKEN.\"\n  echo \"prefix-${HF_TOKEN}-suffix\" >&2\n  test \"$HF_TOKEN\" = hf_Zq8s3cr3t-value-4711 && echo value-matches\n  test -z \"$(grep -l hf_Zq8s3cr3t /proc/self/environ 2>/dev/null)\" || echo in-environ\n";
    let (state, log) = run_task(&alice, dir.path(), "secret", yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert!(log.contains("token is ***."), "{log}");
    assert!(log.contains("prefix-***-suffix"), "{log}");
    assert!(log.contains("value-matches"), "{log}");
    assert!(log.contains("in-environ"), "{log}");
    assert!(!log.contains(value), "{log}");
    // Nor in the log files the server keeps.
    for entry in std::fs::read_dir(data.join("logs")).unwrap().flatten() {
        let text = std::fs::read(entry.path()).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(value),
            "{}",
            entry.path().display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_unix_account_is_used_and_a_missing_one_fails_the_attempt() {
    if !root_or_skip("a_mapped_unix_account_is_used_and_a_missing_one_fails_the_attempt") {
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        panic!("this test needs the `nobody` account every Linux system has");
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "[users.dave]\nunix_user = \"nobody\"\n\n[users.erin]\nunix_user = \"tacc-no-such-account-9c2\"\n",
    )
    .unwrap();
    let data = dir.path().join("d");
    let daemon = start(
        "dev",
        &data,
        &["--config", config.to_str().unwrap(), "--name", "node-x"],
    )
    .await;
    let dave = daemon.user_client("dave", None, "user").await;
    let erin = daemon.user_client("erin", None, "user").await;
    let yaml = "name: who\nrun: |\n  echo uid=$(id -u)\n  echo user=$USER\n";
    let (state, log) = run_task(&dave, dir.path(), "dave", yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(
        field(&log, "uid"),
        Some(nobody.uid.to_string().as_str()),
        "{log}"
    );
    assert_eq!(field(&log, "user"), Some("nobody"), "{log}");

    let task = submit(&erin, dir.path(), "erin", yaml, &[]).await;
    let view = wait_terminal(&erin, task).await;
    assert_eq!(view.state, TaskState::Failed);
    assert_eq!(
        view.reason.as_deref(),
        Some("launch_failed: unix account tacc-no-such-account-9c2 does not exist on node node-x")
    );
}

/// Two agents on one host (the embedded one of `taccd dev` and a second `taccd agent`
/// with its own data directory, both root) and two users. Each agent used to number users
/// from the base in its own table, so alice on one and bob on the other got the same uid:
/// alice's task read and overwrote the 0600 file bob's left in the shared /tmp, read bob's
/// secret from his running task's /proc/PID/environ, and printed it unmasked. Now the
/// server gives each user one uid for every node, each attempt has its own /tmp and
/// /dev/shm, and every running task's secrets are masked in every log of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_host_keep_two_users_apart() {
    if !root_or_skip("two_agents_on_one_host_keep_two_users_apart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let daemon = start(
        "dev",
        &data,
        &["--task-uid-base", "3600000", "--label", "host=embedded"],
    )
    .await;
    let _second = start_agent(
        &daemon,
        &dir.path().join("second"),
        &["--name", "second", "--label", "host=second"],
    );
    wait_nodes(&daemon.client(), 2).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let bob = daemon.user_client("bob", None, "user").await;
    let value = "bob-Zq8s3cr3t-4711";
    bob.put_secret("BSEC", value.as_bytes().to_vec())
        .await
        .unwrap();
    // Names no other run of this test (nor anything else) uses in the host's /tmp.
    let tag = format!("tacc-uids-{}", std::process::id());

    // Bob's task on the second agent leaves private files in /tmp and /dev/shm and keeps
    // running with his secret in its environment; its setup leaves a file for its run.
    let bob_yaml = format!(
        "name: bob-keeps\nplacement: {{labels: {{host: second}}}}\nenvironment:\n  secrets: [BSEC]\n\
         setup: echo from-setup > /tmp/{tag}-setup\nrun: |\n  \
         echo setup-saw=$(cat /tmp/{tag}-setup)\n  umask 077\n  echo bob-private > /tmp/{tag}-bob\n  echo bob-shm > /dev/shm/{tag}-bob\n  \
         echo uid=$(id -u)\n  echo pid=$$\n  echo tmp-mode=$(stat -c %a /tmp)\n  echo ready\n  sleep 300\n"
    );
    let bobs = submit(&bob, dir.path(), "bob-keeps", &bob_yaml, &[]).await;
    let bob_log = wait_log(&bob, bobs, "ready").await;
    let bob_uid = field(&bob_log, "uid").unwrap().to_string();
    let bob_pid = field(&bob_log, "pid").unwrap().to_string();
    assert_eq!(field(&bob_log, "tmp-mode"), Some("1777"), "{bob_log}");
    // Setup and run of one attempt share its /tmp.
    assert_eq!(
        field(&bob_log, "setup-saw"),
        Some("from-setup"),
        "{bob_log}"
    );

    // Alice's tasks, on the other agent and on the same one, try everything bob left.
    let probe = |host: &str, leak: bool| {
        let leak = if leak {
            format!("  echo leaked={value}\n")
        } else {
            String::new()
        };
        format!(
            "name: alice-on-{host}\nplacement: {{labels: {{host: {host}}}}}\nrun: |\n  \
             echo uid=$(id -u)\n  \
             try() {{ if sh -c \"$2\" >/dev/null 2>&1; then echo \"ALLOWED $1\"; else echo \"DENIED $1\"; fi; }}\n  \
             try see-bob-tmp \"test -e /tmp/{tag}-bob\"\n  \
             try read-bob-tmp \"cat /tmp/{tag}-bob\"\n  \
             try overwrite-bob-tmp \"test -e /tmp/{tag}-bob && echo x >> /tmp/{tag}-bob\"\n  \
             try see-bob-shm \"test -e /dev/shm/{tag}-bob\"\n  \
             try read-bob-environ \"grep -q BSEC /proc/{bob_pid}/environ\"\n  \
             echo alice-private > /tmp/{tag}-alice && cat /tmp/{tag}-alice\n{leak}"
        )
    };
    let mut alice_uids = Vec::new();
    for (host, leak) in [("embedded", false), ("second", true)] {
        let (state, log) = run_task(
            &alice,
            dir.path(),
            &format!("alice-{host}"),
            &probe(host, leak),
        )
        .await;
        assert_eq!(state, TaskState::Succeeded, "{host}: {log}");
        assert!(!log.contains("ALLOWED"), "{host}: {log}");
        assert_eq!(log.matches("DENIED ").count(), 5, "{host}: {log}");
        assert!(log.contains("alice-private"), "{host}: {log}");
        alice_uids.push(field(&log, "uid").unwrap().to_string());
        if leak {
            // Bob's secret, printed by alice's task beside his running one: masked.
            assert!(log.contains("leaked=***"), "{log}");
            assert!(!log.contains(value), "{log}");
        }
    }
    // One uid for alice on both nodes, never bob's.
    assert_eq!(alice_uids[0], alice_uids[1], "{alice_uids:?}");
    assert_ne!(alice_uids[0], bob_uid);
    // Nothing of either reached the host's /tmp or /dev/shm.
    for path in [
        format!("/tmp/{tag}-bob"),
        format!("/tmp/{tag}-alice"),
        format!("/tmp/{tag}-setup"),
        format!("/dev/shm/{tag}-bob"),
    ] {
        assert!(!Path::new(&path).exists(), "{path} is on the host");
    }
    bob.cancel(bobs).await.unwrap();
    wait_terminal(&bob, bobs).await;
}

/// A root agent's first steps of each execution (the cgroup join, the private /tmp, the
/// identity switch) run as root with the task's environment: loader variables the user
/// chose (`LD_PRELOAD` would run their library as root) must not reach them, yet the task
/// must still see them. `LD_DEBUG_OUTPUT` makes every process that honours the loader
/// variables write a file: each one must belong to the task's uid, none to root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_s_loader_variables_reach_the_task_and_no_root_process() {
    if !root_or_skip("a_task_s_loader_variables_reach_the_task_and_no_root_process") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let markers = markers_dir(dir.path());
    let daemon = start("dev", &data, &[]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let yaml = format!(
        "name: loader\nenvironment:\n  vars:\n    LD_DEBUG: files\n    LD_DEBUG_OUTPUT: {}/ld\n    \
         BASH_ENV: /nonexistent/bash-env\nrun: |\n  echo debug=$LD_DEBUG\n  \
         echo held=$(env | grep -c '^TACC_HELD_BACK_')\n  echo uid=$(/usr/bin/id -u)\n",
        markers.display()
    );
    let (state, log) = run_task(&alice, dir.path(), "loader", &yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(field(&log, "debug"), Some("files"), "{log}");
    assert_eq!(field(&log, "held"), Some("0"), "{log}");
    let uid: u32 = field(&log, "uid").unwrap().parse().unwrap();
    assert_ne!(uid, 0, "{log}");
    let written: Vec<(String, u32)> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("ld."))
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.metadata().unwrap().uid(),
            )
        })
        .collect();
    assert!(
        !written.is_empty(),
        "the task's own processes honoured no loader variable: {log}"
    );
    assert!(
        written.iter().all(|(_, owner)| *owner == uid),
        "a process not of the task's uid {uid} honoured the task's loader variables: {written:?}"
    );
}

/// The same through a run line the launcher `exec`s without a shell (`/usr/bin/env`): the
/// launcher itself, not a shell of the task, puts the loader variables back — after the
/// identity switch, so again only processes of the task's uid honour them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_s_loader_variables_reach_the_task_and_no_root_process_even_a_task_run_without_a_shell()
 {
    if !root_or_skip(
        "a_task_s_loader_variables_reach_the_task_and_no_root_process_even_a_task_run_without_a_shell",
    ) {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let markers = markers_dir(dir.path());
    let daemon = start("dev", &data, &[]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let yaml = format!(
        "name: loader-direct\nenvironment:\n  vars:\n    LD_DEBUG: files\n    LD_DEBUG_OUTPUT: {}/ld\n    \
         BASH_ENV: /nonexistent/bash-env\nrun: /usr/bin/env\n",
        markers.display()
    );
    let (state, log) = run_task(&alice, dir.path(), "loader-direct", &yaml).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert!(log.lines().any(|l| l == "LD_DEBUG=files"), "{log}");
    assert!(
        log.lines().any(|l| l == "BASH_ENV=/nonexistent/bash-env"),
        "{log}"
    );
    assert!(!log.contains("TACC_HELD_BACK_"), "{log}");
    // No shell ran: bash would have exported `_`.
    assert!(!log.lines().any(|l| l.starts_with("_=")), "{log}");
    let owners: Vec<(String, u32)> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("ld."))
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.metadata().unwrap().uid(),
            )
        })
        .collect();
    assert!(
        !owners.is_empty(),
        "the task's own process honoured no loader variable: {log}"
    );
    assert!(
        owners
            .iter()
            .all(|(_, owner)| *owner != 0 && *owner == owners[0].1),
        "a process not of the task's uid honoured the task's loader variables: {owners:?}"
    );
}

/// Attempts reuse the directories their private /tmp is mounted on (no directory made and
/// deleted per attempt), and a later attempt on a reused one sees nothing of the earlier
/// attempt's /tmp or /dev/shm: each gets a fresh tmpfs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_attempt_on_a_reused_mount_point_gets_a_fresh_private_tmp() {
    if !root_or_skip("a_later_attempt_on_a_reused_mount_point_gets_a_fresh_private_tmp") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let daemon = start("dev", &data, &[]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let first = "name: leaves\nrun: |\n  echo left > /tmp/leftover\n  echo left > /dev/shm/leftover\n  echo wrote=$(cat /tmp/leftover)\n";
    let scratch = data.join("agent").join("scratch");
    // An attempt's private /tmp is unmounted once its end is reported: then every mount
    // point is bare again (a mounted one holds `tmp/` and `shm/`).
    let unmounted = || {
        let scratch = scratch.clone();
        async move {
            std::fs::read_dir(&scratch)
                .unwrap()
                .all(|e| std::fs::read_dir(e.unwrap().path()).unwrap().count() == 0)
                .then_some(())
        }
    };
    let (state, log) = run_task(&alice, dir.path(), "leaves", first).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(field(&log, "wrote"), Some("left"), "{log}");
    eventually(
        "the first attempt's /tmp to be unmounted",
        DEADLINE,
        unmounted,
    )
    .await;
    // (Its /tmp holds one thing: the test's directory, bound back since the data
    // directory lies in the host's /tmp.)
    let second = "name: looks\nrun: |\n  echo tmp=$(test -e /tmp/leftover && echo seen || echo fresh)\n  echo shm=$(ls -A /dev/shm | wc -l)\n";
    let (state, log) = run_task(&alice, dir.path(), "looks", second).await;
    assert_eq!(state, TaskState::Succeeded, "{log}");
    assert_eq!(field(&log, "tmp"), Some("fresh"), "{log}");
    assert_eq!(field(&log, "shm"), Some("0"), "{log}");
    // One mount point served the probe and both attempts, and nothing stays mounted on
    // it (nor was anything written to it).
    eventually(
        "the second attempt's /tmp to be unmounted",
        DEADLINE,
        unmounted,
    )
    .await;
    let points: Vec<String> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(points, ["slot-0"], "{}", scratch.display());
}
