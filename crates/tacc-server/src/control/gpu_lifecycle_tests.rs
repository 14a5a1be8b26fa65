//! GPU waste through the [`TestEnv`]: hung gangs ended by their `on_hang` policy (or the
//! cluster's), the operator's idle-GPU policy over recorded utilisation series, and idle
//! GPU-hours recomputed from the samples. The rules themselves have table tests in
//! `rules/hangs.rs` and `rules/idle_gpus.rs`; these drive them through the control plane.

use std::time::Duration;

use tacc_core::TaskState::*;
use tacc_core::{TaskId, Timestamp};
use tacc_proto::AttemptRef;

use super::lifecycle_tests::assert_reason;
use super::test_env::{FakeAgent, TestEnv, only};
use crate::clock::Clock;

/// A 3-node gang whose rank 2 exited 0 at once while ranks 0–1 sit silent or compute.
struct EarlyExitGang {
    task: TaskId,
    attempt: AttemptRef,
    agents: Vec<FakeAgent>,
    started: Timestamp,
}

impl EarlyExitGang {
    async fn start(env: &TestEnv, on_hang: &str) -> EarlyExitGang {
        let mut agents = Vec::new();
        for name in ["n1", "n2", "n3"] {
            agents.push(env.join(name, 1).await);
        }
        let task = env
            .submit(&format!(
                "name: g\nresources: {{nodes: 3, cpus: 1}}\n{on_hang}run: true\n"
            ))
            .await;
        let mut attempt = None;
        for agent in agents.iter_mut() {
            attempt = Some(only(&env.poll(agent).await));
        }
        let attempt = attempt.unwrap();
        for agent in &agents {
            env.report(agent, vec![env.started(attempt)]).await;
        }
        env.finish(&mut agents[2], attempt, 0).await;
        let started = env.clock.now();
        EarlyExitGang {
            task,
            attempt,
            agents,
            started,
        }
    }

    /// Ranks 0 and 1 report a sample: computing (`busy`), or alive with no output and no
    /// CPU.
    async fn sample(&self, env: &TestEnv, busy: bool) {
        for (rank, agent) in self.agents.iter().take(2).enumerate() {
            let sample = env.sampled(self.attempt, rank as u32, self.started, busy);
            env.report(agent, vec![sample]).await;
        }
    }

    /// `rounds` of: a sample, 5 s, a liveness check.
    async fn run(&self, env: &TestEnv, rounds: usize, busy: bool) {
        for _ in 0..rounds {
            self.sample(env, busy).await;
            env.advance(Duration::from_secs(5));
            env.check_liveness().await;
        }
    }
}

#[tokio::test]
async fn a_hung_gang_is_ended_naming_the_rank_that_exited_and_retried_when_asked() {
    let env = TestEnv::new().await;
    let mut gang = EarlyExitGang::start(&env, "on_hang: {after: 60s, then: retry}\n").await;
    for _ in 0..11 {
        gang.run(&env, 1, false).await;
        assert_eq!(
            env.state(gang.task).await,
            Running,
            "not before 60 s of silence"
        );
    }
    env.advance(Duration::from_secs(6));
    gang.sample(&env, false).await;
    env.check_liveness().await;
    let record = env.task(gang.task).await;
    assert_eq!((record.state, record.attempt.0), (Queued, 2), "retried");
    let ended = env.events(gang.task).await;
    let failed = ended
        .iter()
        .find(|e| e.state == Failed)
        .expect("a failed event");
    let reason = failed.reason.as_deref().unwrap();
    assert!(
        reason.starts_with("hung: rank 2 exited 0 at ")
            && reason.ends_with("; ranks 0–1 silent for 1m1s (no output, no CPU or GPU use)"),
        "{reason}"
    );
    // The silent ranks are withdrawn from their nodes.
    let attempt = gang.attempt;
    for agent in gang.agents.iter_mut().take(2) {
        let work = env.poll(agent).await;
        assert!(work.iter().all(|a| a.attempt != attempt), "{work:?}");
    }
}

#[tokio::test]
async fn a_gang_that_computes_is_never_ended_and_the_cluster_default_fails_a_hung_one() {
    let env = TestEnv::configured(|c| c.hang_after = Some(Duration::from_secs(60))).await;
    let gang = EarlyExitGang::start(&env, "").await;
    gang.run(&env, 30, true).await;
    assert_eq!(
        env.state(gang.task).await,
        Running,
        "busy ranks are not hung"
    );
    // They fall silent: the cluster's default ends the attempt, failed.
    let quiet_from = env.clock.now();
    gang.run(&env, 14, false).await;
    assert!(env.clock.now().millis_since(quiet_from) >= 60_000);
    let record = env.task(gang.task).await;
    assert_eq!(record.state, Failed);
    assert_reason(&record, "hung: rank 2 exited 0 at ");
}

#[tokio::test]
async fn on_hang_off_leaves_a_silent_gang_alone() {
    let env = TestEnv::configured(|c| c.hang_after = Some(Duration::from_secs(60))).await;
    let gang = EarlyExitGang::start(&env, "on_hang: off\n").await;
    gang.run(&env, 30, false).await;
    assert_eq!(env.state(gang.task).await, Running);
}

fn idle_policy(then: super::IdleGpuAction) -> super::IdleGpuPolicy {
    super::IdleGpuPolicy {
        below_percent: 5,
        idle_for: Duration::from_secs(60),
        then,
        grace: Duration::from_secs(30),
        exempt: vec!["exempted".into()],
    }
}

const ONE_GPU: &str = "name: gpu\nresources: {cpus: 1, gpus: 1}\ncheckpoint: {signal: SIGUSR1, grace: 5s}\nrun: train\n";

/// [`ONE_GPU`] with a webhook.
const ONE_GPU_NOTIFIED: &str = "name: gpu\nresources: {cpus: 1, gpus: 1}\ncheckpoint: {signal: SIGUSR1, grace: 5s}\nnotify: {webhook: \"https://hooks.example.com/tacc\", secret: HOOK_KEY}\nrun: train\n";

/// `agent` runs a one-GPU task whose GPU reads `series` percent, one sample every 5 s,
/// with a liveness check after each; its task and attempt.
async fn gpu_series(
    env: &TestEnv,
    agent: &mut super::test_env::FakeAgent,
    attempt: tacc_proto::AttemptRef,
    started: tacc_core::Timestamp,
    series: &[u32],
) {
    for utilization in series {
        env.report(agent, vec![env.gpu_sampled(attempt, started, *utilization)])
            .await;
        env.advance(Duration::from_secs(5));
        env.check_liveness().await;
        env.poll(agent).await;
    }
}

#[tokio::test]
async fn idle_gpus_are_warned_of_then_checkpointed_and_requeued() {
    let env = TestEnv::configured(|c| {
        c.idle_gpu = Some(idle_policy(super::IdleGpuAction::CheckpointAndRequeue))
    })
    .await;
    let mut agent = env.join_gpus("g1", 2, 1).await;
    // The webhook's signing key (only its existence matters here: no call is sent).
    env.control
        .store
        .put_secret(tacc_store::SecretRecord {
            user: "alice".into(),
            name: "HOOK_KEY".into(),
            nonce: vec![0; 12],
            ciphertext: vec![0; 16],
            updated_at: env.clock.now(),
        })
        .await
        .unwrap();
    let (task, attempt) = env.running(&mut agent, ONE_GPU_NOTIFIED).await;
    let started = env.clock.now();
    // Busy for a minute, then idle: 12 samples (60 s) idle is the warning.
    gpu_series(&env, &mut agent, attempt, started, &[90; 12]).await;
    assert!(!env.log(task).contains("idle"), "{}", env.log(task));
    gpu_series(&env, &mut agent, attempt, started, &[1; 13]).await;
    let log = env.log(task);
    assert!(
        log.contains(
            "tacc: its GPUs have been idle (below 5%) for 1 min; the cluster's policy will \
             checkpoint and requeue it in 30s unless they are used"
        ),
        "{log}"
    );
    let usage = crate::usage::UsageService::of(&env.control)
        .task_usage(&env.control, task)
        .await
        .unwrap();
    assert!(
        usage.flags.iter().any(|f| f.kind == "idle_gpu"),
        "{:?}",
        usage.flags
    );
    assert_eq!(env.state(task).await, Running, "warned, not yet acted on");
    // The owner's webhook is called with the warning, before anything is done.
    let calls = env
        .control
        .store
        .due_deliveries(env.clock.now(), 10)
        .await
        .unwrap();
    let warning: serde_json::Value = calls
        .iter()
        .map(|call| serde_json::from_str(&call.body).unwrap())
        .find(|body: &serde_json::Value| body["event"] == "task.warning")
        .unwrap_or_else(|| panic!("no warning call among {calls:?}"));
    assert_eq!(warning["kind"], "idle_gpu");
    assert_eq!(warning["task"]["id"], task.0);
    assert!(
        warning["message"]
            .as_str()
            .is_some_and(|m| m.contains("idle (below 5%) for 1 min")),
        "{warning}"
    );
    // Still idle after the grace: the attempt is withdrawn (the agent stops it with its
    // checkpoint signal) and, once stopped, queued again as attempt 2.
    gpu_series(&env, &mut agent, attempt, started, &[0; 7]).await;
    assert!(!agent.running.contains(&attempt), "withdrawn from its node");
    env.report(
        &agent,
        vec![tacc_proto::AgentReport::Finished {
            attempt,
            at: env.clock.now(),
            outcome: tacc_proto::AttemptOutcome::Cancelled,
            rank: None,
        }],
    )
    .await;
    let record = env.task(task).await;
    assert_eq!(record.attempt.0, 2, "{record:?}");
    let events = env.events(task).await;
    let requeued = events
        .iter()
        .find(|e| e.state == Queued && e.attempt.0 == 2)
        .expect("queued again as attempt 2");
    let reason = requeued.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("idle GPUs: used below 5% for 1 min and 30s after a warning")
            && reason.ends_with("(attempt 1)"),
        "{reason}"
    );
}

#[tokio::test]
async fn gpus_used_again_lift_the_warning_and_exempt_users_are_left_alone() {
    let env =
        TestEnv::configured(|c| c.idle_gpu = Some(idle_policy(super::IdleGpuAction::Cancel))).await;
    let mut agent = env.join_gpus("g1", 2, 1).await;
    let (task, attempt) = env.running(&mut agent, ONE_GPU).await;
    let started = env.clock.now();
    gpu_series(&env, &mut agent, attempt, started, &[0; 13]).await;
    assert!(env.log(task).contains("idle (below 5%)"));
    gpu_series(&env, &mut agent, attempt, started, &[80; 10]).await;
    assert!(
        env.log(task).contains("its GPUs are used again"),
        "{}",
        env.log(task)
    );
    assert_eq!(env.state(task).await, Running);
    // Idle long enough again, past the grace: cancelled, saying why.
    gpu_series(&env, &mut agent, attempt, started, &[0; 22]).await;
    let record = env.task(task).await;
    assert_eq!(record.state, Cancelled);
    assert_reason(&record, "idle GPUs: used below 5%");
}

#[tokio::test]
async fn idle_gpu_hours_are_what_the_samples_say_was_not_used() {
    let env = TestEnv::new().await;
    let mut agent = env.join_gpus("g1", 2, 1).await;
    let task = env.submit(ONE_GPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.started(attempt)]).await;
    let started = env.clock.now();
    // A recorded series, one sample every 2 s; recomputed here on its own.
    let series = [100, 100, 40, 0, 0, 0, 75, 100, 0, 10];
    let mut expected_busy_ms = 0u64;
    for utilization in series {
        env.advance(Duration::from_secs(2));
        env.report(&agent, vec![env.gpu_sampled(attempt, started, utilization)])
            .await;
        expected_busy_ms += u64::from(utilization) * 2_000 / 100;
    }
    env.advance(Duration::from_secs(2));
    env.finish(&mut agent, attempt, 0).await;
    let record = env.task(task).await;
    let held_ms = record
        .finished_at
        .unwrap()
        .millis_since(record.started_at.unwrap());
    let caller = crate::auth::UserCaller {
        name: "admin".into(),
        group: None,
        role: tacc_core::Role::Admin,
        token: 0,
    };
    let day = 86_400_000;
    let iso = |t: u64| {
        time::OffsetDateTime::from_unix_timestamp((t / 1000) as i64)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let now = env.clock.now().0;
    let report = crate::accounting::Accounting::of(&env.control)
        .usage_report(
            &caller,
            &tacc_proto::UsageQuery {
                since: Some(iso(now - day)),
                until: Some(iso(now + day)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let row = &report.rows[0];
    let hour = 3_600_000.0;
    let allocated = row.gpu_hours;
    assert!((allocated - held_ms as f64 / hour).abs() < 1e-3, "{row:?}");
    let used = expected_busy_ms as f64 / hour;
    assert!(
        (row.gpu_used_hours - used).abs() < 1e-9,
        "{row:?} vs {used}"
    );
    assert!(
        (row.gpu_idle_hours - (allocated - used)).abs() < 1e-9,
        "{row:?}"
    );
    assert!(row.gpu_idle_hours > 0.0);
}
