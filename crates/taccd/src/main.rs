//! `taccd`: the TACC daemon. `taccd server` runs the control plane, `taccd agent` a node
//! agent, and `taccd dev` both in one process (the embedded single-machine cluster that
//! `tcloud up` starts). A thin binary: all behaviour lives in `tacc-server` and
//! `tacc-agent`.

mod admin;
mod slurm_agent;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use tacc_agent::{Agent, AgentConfig};
use tacc_core::{ByteSize, HumanDuration, Resources};
use tacc_server::{Control, ServerConfig};
use tacc_store::SqliteStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "taccd",
    version,
    about = "The TACC daemon: control plane, node agent, or both in one process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Control plane and a local agent in one process: the embedded single-machine cluster.
    ///
    /// Example: taccd dev --data-dir ~/.local/share/tacc/local --listen 127.0.0.1:8383
    Dev {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        agent: NodeArgs,
    },
    /// The control plane alone; agents on other machines connect to it.
    ///
    /// Example: taccd server --data-dir /var/lib/tacc --listen 0.0.0.0:8383 --tls-cert
    /// /var/lib/tacc/tls/cert.pem --tls-key /var/lib/tacc/tls/key.pem (see `taccd admin
    /// tls-init`)
    Server {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A node agent that runs tasks for the server at --server.
    ///
    /// Example: taccd agent --server https://head:8383 --server-fingerprint HEX --data-dir /var/lib/tacc-agent
    Agent {
        /// URL of the control plane.
        #[arg(long, env = "TACC_SERVER")]
        server: String,
        #[command(flatten)]
        tls: tls::AgentTlsArgs,
        /// Where the agent keeps working directories and caches.
        #[arg(long)]
        data_dir: PathBuf,
        #[command(flatten)]
        node: NodeArgs,
        /// How tasks run: `process` (on this machine) or `slurm` (as Slurm jobs, from a
        /// login node: every node of the partition becomes a TACC node).
        #[arg(long, default_value = "process", value_parser = ["process", "slurm"])]
        backend: String,
        #[command(flatten)]
        slurm: slurm_agent::SlurmArgs,
    },
    /// Operator commands on a server's data directory.
    #[command(subcommand)]
    Admin(admin::Admin),
}

#[derive(Debug, Args)]
struct ServerArgs {
    /// Where the database, logs, chunks and outputs live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free port (written to DATA_DIR/taccd.json).
    #[arg(long, default_value = "127.0.0.1:8383")]
    listen: SocketAddr,
    /// Seconds without a poll after which an agent, and what it ran, is lost.
    #[arg(long, default_value_t = 30)]
    heartbeat_timeout: u64,
    /// Scheduler configuration (TOML): `policy`, `[users.NAME]`, `[groups.NAME]`,
    /// `[fairshare]`, `[preemption]`; see docs/SCHEDULING.md.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Scheduling policy; overrides the configuration file's `policy`.
    #[arg(long)]
    policy: Option<String>,
    /// Register a dataset tasks can name as `source: NAME`: NAME=/shared/path or
    /// NAME=https://host/file (repeatable).
    #[arg(long = "dataset", value_name = "NAME=SOURCE", value_parser = parse_dataset)]
    datasets: Vec<(String, String)>,
    /// How long chunks no committed snapshot references are kept (e.g. 7d, 12h, 30s).
    #[arg(long, default_value = "7d")]
    chunk_retention: HumanDuration,
    #[command(flatten)]
    tls: tls::ServerTlsArgs,
}

/// `NAME=SOURCE` where SOURCE is an absolute path or an http(s) URL.
fn parse_dataset(text: &str) -> Result<(String, String), String> {
    let (name, source) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not NAME=SOURCE, e.g. mnist=/shared/datasets/mnist"))?;
    let (name, source) = (name.trim(), source.trim());
    if name.is_empty() || name.contains('/') || name.contains(':') {
        return Err(format!(
            "dataset name `{name}` must be non-empty and contain no `/` or `:`"
        ));
    }
    match tacc_compiler::DatasetSource::of(source) {
        tacc_compiler::DatasetSource::Registered => Err(format!(
            "dataset `{name}`: source `{source}` must be an absolute path or an http(s):// URL"
        )),
        _ => Ok((name.to_string(), source.to_string())),
    }
}

/// The server's configuration file: the scheduling policy and the scheduler's settings
/// (users and their groups, limits, shares, priority caps).
#[derive(Debug, serde::Deserialize)]
struct ConfigFile {
    policy: Option<String>,
    #[serde(flatten)]
    scheduler: toml::Table,
}

fn load_config(args: &ServerArgs) -> Result<(String, tacc_scheduler::SchedulerConfig)> {
    let (mut policy, scheduler) = match &args.config {
        None => (None, tacc_scheduler::SchedulerConfig::default()),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("cannot read the configuration file {}", path.display())
            })?;
            let file: ConfigFile = toml::from_str(&text)
                .with_context(|| format!("{} is not valid TOML", path.display()))?;
            let scheduler =
                tacc_scheduler::SchedulerConfig::deserialize(toml::Value::Table(file.scheduler))
                    .with_context(|| {
                        format!(
                            "{}: invalid scheduler settings (see docs/SCHEDULING.md)",
                            path.display()
                        )
                    })?;
            (file.policy, scheduler)
        }
    };
    if args.policy.is_some() {
        policy = args.policy.clone();
    }
    Ok((
        policy.unwrap_or_else(|| tacc_server::DEFAULT_POLICY.to_string()),
        scheduler,
    ))
}

#[derive(Debug, Args)]
struct NodeArgs {
    /// Node name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// CPUs offered to tasks (default: all).
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory offered to tasks, e.g. 16GiB (default: all).
    #[arg(long)]
    memory: Option<ByteSize>,
    /// GPUs offered to tasks (default: as found by nvidia-smi).
    #[arg(long)]
    gpus: Option<u32>,
    /// Address other nodes reach this one at (default: 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// Keep attempts' working directories after they end.
    #[arg(long)]
    keep_workdirs: bool,
    /// Size of the node's managed-environment cache; idle environments beyond it are
    /// evicted, least recently used first.
    #[arg(long, default_value = "50GiB")]
    env_cache_size: ByteSize,
    /// Docker engine socket for the container runtime (tasks with `environment.image`).
    /// Named explicitly, the runtime is offered even while the engine is down (such tasks
    /// then fail over or fail as `runtime_unavailable`); by default it is offered when
    /// /var/run/docker.sock answers at start.
    #[arg(long)]
    docker_socket: Option<PathBuf>,
    /// Run tasks that name no image in this image (isolation, best effort: when the engine
    /// is down they run as processes, and the task's log says so).
    #[arg(long)]
    container_image: Option<String>,
}

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

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TACC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        match cli.command {
            Command::Dev { server, agent } => run_dev(server, agent, shutdown).await,
            Command::Server { server } => run_server(server, shutdown).await.map(|_| ()),
            Command::Agent {
                server,
                tls,
                data_dir,
                node,
                backend,
                slurm,
            } => {
                let client = tls.client(&server)?;
                match backend.as_str() {
                    "slurm" => {
                        slurm_agent::run(client, &data_dir, slurm, node.keep_workdirs, shutdown)
                            .await
                    }
                    _ => run_agent(client, &data_dir, node, shutdown).await,
                }
            }
            Command::Admin(command) => admin::run(command).await,
        }
    })
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down");
        shutdown.cancel();
    });
}

/// Start the control plane; returns its URL and the serving task.
async fn start_server(
    args: &ServerArgs,
    shutdown: CancellationToken,
) -> Result<(String, tokio::task::JoinHandle<std::io::Result<()>>)> {
    args.tls.check_exposure(args.listen, &args.data_dir)?;
    let tls = args.tls.load()?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}",
            args.data_dir.display()
        )
    })?;
    let store = SqliteStore::open(&args.data_dir.join("tacc.db")).await?;
    let mut config = ServerConfig::new(args.data_dir.clone());
    config.heartbeat_timeout = Duration::from_secs(args.heartbeat_timeout);
    (config.policy, config.scheduler) = load_config(args)?;
    config.datasets = args.datasets.iter().cloned().collect();
    config.chunk_retention = Duration::from_secs(args.chunk_retention.as_secs());
    let control = Control::open(Arc::new(store), config).await?;
    let listener = TcpListener::bind(args.listen).await.with_context(|| {
        format!(
            "cannot listen on {}: is another taccd running there? Pick another address with --listen",
            args.listen
        )
    })?;
    let address = listener.local_addr()?;
    let url = format!(
        "{}://{address}",
        if tls.is_some() { "https" } else { "http" }
    );
    write_endpoint(&args.data_dir, &url)?;
    let serving = match tls {
        Some(tls) => {
            let fingerprint = tacc_client::tls::fingerprint(tls.certificate_der());
            tracing::info!(
                "control plane listening on {url} (certificate SHA-256 fingerprint {fingerprint})"
            );
            tokio::spawn(tacc_server::serve_tls(control, listener, tls, shutdown))
        }
        None => {
            tracing::info!("control plane listening on {url}");
            tokio::spawn(tacc_server::serve(control, listener, shutdown))
        }
    };
    Ok((url, serving))
}

/// Tell clients where we listen (matters when port 0 was asked for).
fn write_endpoint(data_dir: &Path, url: &str) -> Result<()> {
    let endpoint = serde_json_string(url);
    let path = data_dir.join("taccd.json");
    let partial = data_dir.join("taccd.json.partial");
    std::fs::write(
        &partial,
        format!("{{\"pid\": {}, \"url\": {endpoint}}}\n", std::process::id()),
    )?;
    std::fs::rename(&partial, &path)?;
    Ok(())
}

fn serde_json_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

async fn run_server(args: ServerArgs, shutdown: CancellationToken) -> Result<()> {
    let (_, serving) = start_server(&args, shutdown).await?;
    serving.await??;
    Ok(())
}

async fn run_dev(server: ServerArgs, node: NodeArgs, shutdown: CancellationToken) -> Result<()> {
    let (url, serving) = start_server(&server, shutdown.clone()).await?;
    let client = server.tls.local_client(&url)?;
    let agent_dir = server.data_dir.join("agent");
    let agent = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { run_agent(client, &agent_dir, node, shutdown).await }
    });
    serving.await??;
    shutdown.cancel();
    agent.await??;
    Ok(())
}

async fn run_agent(
    client: tacc_client::Client,
    data_dir: &Path,
    node: NodeArgs,
    shutdown: CancellationToken,
) -> Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let (detected, gpu_type) = tacc_agent::detect_capacity();
    let capacity = Resources::new(
        node.cpus
            .map_or(detected.cpu_millis, |c| (c * 1000.0).round() as u64),
        node.memory.map_or(detected.memory_bytes, |m| m.as_bytes()),
        node.gpus.unwrap_or(detected.gpus),
    );
    let name = match node.name.clone() {
        Some(name) => name,
        None => host_name(),
    };
    let config = AgentConfig {
        name,
        data_dir: data_dir.to_path_buf(),
        capacity,
        gpu_type,
        labels: BTreeMap::new(),
        address: node.address.clone(),
        poll_wait: Duration::from_secs(20),
        keep_workdirs: node.keep_workdirs,
        env_cache_bytes: node.env_cache_size.as_bytes(),
    };
    let mut agent = Agent::new(client, config, Arc::new(tacc_exec::ProcessExecutor::new()))?;
    if let Some(docker) = container_runtime(&node, data_dir).await {
        tracing::info!("container runtime: Docker engine at the configured socket");
        agent = agent.with_container_runtime(docker);
    }
    agent.run(shutdown).await;
    Ok(())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
