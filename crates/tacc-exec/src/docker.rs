//! The container runtime: one Docker container per execution, through the Docker Engine
//! API on a Unix socket. The working directory (and the user directory, datasets and
//! environments) are bind-mounted at the same paths, so `TACC_WORKDIR` and every path the
//! compiler wrote mean the same inside and outside; outputs are simply files left there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::lines::LineSplitter;
use crate::{
    ExecError, ExecutionHandle, Executor, ExitOutcome, LaunchSpec, OutputSender, Stream,
    handle_parts,
};
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptionsBuilder, ListContainersOptions,
    LogsOptions, RemoveContainerOptions, WaitContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures::StreamExt;

/// Label naming the agent (its data directory) that started a container: a restarted
/// agent removes the containers it left, and only those.
pub const LABEL_OWNER: &str = "tacc.owner";
const LABEL_TASK: &str = "tacc.task";
const LABEL_ATTEMPT: &str = "tacc.attempt";
const LABEL_RANK: &str = "tacc.node_rank";

/// Docker Engine 20.10 speaks API 1.41 and newer engines still accept it; a fixed version
/// saves a negotiation round trip per call and has everything we use (DeviceRequests).
const API_VERSION: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// Variables the agent passes on from its own machine that describe that machine, not
/// the task: inside a container the image's own values (say a PATH with /opt/conda/bin)
/// win over them.
const IMAGE_OWNED_VARS: &[&str] = &["PATH", "HOME", "SHELL", "USER", "LOGNAME"];

/// How long one Engine API request may take before the engine counts as not answering.
const REQUEST_TIMEOUT_SECS: u64 = 30;

/// How long a pull may take; without a reachable registry it fails fast, and a slow one
/// must not hold the attempt forever.
const PULL_LIMIT: Duration = Duration::from_secs(300);

/// Runs each execution in a fresh container of the spec's image (or the default image),
/// removed when it ends.
#[derive(Debug, Clone)]
pub struct DockerExecutor {
    socket: String,
    owner: String,
    default_image: Option<String>,
}

impl DockerExecutor {
    /// An executor talking to the engine at `socket` (a path, e.g. /var/run/docker.sock);
    /// `owner` labels its containers (use something unique to the agent, like its data
    /// directory). Nothing is contacted until it is used.
    pub fn new(socket: impl Into<String>, owner: impl Into<String>) -> Self {
        DockerExecutor {
            socket: socket.into(),
            owner: owner.into(),
            default_image: None,
        }
    }

    /// The image for executions whose spec names none.
    pub fn with_default_image(mut self, image: Option<String>) -> Self {
        self.default_image = image;
        self
    }

    pub fn default_image(&self) -> Option<&str> {
        self.default_image.as_deref()
    }

    fn client(&self) -> Result<Docker, ExecError> {
        Docker::connect_with_unix(&self.socket, REQUEST_TIMEOUT_SECS, &API_VERSION)
            .map_err(|e| self.unavailable(e))
    }

    fn unavailable(&self, error: impl std::fmt::Display) -> ExecError {
        ExecError::RuntimeUnavailable {
            runtime: "container",
            detail: format!("Docker engine at {}: {error}", self.socket),
        }
    }

    /// Whether the engine answers; `Err` says why not.
    pub async fn ping(&self) -> Result<(), ExecError> {
        let docker = self.client()?;
        match tokio::time::timeout(Duration::from_secs(5), docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.unavailable(e)),
            Err(_) => Err(self.unavailable("no answer within 5s")),
        }
    }

    /// Stop and remove every container this owner started (after a crash of the agent,
    /// their attempts are lost anyway). Returns how many were removed.
    pub async fn remove_leftovers(&self) -> Result<usize, ExecError> {
        let docker = self.client()?;
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_OWNER}={}", self.owner)],
        )]);
        let containers = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| self.unavailable(e))?;
        let mut removed = 0;
        for container in containers {
            let Some(id) = container.id else { continue };
            if remove(&docker, &id).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Make sure the image is on the node: take it from the engine, else pull it. Returns
    /// the image's own environment (`KEY=value`).
    async fn ensure_image(&self, docker: &Docker, image: &str) -> Result<Vec<String>, ExecError> {
        match docker.inspect_image(image).await {
            Ok(inspect) => return Ok(inspect.config.and_then(|c| c.env).unwrap_or_default()),
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(self.unavailable(e)),
        }
        let (repository, tag) = split_image(image);
        let pull = async {
            let mut progress = docker.create_image(
                Some(CreateImageOptions {
                    from_image: Some(repository.to_string()),
                    tag: Some(tag.to_string()),
                    ..Default::default()
                }),
                None,
                None,
            );
            while let Some(step) = progress.next().await {
                step?;
            }
            Ok::<(), DockerError>(())
        };
        let not_found = |detail: String| ExecError::ImageNotFound {
            image: image.to_string(),
            detail,
        };
        match tokio::time::timeout(PULL_LIMIT, pull).await {
            Ok(Ok(())) => Ok(docker
                .inspect_image(image)
                .await
                .ok()
                .and_then(|i| i.config)
                .and_then(|c| c.env)
                .unwrap_or_default()),
            Ok(Err(e)) => Err(not_found(format!("pull failed: {e}"))),
            Err(_) => Err(not_found(format!(
                "pull did not finish within {}s",
                PULL_LIMIT.as_secs()
            ))),
        }
    }

    fn container_body(
        &self,
        spec: &LaunchSpec,
        image: &str,
        image_env: &[String],
    ) -> ContainerCreateBody {
        let placement = &spec.placement;
        let workdir = spec.workdir.display().to_string();
        let mut binds = vec![format!("{workdir}:{workdir}")];
        for (path, writable) in &placement.extra_mounts {
            if path.exists() {
                let path = path.display();
                binds.push(format!(
                    "{path}:{path}:{}",
                    if *writable { "rw" } else { "ro" }
                ));
            }
        }
        let mut labels = HashMap::from([(LABEL_OWNER.to_string(), self.owner.clone())]);
        labels.insert(LABEL_TASK.into(), spec.owner.task.to_string());
        labels.insert(LABEL_ATTEMPT.into(), spec.owner.attempt.to_string());
        labels.insert(LABEL_RANK.into(), spec.owner.node_rank.to_string());
        let device_requests = (!placement.gpu_indices.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(
                    placement
                        .gpu_indices
                        .iter()
                        .map(|i| i.to_string())
                        .collect(),
                ),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        // The task's own identity when the agent gave one (its working directory belongs
        // to it); else the agent's, so files the task writes into the bind-mounted
        // directories can be uploaded and cleaned up. Never the image's default (root).
        let user = match placement.run_as {
            Some(run_as) => format!("{}:{}", run_as.uid, run_as.gid),
            None => format!(
                "{}:{}",
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw()
            ),
        };
        ContainerCreateBody {
            image: Some(image.to_string()),
            // bash when the image has it (the process runtime's shell), else POSIX sh.
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
            cmd: Some(vec![
                "if command -v bash >/dev/null 2>&1; then exec bash -c \"$1\"; else exec sh -c \"$1\"; fi"
                    .into(),
                spec.label.clone(),
                spec.script.clone(),
            ]),
            env: Some(container_env(spec, image_env)),
            working_dir: Some(workdir),
            user: Some(user),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: Some(binds),
                nano_cpus: (placement.cpu_millis > 0)
                    .then(|| placement.cpu_millis as i64 * 1_000_000),
                memory: (placement.memory_bytes > 0).then_some(placement.memory_bytes as i64),
                device_requests,
                // Multi-node tasks reach each other at the node's address, as processes do.
                network_mode: Some("host".into()),
                // An init as PID 1 forwards SIGTERM to the task and reaps what it leaves.
                init: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The task's variables, with the image's values for [`IMAGE_OWNED_VARS`] it sets.
fn container_env(spec: &LaunchSpec, image_env: &[String]) -> Vec<String> {
    let mut env = spec.env.clone();
    for entry in image_env {
        if let Some((key, value)) = entry.split_once('=') {
            if IMAGE_OWNED_VARS.contains(&key) {
                env.insert(key.to_string(), value.to_string());
            }
        }
    }
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// `repo[:tag]` (a `:` in a registry's port is not a tag) → (repo, tag).
fn split_image(image: &str) -> (&str, &str) {
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(colon) => (
            &image[..name_start + colon],
            &image[name_start + colon + 1..],
        ),
        None => (image, "latest"),
    }
}

async fn remove(docker: &Docker, id: &str) -> Result<(), DockerError> {
    docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
}

#[async_trait::async_trait]
impl Executor for DockerExecutor {
    fn kind(&self) -> crate::RuntimeKind {
        crate::RuntimeKind::Container
    }

    fn honours_run_as(&self) -> bool {
        true
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError> {
        spec.require_workdir()?;
        let image = spec
            .placement
            .image
            .clone()
            .or_else(|| self.default_image.clone())
            .ok_or_else(|| {
                ExecError::Container(
                    "no image: set `environment.image` in the task file or start the agent with --container-image".into(),
                )
            })?;
        let docker = self.client()?;
        let image_env = self.ensure_image(&docker, &image).await?;
        let created = docker
            .create_container(
                Some(CreateContainerOptions::default()),
                self.container_body(&spec, &image, &image_env),
            )
            .await
            .map_err(|e| match e {
                DockerError::DockerResponseServerError {
                    status_code: 400..=499,
                    message,
                } => ExecError::Container(message),
                other => self.unavailable(other),
            })?;
        let id = created.id;
        if let Err(e) = docker
            .start_container(
                &id,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
        {
            let _ = remove(&docker, &id).await;
            return Err(match e {
                DockerError::DockerResponseServerError {
                    status_code: 400..=499,
                    message,
                } => ExecError::Container(message),
                other => self.unavailable(other),
            });
        }
        let logs = docker.logs(
            &id,
            Some(LogsOptions {
                follow: true,
                stdout: true,
                stderr: true,
                tail: "all".into(),
                ..Default::default()
            }),
        );
        let reader = tokio::spawn(forward_logs(logs, output));
        // The container's own cgroup, so the agent samples it like a process's.
        let usage = docker
            .inspect_container(
                &id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()
            .and_then(|c| c.state?.pid)
            .and_then(|pid| u32::try_from(pid).ok())
            .and_then(|pid| container_usage(std::path::Path::new(CGROUP_MOUNT), pid));
        // Sessions (`tcloud exec`, `shell`) enter through the engine, as the task.
        let entry = crate::enter::Entry {
            pid: 0,
            cgroup: None,
            workdir: spec.workdir.clone(),
            env: spec.env.clone(),
            run_as: spec.placement.run_as,
            private_mounts: false,
            via: crate::enter::Via::Container {
                socket: self.socket.clone(),
                container: id.clone(),
            },
        };
        let (cancel, exit_tx, exit_rx) = handle_parts();
        let token = cancel.clone();
        let resizer: Arc<dyn crate::resize::Resizer> = Arc::new(crate::resize::DockerResizer {
            docker: docker.clone(),
            container: id.clone(),
        });
        tokio::spawn(async move {
            let time_limit = async {
                match spec.time_limit {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let wait = wait_exit(&docker, &id);
            tokio::pin!(wait);
            let outcome = tokio::select! {
                code = &mut wait => exit_outcome(&docker, &id, code).await,
                _ = token.cancelled() => {
                    stop(&docker, &id, spec.stop_signal, spec.kill_grace).await;
                    ExitOutcome::Cancelled
                }
                _ = time_limit => {
                    stop(&docker, &id, spec.stop_signal, spec.kill_grace).await;
                    ExitOutcome::TimeLimit
                }
            };
            // The log stream ends with the container; every line is out before the end.
            let _ = reader.await;
            let _ = remove(&docker, &id).await;
            let _ = exit_tx.send(outcome);
        });
        Ok(ExecutionHandle::new(None, cancel, exit_rx)
            .with_resizer(Some(resizer))
            .with_usage(usage)
            .with_entry(Some(entry)))
    }

    /// Containers of a previous life of this agent: their attempts are lost (the agent
    /// reports them so when it registers), so they are removed rather than adopted.
    async fn recover(&self) -> Vec<crate::RecoveredExecution> {
        match self.remove_leftovers().await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!("removed {n} container(s) left by a previous run of this agent")
            }
            Err(e) => tracing::debug!("no leftover containers checked: {e}"),
        }
        Vec::new()
    }
}

/// Where the cgroup hierarchy is mounted on the agent's machine.
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The cgroup a container's main process `pid` runs in, read for samples only: found
/// through `/proc/PID/cgroup` (the memory controller's line on v1, the single line on
/// v2), so the engine's cgroup driver (cgroupfs or systemd) does not matter. `None` when
/// it cannot be found (another PID namespace, no hierarchy).
fn container_usage(mount: &std::path::Path, pid: u32) -> Option<crate::cgroups::UsageReader> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = container_cgroup_path(&table)?;
    let path = std::path::Path::new(path.trim_start_matches('/'));
    let parent = path.parent()?.to_str()?;
    let leaf = path.file_name()?.to_str()?;
    let cgroups = crate::cgroups::detect_at(mount, parent).ok()?;
    let cgroup = cgroups.open(leaf)?;
    Some(crate::cgroups::UsageReader::new(Arc::from(cgroup)))
}

/// The cgroup path in a `/proc/PID/cgroup` table: the v1 memory controller's, else the
/// unified (v2) one.
fn container_cgroup_path(table: &str) -> Option<&str> {
    let entries: Vec<(&str, &str)> = table
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?, parts.next()?))
        })
        .collect();
    entries
        .iter()
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "memory"))
        .or_else(|| {
            entries
                .iter()
                .find(|(controllers, _)| controllers.is_empty())
        })
        .map(|(_, path)| *path)
        .filter(|path| *path != "/")
}

/// The container's exit code; `None` when the engine stopped answering.
async fn wait_exit(docker: &Docker, id: &str) -> Option<i64> {
    let mut wait = docker.wait_container(id, None::<WaitContainerOptions>);
    match wait.next().await {
        Some(Ok(response)) => Some(response.status_code),
        // bollard reports a non-zero exit as an error carrying the code.
        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Some(code),
        _ => None,
    }
}

async fn exit_outcome(docker: &Docker, id: &str, code: Option<i64>) -> ExitOutcome {
    let Some(code) = code else {
        return ExitOutcome::Infrastructure {
            reason: "runtime_unavailable".into(),
            message: "lost contact with the Docker engine while the task ran".into(),
        };
    };
    let oom = docker
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.oom_killed)
        .unwrap_or(false);
    if oom {
        return ExitOutcome::Infrastructure {
            reason: "out_of_memory".into(),
            message: "the container reached its memory limit (resources.memory) and was killed"
                .into(),
        };
    }
    // A shell reports death by signal N as 128+N; the init does the same for the task.
    match code {
        129..=159 => ExitOutcome::Signalled(code as i32 - 128),
        code => ExitOutcome::Exited(code as i32),
    }
}

/// The stop signal (`checkpoint.signal`, SIGTERM by default), then SIGKILL once the grace
/// is over. Sent with the engine's kill, not its stop: a stop's signal parameter needs API
/// 1.42, and older engines (Debian 12's 20.10 speaks 1.41) ignore it and send SIGTERM, so a
/// task waiting for its checkpoint signal would never get it.
async fn stop(docker: &Docker, id: &str, signal: nix::sys::signal::Signal, grace: Duration) {
    let signalled = docker
        .kill_container(
            id,
            Some(
                KillContainerOptionsBuilder::new()
                    .signal(signal.as_str())
                    .build(),
            ),
        )
        .await;
    if signalled.is_ok()
        && tokio::time::timeout(grace, wait_exit(docker, id))
            .await
            .is_ok()
    {
        return;
    }
    let _ = docker
        .kill_container(
            id,
            Some(KillContainerOptionsBuilder::new().signal("SIGKILL").build()),
        )
        .await;
    let _ = wait_exit(docker, id).await;
}

/// Split the engine's log frames into lines per stream, as the process runtime does.
async fn forward_logs(
    logs: impl futures::Stream<Item = Result<bollard::container::LogOutput, DockerError>>,
    output: OutputSender,
) {
    use bollard::container::LogOutput;
    tokio::pin!(logs);
    let mut splitters = [
        LineSplitter::new(Stream::Stdout),
        LineSplitter::new(Stream::Stderr),
    ];
    while let Some(Ok(frame)) = logs.next().await {
        let (index, bytes) = match frame {
            LogOutput::StdOut { message } | LogOutput::Console { message } => (0, message),
            LogOutput::StdErr { message } => (1, message),
            LogOutput::StdIn { .. } => continue,
        };
        if !splitters[index].push(&bytes, &output).await {
            return;
        }
    }
    for splitter in &mut splitters {
        splitter.finish(&output).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_s_cgroup_is_found_under_either_driver_and_version() {
        let v1 = "12:pids:/docker/abc\n9:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
        assert_eq!(container_cgroup_path(v1), Some("/docker/abc"));
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            container_cgroup_path(v2),
            Some("/system.slice/docker-abc.scope")
        );
        assert_eq!(container_cgroup_path("0::/\n"), None);
    }

    #[test]
    fn a_container_gets_exactly_the_task_s_limits_and_gpus() {
        let executor = DockerExecutor::new("/nonexistent.sock", "agent-a");
        let mut spec = crate::contract::spec(std::path::Path::new("/work/task-1"), "true");
        spec.placement.cpu_millis = 2500;
        spec.placement.memory_bytes = 1 << 30;
        spec.placement.gpu_indices = vec![1, 3];
        spec.owner.task = tacc_core::TaskId(7);
        spec.owner.attempt = tacc_core::AttemptNo(2);
        let image_env = [
            "PATH=/opt/conda/bin:/usr/bin".to_string(),
            "LANG=C".to_string(),
        ];
        let body = executor.container_body(&spec, "img:1", &image_env);
        let host = body.host_config.unwrap();
        assert_eq!(host.nano_cpus, Some(2_500_000_000));
        assert_eq!(host.memory, Some(1 << 30));
        let gpus = host.device_requests.unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].driver.as_deref(), Some("nvidia"));
        assert_eq!(
            gpus[0].device_ids,
            Some(vec!["1".to_string(), "3".to_string()])
        );
        assert_eq!(host.binds.unwrap()[0], "/work/task-1:/work/task-1");
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_OWNER], "agent-a");
        assert_eq!(labels[LABEL_TASK], "7");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(body.working_dir.as_deref(), Some("/work/task-1"));
        let env = body.env.unwrap();
        assert!(env.contains(&"GREETING=hello from env".to_string()));
        // The image's PATH wins over the agent's; its other variables the engine applies.
        assert!(
            env.contains(&"PATH=/opt/conda/bin:/usr/bin".to_string()),
            "{env:?}"
        );
        assert!(!env.iter().any(|e| e.starts_with("LANG=")), "{env:?}");
    }

    #[test]
    fn a_container_runs_as_the_task_s_identity_when_given_one() {
        let executor = DockerExecutor::new("/nonexistent.sock", "agent-a");
        let mut spec = crate::contract::spec(std::path::Path::new("/w"), "true");
        spec.placement.run_as = Some(crate::RunAs {
            uid: 200_007,
            gid: 200_007,
        });
        let body = executor.container_body(&spec, "img", &[]);
        assert_eq!(body.user.as_deref(), Some("200007:200007"));
        // Without one, the agent's own identity (never the image's default, root).
        spec.placement.run_as = None;
        let body = executor.container_body(&spec, "img", &[]);
        let me = format!(
            "{}:{}",
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw()
        );
        assert_eq!(body.user.as_deref(), Some(me.as_str()));
    }

    #[test]
    fn no_gpus_means_no_device_request_and_no_limits_means_none_set() {
        let executor = DockerExecutor::new("/nonexistent.sock", "agent-a");
        let spec = crate::contract::spec(std::path::Path::new("/w"), "true");
        let host = executor
            .container_body(&spec, "img", &[])
            .host_config
            .unwrap();
        assert_eq!(host.device_requests, None);
        assert_eq!(host.nano_cpus, None);
        assert_eq!(host.memory, None);
    }

    #[test]
    fn image_names_split_into_repository_and_tag() {
        assert_eq!(split_image("busybox"), ("busybox", "latest"));
        assert_eq!(split_image("tacc/busybox:1.36"), ("tacc/busybox", "1.36"));
        assert_eq!(
            split_image("registry:5000/team/img"),
            ("registry:5000/team/img", "latest")
        );
        assert_eq!(
            split_image("registry:5000/team/img:v2"),
            ("registry:5000/team/img", "v2")
        );
    }
}
