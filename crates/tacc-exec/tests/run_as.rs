//! The process runtime runs an execution as the identity it is given ([`RunAs`]): the
//! agent's tasks never run as root. Needs root to switch identities: elsewhere the tests
//! say SKIPPED loudly and pass, except in CI (`CI=true`), where not being root fails.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tacc_exec::{ExitOutcome, ProcessExecutor, RunAs, contract};

/// Two identities no account on a test machine is expected to have.
const ALICE: RunAs = RunAs {
    uid: 54_321,
    gid: 54_321,
};
const BOB: RunAs = RunAs {
    uid: 54_322,
    gid: 54_322,
};

fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: must run as root in CI, to switch to an unprivileged identity");
    }
    use std::io::Write;
    let _ = write!(
        std::io::stderr(),
        "\n######## SKIPPED {test}: not root, so the process runtime cannot switch identities.\n######## Run the tests as root (scripts/test.sh in CI does) to check that tasks never run as root.\n"
    );
    false
}

/// A fresh directory owned by `who`, mode 0700, as the agent makes working directories.
fn private_dir(who: RunAs) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(who.uid), Some(who.gid)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Run `script` in `workdir` as `who`; its output (stdout and stderr) and how it ended.
async fn run_as(who: RunAs, workdir: &Path, script: &str) -> (String, ExitOutcome) {
    let mut spec = contract::spec(workdir, script);
    spec.placement.run_as = Some(who);
    let (tx, mut rx) = tacc_exec::output_channel();
    let handle = tacc_exec::Executor::launch(&ProcessExecutor::new(), spec, tx)
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), handle.wait())
        .await
        .expect("the script ends");
    let mut text = String::new();
    while let Some(line) = rx.recv().await {
        text.push_str(&line.text);
        text.push('\n');
    }
    (text, outcome)
}

#[tokio::test]
async fn a_process_runs_as_the_given_identity_without_root_s_groups() {
    if !root_or_skip("a_process_runs_as_the_given_identity_without_root_s_groups") {
        return;
    }
    let workdir = private_dir(ALICE);
    let (out, outcome) = run_as(
        ALICE,
        workdir.path(),
        "echo uid=$(id -u) gid=$(id -g) groups=$(id -G)\ngrep '^Groups:' /proc/self/status\necho hi > own.txt && echo wrote-own",
    )
    .await;
    assert_eq!(outcome, ExitOutcome::Exited(0), "{out}");
    assert!(out.contains("uid=54321 gid=54321 groups=54321\n"), "{out}");
    // No supplementary group of root's survives the switch.
    assert!(
        out.lines()
            .any(|l| l.starts_with("Groups:") && l["Groups:".len()..].trim().is_empty()),
        "{out}"
    );
    assert!(out.contains("wrote-own"), "{out}");
    let meta = std::fs::metadata(workdir.path().join("own.txt")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), ALICE.uid);
}

#[tokio::test]
async fn an_unprivileged_process_cannot_read_root_s_or_another_identity_s_files() {
    if !root_or_skip("an_unprivileged_process_cannot_read_root_s_or_another_identity_s_files") {
        return;
    }
    // A root-owned directory others may traverse, holding a private file (the agent's
    // data directory and its credential are like this).
    let agent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let credential = agent.path().join("credential");
    std::fs::write(&credential, "node-secret\n").unwrap();
    std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o600)).unwrap();
    let alice = private_dir(ALICE);
    std::fs::write(alice.path().join("model.txt"), "alice's\n").unwrap();
    std::os::unix::fs::chown(
        alice.path().join("model.txt"),
        Some(ALICE.uid),
        Some(ALICE.gid),
    )
    .unwrap();
    let bob = private_dir(BOB);
    let script = format!(
        "cat {credential} || echo credential-denied\ncat {model} || echo model-denied\nls {alice} || echo list-denied\ntouch {agent}/planted || echo plant-denied\necho mine > mine.txt && cat mine.txt",
        credential = credential.display(),
        model = alice.path().join("model.txt").display(),
        alice = alice.path().display(),
        agent = agent.path().display(),
    );
    let (out, outcome) = run_as(BOB, bob.path(), &script).await;
    assert_eq!(outcome, ExitOutcome::Exited(0), "{out}");
    for denied in [
        "credential-denied",
        "model-denied",
        "list-denied",
        "plant-denied",
    ] {
        assert!(out.contains(denied), "{denied} missing from:\n{out}");
    }
    assert!(out.contains("Permission denied"), "{out}");
    assert!(!out.contains("node-secret"), "{out}");
    assert!(!out.contains("alice's"), "{out}");
    assert!(!agent.path().join("planted").exists());
    assert!(out.contains("mine\n"), "{out}");
}

#[tokio::test]
async fn a_working_directory_the_identity_cannot_enter_fails_the_launch_cleanly() {
    if !root_or_skip("a_working_directory_the_identity_cannot_enter_fails_the_launch_cleanly") {
        return;
    }
    // Root's 0700 directory: the switch happens before the child enters it.
    let rootdir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(rootdir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut spec = contract::spec(rootdir.path(), "echo never");
    spec.placement.run_as = Some(ALICE);
    let (tx, _rx) = tacc_exec::output_channel();
    let error = tacc_exec::Executor::launch(&ProcessExecutor::new(), spec, tx)
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "launch_failed", "{error}");
    assert!(error.to_string().contains("ermission denied"), "{error}");
}
