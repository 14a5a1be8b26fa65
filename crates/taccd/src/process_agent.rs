//! A process agent's life in `taccd` (`taccd agent`, the embedded cluster's agent and a
//! pilot's): the node's capacity and name, its credential, its task cgroups, the optional
//! container runtime, and its watchdog process — then `tacc_agent::Agent` runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tacc_agent::{Agent, AgentConfig};
use tacc_core::Resources;
use tokio_util::sync::CancellationToken;

use crate::NodeArgs;

const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// The container runtime this node offers, if any (see `--docker-socket`).
async fn container_runtime(node: &NodeArgs, data_dir: &Path) -> Option<tacc_exec::DockerExecutor> {
    // The owner label is the agent's data directory: unique per agent on a machine.
    let owner = std::fs::canonicalize(data_dir)
        .unwrap_or_else(|_| data_dir.to_path_buf())
        .display()
        .to_string();
    let executor = |socket: &str| {
        tacc_exec::DockerExecutor::new(socket, owner.clone())
            .with_default_image(node.container_image.clone())
    };
    match &node.docker_socket {
        Some(socket) => Some(executor(&socket.display().to_string())),
        None => {
            let docker = executor(DEFAULT_DOCKER_SOCKET);
            match docker.ping().await {
                Ok(()) => Some(docker),
                Err(why) => {
                    tracing::info!("no container runtime on this node: {why}");
                    None
                }
            }
        }
    }
}

pub(crate) async fn run_agent(
    client: tacc_client::Client,
    data_dir: &Path,
    join_token: Option<String>,
    node: NodeArgs,
    shutdown: CancellationToken,
) -> Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let (detected, detected_type) = tacc_agent::detect_capacity();
    let gpus = node.gpus.unwrap_or(detected.gpus);
    let gpu_type = gpu_type_offered(node.gpus, detected.gpus, detected_type, &node.gpu_type)?;
    let capacity = Resources::new(
        node.cpus
            .map_or(detected.cpu_millis, |c| (c * 1000.0).round() as u64),
        node.memory.map_or(detected.memory_bytes, |m| m.as_bytes()),
        gpus,
    );
    let name = match node.name.clone() {
        Some(name) => name,
        None => crate::host_name(),
    };
    let config = AgentConfig {
        name,
        data_dir: data_dir.to_path_buf(),
        capacity,
        gpu_type,
        labels: node
            .labels
            .iter()
            .cloned()
            .chain(crate::pilot_node::labels_from_env()?)
            .collect(),
        address: match &node.address {
            Some(address) => address.clone(),
            None => address_towards(client.base_url())?,
        },
        poll_wait: Duration::from_secs(20),
        keep_workdirs: node.keep_workdirs,
        work_dir: node.work_dir.clone(),
        env_cache_bytes: node.env_cache_size.as_bytes(),
    };
    let stored = tacc_agent::stored_credential(data_dir)?;
    // With a stored credential, a join token is kept for a re-enrolment the server may ask
    // for (the node changed its name or grew).
    let (token, enrol_token) = match (stored, join_token) {
        (Some(stored), Some(join)) if credential_refused(&client, &stored).await => {
            tracing::warn!(
                "the server refuses this node's stored credential (an admin removed the node, \
                 or revoked it): registering again with the join token"
            );
            (Some(join), None)
        }
        (Some(stored), join) => (Some(stored), join),
        (None, join) => (join, None),
    };
    let client = match token {
        Some(token) => client.with_token(token),
        None => anyhow::bail!(
            "this agent has no credential: give it a join token, which an admin makes with \
             `taccd admin agent-token`; {}",
            crate::join_token::HOW_TO_PASS
        ),
    };
    let cgroups: Arc<dyn tacc_exec::cgroups::Cgroups> = Arc::from(agent_cgroups(data_dir));
    let mut processes = tacc_exec::ProcessExecutor::with_cgroups(cgroups.clone());
    match launcher() {
        Ok(launcher) => processes = processes.with_launcher(launcher),
        Err(error) => tracing::warn!(
            "executions start through a chain of sh, setpriv, env and bash ({error:#})"
        ),
    }
    let gpu_probe = tacc_agent::choose_probe(
        node.gpus,
        config.gpu_type.clone(),
        node.fake_gpu_readings.clone(),
    );
    let mut agent = Agent::new(client, config, Arc::new(processes))?.with_gpu_probe(gpu_probe);
    if let Some(join) = enrol_token {
        agent = agent.with_enrol_token(join);
    }
    match start_watchdog(data_dir) {
        Ok(pipe) => agent = agent.with_watchdog(pipe),
        Err(error) => tracing::warn!(
            "no watchdog for this agent ({error:#}): should it die, its tasks run on until it \
             is started again"
        ),
    }
    if let Some(docker) = container_runtime(&node, data_dir).await {
        tracing::info!("container runtime: Docker engine at the configured socket");
        agent = agent.with_container_runtime(docker);
    }
    agent.run(shutdown).await;
    cgroups.close();
    Ok(())
}

/// The program executions start as (`tacc_exec::launcher`): `tacc-launch` beside this
/// binary (small, so quick to start), else this binary itself (`taccd launch`).
fn launcher() -> Result<PathBuf> {
    let this = std::env::current_exe().context("cannot find the taccd binary")?;
    let small = this.with_file_name("tacc-launch");
    Ok(if small.is_file() { small } else { this })
}

/// Start this agent's watchdog (`taccd agent-watchdog`), a process of its own (and its
/// own process group, so a signal to the agent's group leaves it to act); returns the pipe
/// the agent pings it through.
fn start_watchdog(data_dir: &Path) -> Result<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    let program = std::env::current_exe().context("cannot find the taccd binary")?;
    let mut child = std::process::Command::new(program)
        .arg("agent-watchdog")
        .arg("--data-dir")
        .arg(data_dir)
        // The watchdog needs no join token.
        .env_remove(crate::join_token::JOIN_TOKEN_ENV)
        .env_remove(crate::join_token::OLD_JOIN_TOKEN_ENV)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot start the agent's watchdog")?;
    child.stdin.take().context("no pipe to the watchdog")
}

/// The watchdog's life: until the agent's pipe ends (see `tacc_agent::watchdog`).
pub(crate) fn run_watchdog(data_dir: &Path) {
    let cgroups = tacc_exec::cgroups::detect(&agent_cgroup_name(data_dir));
    tacc_agent::watchdog::watch(
        std::io::stdin(),
        &data_dir.join("run"),
        cgroups.as_ref(),
        |verdict, killed| match verdict {
            tacc_agent::watchdog::Verdict::AgentGone if killed > 0 => tracing::warn!(
                "watchdog: the agent of {} is gone; killed what it left running ({killed} \
                 process groups and processes)",
                data_dir.display()
            ),
            tacc_agent::watchdog::Verdict::AgentGone => {}
            tacc_agent::watchdog::Verdict::AgentSilent(silence) => tracing::warn!(
                "watchdog: the agent of {} has not answered for {silence:?}; killed its \
                 {killed} task process groups so that none runs twice",
                data_dir.display()
            ),
        },
    );
}

/// The local address this machine's traffic to the server at `url` leaves from: the
/// address the server (and so the other nodes of its network) reach this node at.
pub(crate) fn address_towards(url: &str) -> Result<String> {
    let parsed = url::Url::parse(url).with_context(|| format!("bad server URL `{url}`"))?;
    let server = parsed
        .socket_addrs(|| None)
        .with_context(|| format!("cannot resolve the server's address in `{url}`"))?
        .into_iter()
        .next()
        .with_context(|| format!("the server's host in `{url}` has no address"))?;
    let unspecified: std::net::SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    // Connecting a UDP socket sends nothing; it only asks the kernel for the route.
    let socket = std::net::UdpSocket::bind(unspecified)?;
    socket.connect(server).with_context(|| {
        format!("no route to the server at {server}; give this node's address with --address")
    })?;
    Ok(socket.local_addr()?.ip().to_string())
}

/// True when the server answers that `credential` is not valid (revoked or unknown); an
/// unreachable server or any other answer keeps the credential.
async fn credential_refused(client: &tacc_client::Client, credential: &str) -> bool {
    let probe = client.clone().with_token(credential.to_string());
    matches!(
        probe.whoami().await,
        Err(tacc_client::ClientError::Api { status: 401, .. })
    )
}

/// The GPU type the node offers: `--gpu-type` when given (it needs GPUs to describe:
/// found through NVML, or `--gpus N` fake ones), else what NVML reported.
pub(crate) fn gpu_type_offered(
    asked_gpus: Option<u32>,
    detected_gpus: u32,
    detected_type: Option<String>,
    asked_type: &Option<String>,
) -> Result<Option<String>> {
    let Some(asked) = asked_type else {
        return Ok(detected_type);
    };
    match asked_gpus {
        Some(0) => anyhow::bail!(
            "--gpu-type {asked} names the model of the GPUs offered, but --gpus is 0; drop --gpu-type or offer some GPUs with --gpus N"
        ),
        None if detected_gpus == 0 => anyhow::bail!(
            "--gpu-type {asked} needs GPUs to describe, and NVML found none on this machine; offer fake ones with --gpus N --gpu-type {asked}"
        ),
        _ => Ok(Some(asked.clone())),
    }
}

/// This agent's part of the machine's cgroup hierarchy, `tacc/agent-<H(data dir)>` (one
/// per agent data directory, the same across restarts), with what a previous life left
/// there killed and removed before anything runs. Where no hierarchy is writable, tasks
/// run in process groups only (said once in the log).
fn agent_cgroups(data_dir: &Path) -> Box<dyn tacc_exec::cgroups::Cgroups> {
    let cgroups = tacc_exec::cgroups::detect(&agent_cgroup_name(data_dir));
    let killed = cgroups.remove_stale();
    if killed > 0 {
        tracing::warn!("killed {killed} processes left in the cgroups of a previous run");
    }
    tracing::info!("task cgroups: {}", cgroups.version());
    // v1 makes an execution's cgroup as one directory per controller, the largest part
    // of a trivial task's isolation cost: emptied ones are reused (checked, limits
    // rewritten, counters from zero; `tacc_exec::cgroups::CgroupPool`). v2's single
    // directory is cheap to make and is not pooled.
    if cgroups.version() == "v1" {
        return Box::new(tacc_exec::cgroups::CgroupPool::new(
            Arc::from(cgroups),
            tacc_exec::cgroups::DEFAULT_POOL_SIZE,
        ));
    }
    cgroups
}

/// `tacc/agent-<H(canonical data dir)>`: one per agent data directory, the same across
/// restarts.
fn agent_cgroup_name(data_dir: &Path) -> String {
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex();
    format!("tacc/agent-{}", &hash[..12])
}
