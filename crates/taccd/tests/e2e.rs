//! End to end on one machine: real `taccd` processes, real task processes, real SQLite,
//! real sockets. Each test runs its own daemon on a free port with its own data dir.

mod common;

use common::*;
use futures::StreamExt;
use tacc_core::{AttemptNo, TaskState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_with_live_logs_events_and_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();
    let task = submit(
        &client,
        dir.path(),
        "hello",
        "name: hello\nrun: |\n  echo \"rank $TACC_NODE_RANK of $WORLD_SIZE task $TACC_TASK_ID attempt $TACC_ATTEMPT\"\n  cat data.txt\n  echo oops >&2\n  mkdir -p results && echo '{\"loss\": 0.1}' > results/metrics.json\n  head -c 20000000 /dev/zero > results/checkpoint.bin\noutputs: [results/]\n",
        &[("data.txt", "payload line\n")],
    )
    .await;
    // Following the log from the start ends only when the task has ended.
    let mut stream = client.follow_logs(task, 0).await.unwrap();
    let mut followed = Vec::new();
    while let Some(chunk) = stream.next().await {
        followed.extend_from_slice(&chunk.unwrap());
    }
    let followed = String::from_utf8(followed).unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.exit_code, Some(0));
    assert!(
        followed.contains(&format!("rank 0 of 1 task {task} attempt 1")),
        "{followed}"
    );
    assert!(
        followed.contains("payload line") && followed.contains("oops"),
        "{followed}"
    );
    assert_eq!(
        followed,
        log_text(&client, task).await,
        "follow and read give the same log"
    );

    // Resuming from an offset returns exactly the rest.
    let (rest, end) = client.logs(task, 5).await.unwrap();
    assert_eq!(&followed.as_bytes()[5..], &rest[..]);
    assert_eq!(end as usize, followed.len());

    let events: Vec<TaskState> = client
        .task_events(task)
        .await
        .unwrap()
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        events,
        vec![
            TaskState::Queued,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Succeeded
        ]
    );

    let outputs = client.list_outputs(task).await.unwrap();
    let listed: Vec<(&str, u64)> = outputs.iter().map(|o| (o.path.as_str(), o.size)).collect();
    assert_eq!(
        listed,
        vec![
            ("results/checkpoint.bin", 20_000_000),
            ("results/metrics.json", 14)
        ]
    );
    let checkpoint = client
        .get_output(task, AttemptNo(1), "results/checkpoint.bin")
        .await
        .unwrap();
    assert_eq!(checkpoint.len(), 20_000_000, "large outputs stream through");
    let bytes = client
        .get_output(task, AttemptNo(1), "results/metrics.json")
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"{\"loss\": 0.1}\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_say_why_and_retries_make_new_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();

    let exits = submit(
        &client,
        dir.path(),
        "exits",
        "name: exits\nrun: exit 3\n",
        &[],
    )
    .await;
    let slow = submit(
        &client,
        dir.path(),
        "slow",
        "name: slow\nresources: {time_limit: 1s}\nrun: sleep 30\n",
        &[],
    )
    .await;
    let setup = submit(
        &client,
        dir.path(),
        "setup",
        "name: setup\nsetup: exit 7\nrun: echo never\n",
        &[],
    )
    .await;
    let retried = submit(
        &client,
        dir.path(),
        "retried",
        "name: retried\nretry: {max_attempts: 2, on: [failed]}\nrun: |\n  echo attempt $TACC_ATTEMPT\n  test \"$TACC_ATTEMPT\" = 2\n",
        &[],
    )
    .await;

    let view = wait_terminal(&client, exits).await;
    assert_eq!((view.state, view.exit_code), (TaskState::Failed, Some(3)));
    assert_eq!(view.reason.as_deref(), Some("exit code 3"));

    let view = wait_terminal(&client, slow).await;
    assert_eq!(view.state, TaskState::Failed);
    assert_eq!(view.reason.as_deref(), Some("time limit reached"));

    let view = wait_terminal(&client, setup).await;
    assert_eq!(view.state, TaskState::Failed);
    assert!(
        view.reason.as_deref().unwrap().starts_with("setup_failed"),
        "{view:?}"
    );
    assert!(!log_text(&client, setup).await.contains("never"));

    let view = wait_terminal(&client, retried).await;
    assert_eq!(
        (view.state, view.attempt),
        (TaskState::Succeeded, AttemptNo(2)),
        "{view:?}"
    );
    let log = log_text(&client, retried).await;
    assert!(
        log.contains("attempt 1") && log.contains("attempt 2"),
        "{log}"
    );
    let states = attempt_states(&client, retried).await;
    assert!(
        states.contains(&(1, TaskState::Failed)) && states.contains(&(2, TaskState::Queued)),
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_are_refused_and_nothing_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();
    // What the cluster can hold is known once its node is up.
    wait_nodes(&client, 1).await;
    let snapshot = {
        std::fs::create_dir_all(dir.path().join("code")).unwrap();
        upload(&client, &dir.path().join("code")).await
    };
    let spec = |value: serde_json::Value| tacc_proto::SubmitTask {
        translated: Vec::new(),
        spec: value,
        snapshot: snapshot.clone(),
        source: None,
        wait_for_capacity: false,
    };
    let err = client
        .submit(&spec(
            serde_json::json!({"name": "x", "run": "true", "bogus": 1}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("invalid_task"), "{err}");
    assert!(err.to_string().contains("bogus"), "{err}");
    // A request no node can hold is refused at submit, with the scheduler's reason and
    // the field at fault, rather than accepted and failed at once.
    let never_fits = client
        .submit(&spec(
            serde_json::to_value(
                tacc_schema::parse_task(
                    "t.yaml",
                    "name: huge\nresources: {cpus: 4000}\nrun: 'true'\n",
                )
                .unwrap()
                .0,
            )
            .unwrap(),
        ))
        .await
        .unwrap_err();
    assert_eq!(never_fits.code(), Some("invalid_task"), "{never_fits}");
    assert!(
        never_fits
            .to_string()
            .contains("can never fit this cluster")
            && never_fits.to_string().contains("resources.cpus"),
        "{never_fits}"
    );
    let unknown = client
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::json!({"name": "x", "run": "true"}),
            snapshot: "f".repeat(64).parse().unwrap(),
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err();
    assert!(
        unknown.to_string().contains("upload the code first"),
        "{unknown}"
    );
    let tasks = client.list_tasks(&Default::default()).await.unwrap();
    assert!(tasks.is_empty(), "a refused task was queued: {tasks:?}");
}
