//! The executor contract against a real Docker engine (scripts/ci/setup-docker.sh starts
//! one and builds the `tacc-test/busybox` image). Without an engine the tests say SKIPPED
//! loudly and pass — except in CI (`CI=true`), where a missing engine is a failure.

use std::time::Duration;

use tacc_exec::{DockerExecutor, ExecError, Executor, contract};

const SOCKET: &str = "/var/run/docker.sock";
const TEST_IMAGE: &str = "tacc-test/busybox:latest";

/// The label value that marks this test's containers: each test its own, because the
/// tests run at once and count or look up their containers by it.
fn owner_of(test: &str) -> String {
    format!("tacc-exec-contract-{}-{test}", std::process::id())
}

async fn docker_or_skip(test: &str) -> Option<DockerExecutor> {
    let owner = owner_of(test);
    let executor =
        DockerExecutor::new(SOCKET, owner).with_default_image(Some(TEST_IMAGE.to_string()));
    match executor.ping().await {
        Ok(()) => Some(executor),
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "{test}: Docker is required in CI but is not usable ({why}); run scripts/ci/setup-docker.sh"
                );
            }
            use std::io::Write;
            let _ = write!(
                std::io::stderr(),
                "\n######## SKIPPED {test}: no Docker engine here ({why}).\n######## Run `sudo scripts/ci/setup-docker.sh` (or scripts/test.sh as root) to test against real Docker.\n"
            );
            None
        }
    }
}

#[tokio::test]
async fn docker_executor_meets_the_contract() {
    let Some(executor) = docker_or_skip("docker_executor_meets_the_contract").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    contract::run_all(&executor, dir.path()).await;
    contract::stop_signal_comes_first_with_its_grace(&executor, dir.path()).await;
    // Every container of the suite is gone once its execution ended.
    assert_eq!(executor.remove_leftovers().await.unwrap(), 0);
}

#[tokio::test]
async fn a_missing_image_is_image_not_found() {
    let Some(executor) = docker_or_skip("a_missing_image_is_image_not_found").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut spec = contract::spec(dir.path(), "true");
    spec.placement.image = Some("tacc-test/no-such-image:never".into());
    let (tx, _rx) = tacc_exec::output_channel();
    let launched = tokio::time::timeout(Duration::from_secs(120), executor.launch(spec, tx))
        .await
        .expect("a missing image must not hang");
    let err = launched.unwrap_err();
    assert_eq!(err.reason(), "image_not_found", "{err}");
    assert!(!err.is_infrastructure());
}

#[tokio::test]
async fn an_engine_that_does_not_answer_is_an_infrastructure_failure() {
    let dir = tempfile::tempdir().unwrap();
    let executor =
        DockerExecutor::new(dir.path().join("no-docker.sock").display().to_string(), "x")
            .with_default_image(Some(TEST_IMAGE.to_string()));
    assert!(executor.ping().await.is_err());
    let (tx, _rx) = tacc_exec::output_channel();
    let err = executor
        .launch(contract::spec(dir.path(), "true"), tx)
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::RuntimeUnavailable { .. }), "{err}");
    assert!(err.is_infrastructure());
    assert_eq!(err.reason(), "runtime_unavailable");
}

/// Adaptive allocation through Docker's update API: a running container's CPU and
/// memory limits change, as `docker inspect` then shows.
#[tokio::test]
async fn a_running_container_s_limits_change_live() {
    let Some(executor) = docker_or_skip("a_running_container_s_limits_change_live").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut spec = contract::spec(dir.path(), "sleep 120");
    spec.placement.cpu_millis = 500;
    spec.placement.memory_bytes = 64 << 20;
    let (tx, _rx) = tacc_exec::output_channel();
    let handle = executor.launch(spec, tx).await.unwrap();
    let reader = handle
        .usage_reader()
        .expect("a container's cgroup is read for samples");
    let resizer = handle.resizer().expect("a container can be resized");
    resizer.resize(1500, 256 << 20).await.unwrap();
    let docker = bollard::Docker::connect_with_unix(SOCKET, 120, bollard::API_DEFAULT_VERSION)
        .expect("the socket answered the ping");
    let owner = owner_of("a_running_container_s_limits_change_live");
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![format!("{}={owner}", tacc_exec::LABEL_OWNER)],
    )]);
    let containers = docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap();
    let id = containers
        .iter()
        .find_map(|c| c.id.clone())
        .expect("the container runs");
    let inspected = docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let host = inspected.host_config.expect("a host config");
    assert_eq!(host.nano_cpus, Some(1_500_000_000));
    assert_eq!(host.memory, Some(256 << 20));
    // The samples see the container's cgroup, with the limits in force now.
    let usage = reader.read();
    assert_eq!(usage.memory_limit_bytes, Some(256 << 20), "{usage:?}");
    assert_eq!(usage.cpu_quota_millis, Some(1500), "{usage:?}");
    assert!(usage.memory_bytes.is_some_and(|m| m > 0), "{usage:?}");
    // Below what it uses, or a malformed limit, is refused and said.
    let refused = resizer.resize(1500, 1 << 10).await;
    assert!(refused.is_err(), "{refused:?}");
    handle.cancel();
    handle.wait().await;
}
