//! `taccd`: the TACC daemon. `taccd server` runs the control plane, `taccd agent` a node
//! agent, and `taccd dev` both (the embedded single-machine cluster that `tcloud up`
//! starts; its agent runs in a process of its own, see `embedded_agent`). A thin binary: all behaviour lives in `tacc-server` and
//! `tacc-agent`.

mod admin;
mod admin_accounts;
mod admin_nodes;
mod database;
mod embedded_agent;
mod join_token;
mod modes;
mod node_labels;
mod open_files;
mod pilot_node;
mod pilots;
mod private_tmp_helper;
mod process_agent;
mod replica;
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
use tacc_core::{ByteSize, HumanDuration};
use tacc_server::cluster_stop::ClusterStop;
use tacc_server::{Control, ServerConfig};
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
    /// Control plane and a local agent: the embedded single-machine cluster. The agent
    /// runs as a process of its own (its log: DATA_DIR/agent.log, also shown here): it and
    /// its tasks live through a crash of the server, which adopts them when started again.
    ///
    /// Example: taccd dev --data-dir ~/.local/share/tacc/local --listen 127.0.0.1:8383
    Dev {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        agent: NodeArgs,
        /// The local admin the embedded cluster creates; its token is written to
        /// DATA_DIR/admin.token (mode 0600), where `tcloud up` picks it up.
        #[arg(long, env = "USER", default_value = "admin")]
        admin_user: String,
        /// Run as the embedded cluster's agent for the server at this URL (the server
        /// starts itself again with it, its join token on standard input; see
        /// `embedded_agent`).
        #[arg(long = "embedded-agent", hide = true, value_name = "URL")]
        embedded_agent: Option<String>,
    },
    /// Operator commands on a server's data directory (run on the server's machine, as
    /// the account that owns it): TLS set-up, users, tokens, agent join tokens, audit.
    ///
    /// Example: taccd admin --data-dir /var/lib/tacc user add alice --group vision
    Admin {
        /// The server's data directory (required).
        #[arg(long, env = "TACC_DATA_DIR", global = true)]
        data_dir: Option<PathBuf>,
        /// The server's database when it is not DATA_DIR/tacc.db: the server's
        /// --database (users, tokens and the audit trail live there).
        #[arg(
            long,
            env = "TACC_DATABASE",
            global = true,
            hide_env_values = true,
            value_name = "URL"
        )]
        database: Option<String>,
        #[command(subcommand)]
        command: admin::Admin,
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
    /// The watchdog of the agent with this data directory (the agent starts it; see
    /// `tacc_agent::watchdog`).
    #[command(hide = true)]
    AgentWatchdog {
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// A node agent that runs tasks for the server at --server.
    ///
    /// Example: taccd agent --server https://head:8383 --server-fingerprint HEX --data-dir /var/lib/tacc-agent --token-file /root/join.token
    Agent {
        /// URL of the control plane.
        #[arg(long, env = "TACC_SERVER")]
        server: String,
        /// A file holding the join token from `taccd admin agent-token`, or `-` to read it
        /// from standard input; the TACC_JOIN_TOKEN environment variable works too. Needed
        /// to enrol the node (once: its own credential is then kept in DATA_DIR/node.token
        /// and used from then on) and to enrol it again after a change of name or
        /// capacity. Never give a token on the command line: every process reads it.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Refused: a token on the command line is readable by every process on the
        /// machine. Use --token-file or TACC_JOIN_TOKEN.
        #[arg(long, hide = true, value_name = "TOKEN")]
        token: Option<String>,
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
}

#[derive(Debug, Args)]
struct ServerArgs {
    /// Root agents run each user's tasks as an unprivileged uid (and gid) of their own,
    /// which the server allocates once per user from this one upwards and keeps in its
    /// database, so a user has the same uid on every node and no two users share one
    /// (users the operator mapped to a Unix account run as that account). Tasks never run
    /// as root. Changing it later keeps the uids already given.
    #[arg(long, default_value_t = tacc_server::DEFAULT_TASK_UID_BASE, value_parser = clap::value_parser!(u32).range(1..=4_000_000_000))]
    task_uid_base: u32,
    /// Submissions per second one user may sustain (beyond it: 429 Too Many Requests).
    #[arg(long, default_value_t = 500.0)]
    submit_rate: f64,
    /// Submissions one user may make at once after being idle.
    #[arg(long, default_value_t = 5_000)]
    submit_burst: u32,
    /// Queued tasks one user may have at once.
    #[arg(long, default_value_t = 10_000)]
    max_queued: u32,
    /// Log kept per task; past it the log says it was truncated.
    #[arg(long, default_value = "1GiB")]
    max_log: ByteSize,
    /// Where the database, logs, chunks and outputs live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The database for the control plane's state: a PostgreSQL URL
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE, the database created beforehand) or
    /// an SQLite file. Left out: the embedded SQLite file DATA_DIR/tacc.db.
    #[arg(
        long,
        env = "TACC_DATABASE",
        hide_env_values = true,
        value_name = "URL"
    )]
    database: Option<String>,
    /// Address to listen on; port 0 picks a free port (written to DATA_DIR/taccd.json).
    #[arg(long, default_value = "127.0.0.1:8383")]
    listen: SocketAddr,
    /// Seconds without a poll after which an agent, and what it ran, is lost. An agent
    /// cut off from the server stops its tasks itself after a third of it, and a task's
    /// kill grace is capped at a third of it, so a lost node's tasks are gone before
    /// they are retried elsewhere.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_timeout: u64,
    /// The wait before a task's second attempt when its `retry:` policy retries it (e.g.
    /// 5s, 1m); each further retry waits twice as long, up to --retry-backoff-max.
    #[arg(long, default_value = "5s")]
    retry_backoff: HumanDuration,
    /// The longest wait between two attempts of a retried task.
    #[arg(long, default_value = "5m")]
    retry_backoff_max: HumanDuration,
    /// A task whose attempts took their node down this many times (the node was lost, or
    /// its agent restarted, while running it) fails with `crash_limit` instead of being
    /// retried on node after node.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    crash_limit: u32,
    /// Seconds a node that was lost twice within 10 minutes must stay up after it comes
    /// back before it gets work again (a flapping node).
    #[arg(long, default_value_t = 60)]
    node_stable_after: u64,
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
    /// A running rank that writes no output and uses no CPU for this long is flagged
    /// silent in `tcloud top` (e.g. 5m, 30s).
    #[arg(long, default_value = "5m")]
    silent_after: HumanDuration,
    /// A multi-node task whose ranks still running have all been silent (no output, no CPU
    /// or GPU use) this long is ended as hung, naming the ranks (e.g. 30m; `off` never).
    /// A task's own `on_hang:` wins. See docs/GPUS.md.
    #[arg(long, default_value = "30m", value_name = "DURATION|off", value_parser = parse_hang_after)]
    hang_after: HangAfter,
    /// The idle-GPU policy: a running task whose GPUs have all been used below
    /// --idle-gpu-below percent for this long is warned of (its log, `tcloud top`), then,
    /// --idle-gpu-grace later, --idle-gpu-then runs (e.g. 30m). Off when not given.
    #[arg(long, value_name = "DURATION")]
    idle_gpu_for: Option<HumanDuration>,
    /// GPU utilisation (percent) under which a GPU counts as idle.
    #[arg(long, default_value_t = 5, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(1..=100))]
    idle_gpu_below: u32,
    /// What follows the warning: `warn` (nothing more), `checkpoint_and_requeue` (the task's
    /// checkpoint signal, then back to the queue as a new attempt) or `cancel`.
    #[arg(long, default_value = "warn", value_name = "ACTION", value_parser = parse_idle_gpu_action)]
    idle_gpu_then: IdleGpuActionArg,
    /// Time between the warning and the action.
    #[arg(long, default_value = "10m", value_name = "DURATION")]
    idle_gpu_grace: HumanDuration,
    /// A user or group the idle-GPU policy leaves alone (repeatable).
    #[arg(long = "idle-gpu-exempt", value_name = "NAME")]
    idle_gpu_exempt: Vec<String>,
    /// An interactive session (`tcloud exec`, `shell`, `port-forward`) through which no
    /// byte passed for this long is closed (e.g. 30m, 2h).
    #[arg(long, default_value = "30m")]
    session_idle: HumanDuration,
    /// Interactive sessions one user may have open at once (each port-forward
    /// connection counts).
    #[arg(long, default_value_t = 64)]
    sessions_per_user: usize,
    /// Interactive sessions open into one node at once, all users together.
    #[arg(long, default_value_t = 256)]
    sessions_per_node: usize,
    /// The longest `idle_timeout` a dev session (`tcloud dev`, `kind: interactive`) gets:
    /// one that asks for more (or its 2h default, when longer) is ended after this.
    #[arg(long, default_value = "24h", value_name = "DURATION")]
    dev_idle_max: HumanDuration,
    /// Adaptive allocation of running tasks that give `adaptive:` bounds: `on` grows and
    /// shrinks their CPU and memory within the bounds, `shrink` only gives back what they
    /// do not use, `off` moves nothing (verdicts are still shown). Tasks without
    /// `adaptive:` move only under `--adaptive-default`. See docs/ADAPTIVE.md.
    #[arg(long, default_value = "on", value_parser = clap::value_parser!(AdaptiveModeArg))]
    adaptive: AdaptiveModeArg,
    /// How long a bottleneck must be seen before it counts (the classifier's window).
    #[arg(long, default_value = "30s")]
    adaptive_window: HumanDuration,
    /// A task's CPU or memory changes at most once per this long; a change back the
    /// other way waits five times as long.
    #[arg(long, default_value = "60s")]
    adaptive_cooldown: HumanDuration,
    /// The cluster's default policy for tasks without `adaptive:` bounds: their CPU and
    /// memory may move between these multiples of what they asked for, e.g. `0.5..2`.
    /// Left out, such tasks keep what they asked for.
    #[arg(long, value_name = "MIN..MAX")]
    adaptive_default: Option<tacc_server::DefaultBounds>,
    /// Let webhook notifications (`notify.webhook`) reach internal addresses: loopback,
    /// link-local, private, shared (CGNAT), multicast and the like. Off by default, so a
    /// user's webhook cannot make the server call its own API or internal services.
    #[arg(long)]
    webhook_allow_private: bool,
    /// An internal address range webhooks may reach all the same, e.g. 10.20.0.0/16 or
    /// a single address (repeatable). Public addresses are always allowed.
    #[arg(long = "webhook-allow", value_name = "CIDR", value_parser = parse_cidr)]
    webhook_allow: Vec<ipnet::IpNet>,
    /// A request's head (request line and headers) must arrive within this long of its
    /// first byte; a slower client (slowloris) is disconnected.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    header_timeout: HumanDuration,
    /// A connection with no request in progress (a new one, or a kept-alive one between
    /// requests) is closed after this long.
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    idle_timeout: HumanDuration,
    /// Connections the server keeps open at once; past it new ones wait in the kernel's
    /// backlog until one closes.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    #[command(flatten)]
    audit: AuditArgs,
    /// Nodes that enrol (register with a join token) wait, with no work and so no
    /// user's task or secret, until an admin approves them: `taccd admin node approve
    /// NAME` or `tcloud admin node approve NAME`. `tcloud nodes` shows them `pending`.
    #[arg(long)]
    require_node_approval: bool,
    #[command(flatten)]
    tls: tls::ServerTlsArgs,
    #[command(flatten)]
    replica: replica::ReplicaArgs,
}

/// `ADDRESS/PREFIX`, or one address (a range of one).
fn parse_cidr(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| {
            format!(
                "`{text}` is not an address range: write e.g. 10.20.0.0/16, fd00::/8 or 10.20.0.5"
            )
        })
}

/// The audit trail's retention and the bounds on refused-request noise.
#[derive(Debug, Args)]
struct AuditArgs {
    /// Audit entries older than this are deleted (checked hourly), e.g. 90d, 365d.
    #[arg(long, default_value = "90d", value_parser = positive_duration)]
    audit_retention: HumanDuration,
    /// Failed authentications one source address may make per minute; past it, further
    /// failures are answered 429 with Retry-After.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    auth_failure_limit: u32,
    /// Refused requests (auth.failed, access.denied) are audited as the first of each
    /// source in this window and one row counting the rest when it closes.
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    audit_window: HumanDuration,
}

/// A duration of at least a second (`0s` would disable what it bounds).
fn positive_duration(text: &str) -> Result<HumanDuration, String> {
    let duration: HumanDuration = text.parse().map_err(|e| format!("{e}"))?;
    if duration.as_secs() == 0 {
        return Err(format!("`{text}` must be at least 1s"));
    }
    Ok(duration)
}

/// `--adaptive off|shrink|on`.
#[derive(Debug, Clone, Copy)]
struct AdaptiveModeArg(tacc_server::AdaptiveMode);

impl std::str::FromStr for AdaptiveModeArg {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        text.parse().map(AdaptiveModeArg)
    }
}

/// `--idle-gpu-then`.
#[derive(Debug, Clone, Copy)]
struct IdleGpuActionArg(tacc_server::IdleGpuAction);

fn parse_idle_gpu_action(text: &str) -> Result<IdleGpuActionArg, String> {
    tacc_server::IdleGpuAction::parse(text)
        .map(IdleGpuActionArg)
        .ok_or_else(|| format!("`{text}`: give warn, checkpoint_and_requeue or cancel"))
}

/// `--hang-after`: a duration, or `off`.
#[derive(Debug, Clone, Copy)]
struct HangAfter(Option<Duration>);

fn parse_hang_after(text: &str) -> Result<HangAfter, String> {
    if text == "off" {
        return Ok(HangAfter(None));
    }
    let after: HumanDuration = text
        .parse()
        .map_err(|e| format!("`{text}` is neither a duration (e.g. 30m) nor `off`: {e}"))?;
    if after.as_secs() == 0 {
        return Err("give a silence of at least 1s, or `off`".into());
    }
    Ok(HangAfter(Some(Duration::from_secs(after.as_secs()))))
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

fn load_config(args: &ServerArgs) -> Result<LoadedConfig> {
    let (mut policy, scheduler, unix_users) = match &args.config {
        None => (
            None,
            tacc_scheduler::SchedulerConfig::default(),
            BTreeMap::new(),
        ),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("cannot read the configuration file {}", path.display())
            })?;
            let mut file: ConfigFile = toml::from_str(&text)
                .with_context(|| format!("{} is not valid TOML", path.display()))?;
            let unix_users = take_unix_users(&mut file.scheduler)
                .with_context(|| format!("{}: invalid [users] settings", path.display()))?;
            let scheduler =
                tacc_scheduler::SchedulerConfig::deserialize(toml::Value::Table(file.scheduler))
                    .with_context(|| {
                        format!(
                            "{}: invalid scheduler settings (see docs/SCHEDULING.md)",
                            path.display()
                        )
                    })?;
            (file.policy, scheduler, unix_users)
        }
    };
    if args.policy.is_some() {
        policy = args.policy.clone();
    }
    Ok(LoadedConfig {
        policy: policy.unwrap_or_else(|| tacc_server::DEFAULT_POLICY.to_string()),
        scheduler,
        unix_users,
    })
}

#[derive(Debug)]
struct LoadedConfig {
    policy: String,
    scheduler: tacc_scheduler::SchedulerConfig,
    unix_users: BTreeMap<String, String>,
}

/// `[users.NAME] unix_user = "…"`: the Unix account NAME's tasks run as on the nodes. It
/// belongs to the server, not the scheduler, so it is taken out before the scheduler
/// reads the table.
fn take_unix_users(table: &mut toml::Table) -> Result<BTreeMap<String, String>> {
    let mut mapping = BTreeMap::new();
    let Some(toml::Value::Table(users)) = table.get_mut("users") else {
        return Ok(mapping);
    };
    for (name, settings) in users.iter_mut() {
        let Some(settings) = settings.as_table_mut() else {
            continue;
        };
        match settings.remove("unix_user") {
            None => {}
            Some(toml::Value::String(account)) if !account.is_empty() && account != "root" => {
                mapping.insert(name.clone(), account);
            }
            Some(other) => anyhow::bail!(
                "users.{name}.unix_user must be the name of an unprivileged Unix account, not {other}"
            ),
        }
    }
    Ok(mapping)
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
    /// GPUs offered to tasks (default: as found through NVML). On a machine without
    /// GPUs this offers N fake ones (tasks see CUDA_VISIBLE_DEVICES all the same).
    #[arg(long)]
    gpus: Option<u32>,
    /// The model of the GPUs offered, as task files name it in `gpu_type` (e.g. A100);
    /// overrides what NVML reports. On a machine without GPUs it needs --gpus N.
    #[arg(long, value_name = "TYPE", value_parser = parse_gpu_type)]
    gpu_type: Option<String>,
    /// With fake GPUs (--gpus N where NVML finds none), read their utilisation from FILE
    /// at each sample: one `INDEX PERCENT` line per GPU. Fake GPUs measure nothing; this
    /// plays a series to the idle-GPU policy for a demo or a test.
    #[arg(long, value_name = "FILE")]
    fake_gpu_readings: Option<PathBuf>,
    /// Address other nodes reach this one at, e.g. rank 0's MASTER_ADDR (default: the
    /// address this machine reaches the server from).
    #[arg(long)]
    address: Option<String>,
    /// Keep attempts' working directories after they end.
    #[arg(long)]
    keep_workdirs: bool,
    /// Where attempts' working directories go (default: DATA_DIR/work). A volume of their
    /// own keeps a task that fills its working directory from filling the disk that
    /// holds the agent's spool, records and logs (see docs/OPERATIONS.md).
    #[arg(long, value_name = "PATH")]
    work_dir: Option<PathBuf>,
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
    /// A label of this node (of every node, with --backend slurm) that task files select
    /// with `placement.labels`, e.g. `gpu-gen=hopper`; repeatable. The agent adds the
    /// runtimes it offers itself (`tacc.io/runtime.process=true`, …).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = node_labels::parse_label)]
    labels: Vec<(String, String)>,
}

fn main() -> Result<()> {
    if private_tmp_helper::requested() {
        private_tmp_helper::run();
    }
    // The process runtime's launcher (where `tacc-launch` is not installed beside us):
    // before anything else, so the task keeps the umask and all the agent gave it.
    if tacc_exec::launcher::requested() {
        tacc_exec::launcher::main();
    }
    // Before anything is created: the daemon's files are its own (see `modes`).
    modes::private_umask();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TACC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // A log line that cannot be written (a full disk) is dropped and counted, never
        // a panic in the thread that logged it.
        .with_writer(tacc_server::daemon_log::stderr)
        // Colours for a person at a terminal; a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false)
        .init();
    database::warn_of_password_on_command_line();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        match cli.command {
            Command::Dev {
                server,
                agent,
                embedded_agent: Some(url),
                ..
            } => run_embedded_agent(server, agent, &url, shutdown).await,
            Command::Dev {
                server,
                agent,
                admin_user,
                ..
            } => run_dev(server, agent, admin_user, shutdown).await,
            Command::Admin {
                data_dir,
                database,
                command,
            } => {
                let data_dir = data_dir.context(
                    "taccd admin needs the server's data directory: --data-dir DIR (or TACC_DATA_DIR)",
                )?;
                admin::run(&data_dir, database.as_deref(), command).await
            }
            Command::Server { server } => run_server(server, shutdown).await.map(|_| ()),
            Command::AgentWatchdog { data_dir } => {
                process_agent::run_watchdog(&data_dir);
                Ok(())
            }
            Command::Agent {
                server,
                token_file,
                token,
                tls,
                data_dir,
                node,
                backend,
                slurm,
            } => {
                if token.is_some() {
                    return Err(join_token::refuse_on_command_line());
                }
                let token = join_token::read(token_file.as_deref())?;
                let client = tls.client(&server)?;
                match backend.as_str() {
                    "slurm" => {
                        slurm_agent::run(
                            client,
                            &data_dir,
                            token,
                            slurm,
                            slurm_agent::NodeOptions {
                                keep_workdirs: node.keep_workdirs,
                                labels: node.labels.iter().cloned().collect(),
                            },
                            shutdown,
                        )
                        .await
                    }
                    _ => process_agent::run_agent(client, &data_dir, token, node, shutdown).await,
                }
            }
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

/// A started control plane.
struct Started {
    url: String,
    control: Arc<Control>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// The control plane's configuration from the command line and configuration file.
fn server_config(args: &ServerArgs) -> Result<ServerConfig> {
    let mut config = ServerConfig::new(args.data_dir.clone());
    config.heartbeat_timeout = Duration::from_secs(args.heartbeat_timeout);
    config.node_stable_after = Duration::from_secs(args.node_stable_after);
    config.retry = retry_settings(args)?;
    config.replicated = args.replica.replicated;
    config.require_node_approval = args.require_node_approval;
    let loaded = load_config(args)?;
    config.policy = loaded.policy;
    config.scheduler = loaded.scheduler;
    config.unix_users = loaded.unix_users;
    config.task_uid_base = args.task_uid_base;
    config.limits = tacc_server::UserLimits {
        submit_rate: args.submit_rate,
        submit_burst: args.submit_burst,
        max_queued: args.max_queued,
        max_log_bytes: args.max_log.as_bytes(),
    };
    config.connections = tacc_server::ConnectionLimits {
        header_timeout: args.header_timeout.as_std(),
        idle_timeout: args.idle_timeout.as_std(),
        max_connections: args.max_connections as usize,
    };
    config.audit = tacc_server::AuditSettings {
        retention: args.audit.audit_retention.as_std(),
        failures_per_minute: args.audit.auth_failure_limit,
        window: args.audit.audit_window.as_std(),
    };
    config.datasets = args.datasets.iter().cloned().collect();
    config.webhooks = tacc_server::WebhookPolicy {
        allow_private: args.webhook_allow_private,
        allowed: args.webhook_allow.clone(),
    };
    config.chunk_retention = Duration::from_secs(args.chunk_retention.as_secs());
    config.silent_after = Duration::from_secs(args.silent_after.as_secs());
    config.hang_after = args.hang_after.0;
    config.idle_gpu = args
        .idle_gpu_for
        .map(|idle_for| tacc_server::IdleGpuPolicy {
            below_percent: args.idle_gpu_below,
            idle_for: Duration::from_secs(idle_for.as_secs()),
            then: args.idle_gpu_then.0,
            grace: Duration::from_secs(args.idle_gpu_grace.as_secs()),
            exempt: args.idle_gpu_exempt.clone(),
        });
    config.sessions = tacc_server::SessionLimits {
        per_user: args.sessions_per_user,
        per_node: args.sessions_per_node,
        idle: args.session_idle.as_std(),
        dev_idle_max: args.dev_idle_max.as_std(),
    };
    config.adaptive = tacc_server::AdaptiveConfig {
        mode: args.adaptive.0,
        window: args.adaptive_window.as_std(),
        cooldown: args.adaptive_cooldown.as_std(),
        // A few points per window, at most one per 10 s.
        record_every: (args.adaptive_window.as_std() / 3).min(Duration::from_secs(10)),
        default_bounds: args.adaptive_default,
    };
    Ok(config)
}

/// Start the control plane; `cluster_stop` when it embeds its cluster (`taccd dev`), which
/// an admin may then stop (`tcloud down`).
async fn start_server(
    args: &ServerArgs,
    cluster_stop: Option<Arc<ClusterStop>>,
    shutdown: CancellationToken,
) -> Result<Started> {
    let hosts_agent = cluster_stop.is_some();
    args.tls.check_exposure(args.listen, &args.data_dir)?;
    let tls = args.tls.load()?;
    modes::secure_server_dir(&args.data_dir, hosts_agent)?;
    let database = database::Database::choose(args.database.as_deref(), &args.data_dir)
        .map_err(anyhow::Error::msg)?;
    let store = database.open().await?;
    tracing::info!("control-plane state in {database}");
    let config = server_config(args)?;
    open_files::raise_for(config.connections.max_connections);
    let control = Control::open(store, config).await?;
    let served = control.clone();
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
    match &tls {
        Some(tls) => {
            let fingerprint = tacc_client::tls::fingerprint(tls.certificate_der());
            tracing::info!(
                "control plane listening on {url} (certificate SHA-256 fingerprint {fingerprint})"
            );
        }
        None => tracing::info!("control plane listening on {url}"),
    }
    let serving = match (cluster_stop, tls) {
        (Some(stop), tls) => tokio::spawn(tacc_server::serve_embedded(
            served, listener, tls, shutdown, stop,
        )),
        (None, Some(tls)) => tokio::spawn(tacc_server::serve_tls(served, listener, tls, shutdown)),
        (None, None) => tokio::spawn(tacc_server::serve(served, listener, shutdown)),
    };
    Ok(Started {
        url,
        control,
        serving,
    })
}

/// `--retry-backoff`, `--retry-backoff-max` and `--crash-limit`, checked together.
fn retry_settings(args: &ServerArgs) -> Result<tacc_server::RetrySettings> {
    let settings = tacc_server::RetrySettings {
        backoff: args.retry_backoff.as_std(),
        backoff_max: args.retry_backoff_max.as_std(),
        crash_limit: args.crash_limit,
    };
    if settings.backoff > settings.backoff_max {
        anyhow::bail!(
            "--retry-backoff {} is longer than --retry-backoff-max {}: raise the maximum or \
             shorten the first wait",
            args.retry_backoff,
            args.retry_backoff_max
        );
    }
    Ok(settings)
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
    if args.replica.replicated {
        return replica::run(&args, shutdown).await;
    }
    let started = start_server(&args, None, shutdown).await?;
    started.serving.await??;
    Ok(())
}

/// The embedded cluster provisions its own identities: a local admin whose token it
/// writes to DATA_DIR/admin.token (0600) for `tcloud up`, and a join token for its agent.
async fn run_dev(
    server: ServerArgs,
    node: NodeArgs,
    admin_user: String,
    shutdown: CancellationToken,
) -> Result<()> {
    // Checked before the server starts: the agent's own failure would only be logged.
    if node.gpu_type.is_some() && node.gpus.is_none() {
        let (found, found_type) = tacc_agent::detect_gpus();
        process_agent::gpu_type_offered(None, found, found_type, &node.gpu_type)?;
    } else {
        process_agent::gpu_type_offered(node.gpus, 0, None, &node.gpu_type)?;
    }
    std::fs::create_dir_all(&server.data_dir)
        .with_context(|| format!("cannot create {}", server.data_dir.display()))?;
    embedded_agent::record_server(&server.data_dir)?;
    let cluster_stop = ClusterStop::new();
    let Started {
        url,
        control,
        mut serving,
    } = start_server(&server, Some(cluster_stop.clone()), shutdown.clone()).await?;
    let node_name = node.name.clone().unwrap_or_else(host_name);
    let join = tacc_server::accounts::provision_local(
        &control,
        &admin_user,
        &server.data_dir.join("admin.token"),
        &node_name,
    )
    .await?;
    let heartbeat = Duration::from_secs(server.heartbeat_timeout);
    // Only an explicit stop (`tcloud down`) stops the agent: a signal stops this server
    // alone, and the agent and its tasks wait for the next one (an upgrade).
    let stop_agent = CancellationToken::new();
    let agent = tokio::spawn(embedded_agent::supervise(
        embedded_agent::AgentLaunch {
            data_dir: server.data_dir.clone(),
            url,
            join_token: join,
            settings: format!("{node:?} {:?}", server.tls.tls_cert),
            // The agent stops its tasks with a grace of at most a third of the heartbeat
            // timeout (and its outputs take their time): then it is killed.
            stop_wait: heartbeat / 3 + Duration::from_secs(30),
        },
        shutdown.clone(),
        stop_agent.clone(),
    ));
    let stopped = cluster_stop.done();
    let on_request = tokio::select! {
        served = &mut serving => {
            served??;
            false
        }
        _ = stopped.cancelled() => true,
    };
    if on_request {
        // Every task has ended (the stop waited for that): the agent goes first, so that
        // nothing it reports is refused, then the server.
        tracing::info!("the cluster stops on request: stopping its agent, then the server");
        stop_agent.cancel();
        agent.await??;
        shutdown.cancel();
        serving.await??;
    } else {
        shutdown.cancel();
        agent.await??;
    }
    Ok(())
}

/// The embedded cluster's agent, in a process of its own (see `embedded_agent`): it
/// reports to the server at `url` and outlives a crash of it by one heartbeat timeout.
/// Its join token comes on standard input, which the server closes after writing it.
async fn run_embedded_agent(
    server: ServerArgs,
    node: NodeArgs,
    url: &str,
    shutdown: CancellationToken,
) -> Result<()> {
    let join_token = embedded_agent::read_join_token()?;
    embedded_agent::watch_server(
        server.data_dir.clone(),
        Duration::from_secs(server.heartbeat_timeout),
        shutdown.clone(),
    );
    let client = server.tls.local_client(url)?;
    process_agent::run_agent(
        client,
        &server.data_dir.join("agent"),
        join_token,
        node,
        shutdown,
    )
    .await
}

/// `--gpu-type`: a model name as task files write it (letters, digits, `-`, `_`, `.`).
fn parse_gpu_type(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty()
        || !text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "`{text}` is not a GPU model name like A100 or H100 (letters, digits, `-`, `_`, `.`)"
        ));
    }
    Ok(text.to_string())
}

/// This machine's host name (`localhost` when it has none).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod cli_tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }

    /// The server arguments of `taccd server --data-dir d ARGS`.
    fn server_args(args: &[&str]) -> super::ServerArgs {
        use clap::Parser;
        let line = ["taccd", "server", "--data-dir", "d"].iter().chain(args);
        match super::Cli::try_parse_from(line).unwrap().command {
            super::Command::Server { server } => server,
            _ => unreachable!(),
        }
    }

    #[test]
    fn retry_settings_come_from_the_command_line_and_are_checked_together() {
        let defaults = super::retry_settings(&server_args(&[])).unwrap();
        assert_eq!(defaults, tacc_server::RetrySettings::default());
        let chosen = super::retry_settings(&server_args(&[
            "--retry-backoff",
            "2s",
            "--retry-backoff-max",
            "1m",
            "--crash-limit",
            "5",
        ]))
        .unwrap();
        assert_eq!(
            (
                chosen.backoff.as_secs(),
                chosen.backoff_max.as_secs(),
                chosen.crash_limit
            ),
            (2, 60, 5)
        );
        let inverted = super::retry_settings(&server_args(&[
            "--retry-backoff",
            "10m",
            "--retry-backoff-max",
            "1m",
        ]))
        .unwrap_err();
        assert!(
            inverted
                .to_string()
                .contains("--retry-backoff 10m is longer than --retry-backoff-max 1m"),
            "{inverted}"
        );
        use clap::Parser;
        assert!(
            super::Cli::try_parse_from([
                "taccd",
                "server",
                "--data-dir",
                "d",
                "--crash-limit",
                "0"
            ])
            .is_err()
        );
    }

    #[test]
    fn an_agent_advertises_the_address_it_reaches_its_server_from() {
        assert_eq!(
            super::process_agent::address_towards("https://127.0.0.1:8383").unwrap(),
            "127.0.0.1"
        );
        assert_eq!(
            super::process_agent::address_towards("http://[::1]:80/").unwrap(),
            "::1"
        );
        let bad = super::process_agent::address_towards("127.0.0.1:8383").unwrap_err();
        assert!(format!("{bad:#}").contains("bad server URL"), "{bad:#}");
    }

    #[test]
    fn a_gpu_type_needs_gpus_to_describe() {
        use super::process_agent::gpu_type_offered as offered;
        let a100 = Some("A100".to_string());
        let h100 = Some("H100".to_string());
        assert_eq!(offered(None, 0, None, &None).unwrap(), None);
        assert_eq!(offered(None, 8, h100.clone(), &None).unwrap(), h100);
        assert_eq!(offered(Some(2), 0, None, &a100).unwrap(), a100);
        assert_eq!(offered(None, 8, h100.clone(), &a100).unwrap(), a100);
        let error = offered(None, 0, None, &a100).unwrap_err().to_string();
        assert!(
            error.contains("--gpus N") && error.contains("NVML"),
            "{error}"
        );
        let error = offered(Some(0), 8, h100, &a100).unwrap_err().to_string();
        assert!(error.contains("--gpus is 0"), "{error}");
        assert!(super::parse_gpu_type("A100").is_ok());
        assert!(super::parse_gpu_type("a 100").is_err());
        assert!(super::parse_gpu_type("").is_err());
    }
}
