//! Adaptive allocation through the [`TestEnv`]: usage samples of a CPU-bound attempt move
//! its allocation in the reports' own turn (committed with it, handed to its node), and a
//! change its agent cannot apply is undone and ends its adaptation. The decisions have
//! table tests in `handlers/resize.rs`; these drive them through the control plane.

use std::time::Duration;

use tacc_proto::{AgentReport, AttemptRef};
use tacc_store::{ResizeRecord, TaskChange};

use super::test_env::{FakeAgent, TestEnv, only};
use crate::clock::Clock;

const GIB: u64 = 1 << 30;

/// A sample of rank 0 of `attempt` using all of its 1-CPU quota, throttled half the time.
fn cpu_bound(env: &TestEnv, attempt: AttemptRef) -> AgentReport {
    AgentReport::Usage(
        serde_json::from_value(serde_json::json!({
            "attempt": attempt,
            "node_rank": 0,
            "at": env.clock.now(),
            "started_at": env.clock.now(),
            "cpu_millis_used": 1000,
            "cpu_quota_millis": 1000,
            "cpu_throttled_fraction": 0.5,
            "memory_bytes": GIB / 4,
            "memory_limit_bytes": GIB,
        }))
        .expect("a usage sample"),
    )
}

/// The resizes among the changes committed since the last look.
fn resizes(env: &TestEnv) -> Vec<ResizeRecord> {
    env.take_changes()
        .into_iter()
        .filter_map(|change| match change {
            TaskChange::Resized(resize) => Some(resize),
            _ => None,
        })
        .collect()
}

/// `seconds` pass in steps of 5, the agent reporting a CPU-bound sample at each.
async fn cpu_bound_for(env: &TestEnv, agent: &FakeAgent, attempt: AttemptRef, seconds: u64) {
    for _ in 0..seconds / 5 {
        env.advance(Duration::from_secs(5));
        assert_eq!(
            env.report(agent, vec![cpu_bound(env, attempt)]).await,
            (1, 0)
        );
    }
}

#[tokio::test]
async fn a_cpu_bound_attempt_grows_and_a_change_its_agent_cannot_apply_is_undone_for_good() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 4).await;
    let (_, attempt) = env
        .running(
            &mut agent,
            "name: t\nrun: x\nresources: {cpus: 1, memory: 1GiB}\nadaptive: {cpus: 1..2}\n",
        )
        .await;
    env.take_changes();
    cpu_bound_for(&env, &agent, attempt, 45).await;
    let [grown] = &resizes(&env)[..] else {
        panic!("one change once the window is CPU-bound");
    };
    assert!(
        grown.cpu_millis > 1000 && grown.cpu_millis <= 2000,
        "{grown:?}"
    );
    assert!(grown.reason.starts_with("adaptive: "), "{grown:?}");
    let assigned = env.poll(&mut agent).await;
    assert_eq!(only(&assigned), attempt);
    let allocation = assigned[0]
        .allocation
        .expect("the new allocation is desired work");
    assert_eq!(allocation.cpu_millis, grown.cpu_millis);

    let failed = AgentReport::Resized {
        attempt,
        cpu_millis: grown.cpu_millis,
        memory_bytes: grown.memory_bytes,
        error: Some("the cgroup refused the quota".into()),
    };
    assert_eq!(env.report(&agent, vec![failed]).await, (1, 0));
    let [undone] = &resizes(&env)[..] else {
        panic!("the change is undone");
    };
    assert_eq!(undone.cpu_millis, 1000);
    assert!(
        undone.reason.contains("n1 could not apply")
            && undone
                .reason
                .ends_with("back to the previous allocation, no further changes"),
        "{undone:?}"
    );
    let assigned = env.poll(&mut agent).await;
    assert_eq!(assigned[0].allocation.map(|a| a.cpu_millis), Some(1000));
    // Adaptation of this attempt ended: however CPU-bound it stays, nothing moves.
    cpu_bound_for(&env, &agent, attempt, 120).await;
    assert!(resizes(&env).is_empty());
}
