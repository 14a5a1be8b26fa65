//! `taccd agent --backend slurm`: one agent process on a Slurm login node that offers
//! every Slurm node of a partition as a TACC node and runs attempts as Slurm jobs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tacc_agent::{Agent, AgentConfig};
use tacc_core::Resources;
use tacc_exec::{SlurmBackend, SlurmConfig};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args, Clone, Default)]
pub struct SlurmArgs {
    /// Slurm partition whose nodes this agent offers and submits to (default: all nodes,
    /// Slurm's default partition).
    #[arg(long)]
    slurm_partition: Option<String>,
    /// Marks this installation's jobs in Slurm (`--comment tacc:TAG/…`), so a restarted
    /// agent re-finds them; unique per TACC server sharing one Slurm cluster.
    #[arg(long, default_value = "tacc")]
    slurm_tag: String,
    /// TACC user → Slurm account, e.g. `alice=ml-lab` or `*=default-account`; repeatable.
    #[arg(long = "slurm-account", value_name = "USER=ACCOUNT")]
    slurm_accounts: Vec<String>,
    /// TACC priority → Slurm QoS, e.g. `high=urgent`; repeatable.
    #[arg(long = "slurm-qos", value_name = "PRIORITY=QOS")]
    slurm_qos: Vec<String>,
    /// Where job scripts and per-node logs go; must be on a file system the Slurm nodes
    /// share with this login node (default: DATA_DIR/slurm).
    #[arg(long)]
    slurm_state_dir: Option<PathBuf>,
    /// Milliseconds between reads of job states from Slurm.
    #[arg(long, default_value_t = 250)]
    slurm_poll_ms: u64,
    /// Read job states as text even where this Slurm offers JSON.
    #[arg(long)]
    slurm_text: bool,
    #[command(flatten)]
    pilots: crate::pilots::PilotArgs,
}

fn pairs(items: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("`{item}` is not {what} (write it as KEY=VALUE)"),
        })
        .collect()
}

/// What `taccd agent` says of every node, whatever its backend.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    pub keep_workdirs: bool,
    /// The operator's `--label`s, given to every Slurm node this agent offers.
    pub labels: BTreeMap<String, String>,
}

pub async fn run(
    client: tacc_client::Client,
    data_dir: &Path,
    join_token: Option<String>,
    args: SlurmArgs,
    node_options: NodeOptions,
    shutdown: CancellationToken,
) -> Result<()> {
    let state_dir = args
        .slurm_state_dir
        .clone()
        .unwrap_or_else(|| data_dir.join("slurm"));
    let mut config = SlurmConfig::new(state_dir.clone(), args.slurm_tag.clone());
    config.partition = args.slurm_partition.clone();
    config.accounts = pairs(&args.slurm_accounts, "USER=ACCOUNT")?;
    config.qos = pairs(&args.slurm_qos, "PRIORITY=QOS")?;
    config.poll_interval = Duration::from_millis(args.slurm_poll_ms.max(20));
    config.prefer_json = !args.slurm_text;
    let backend = SlurmBackend::start(config).await.context(
        "cannot use Slurm from this machine (is it a login node with sbatch, squeue and scancel?)",
    )?;
    let nodes = backend.discover_nodes().await?;
    if nodes.is_empty() {
        bail!(
            "Slurm lists no nodes{}",
            match &args.slurm_partition {
                Some(p) => format!(" in partition {p}"),
                None => String::new(),
            }
        );
    }
    // Task files select a partition by this label, so it names the partition the jobs
    // really go to; a node outside it (or a Slurm without a default) gets none.
    let partition = backend
        .submit_partition()
        .await
        .context("cannot read Slurm's partitions with `sinfo`")?;
    tracing::info!(
        "slurm backend: {} node(s), jobs submitted to {}, job states read as {}",
        nodes.len(),
        match &partition {
            Some(p) => format!("partition {p}"),
            None => "Slurm's default partition".to_string(),
        },
        if backend.reads_json() { "JSON" } else { "text" }
    );
    let mut agents = tokio::task::JoinSet::new();
    for node in nodes {
        // `tacc.io/runtime.slurm` is added by the agent itself, from its executor.
        let mut labels = node_options.labels.clone();
        if let Some(partition) = &partition
            && (node.partitions.is_empty() || node.partitions.contains(partition))
        {
            labels.insert(
                tacc_core::labels::SLURM_PARTITION.to_string(),
                partition.clone(),
            );
        }
        if args.pilots.enabled() {
            // Short tasks wait for a pilot rather than each costing an `sbatch` job.
            labels.insert(
                tacc_core::labels::PILOT_SHORT_SECS.to_string(),
                args.pilots.short_secs().to_string(),
            );
        }
        let config = AgentConfig {
            name: node.name.clone(),
            data_dir: data_dir.join("nodes").join(&node.name),
            capacity: Resources::new(node.cpus * 1000, node.memory_mb * 1024 * 1024, node.gpus),
            gpu_type: node.gpu_type.clone(),
            labels,
            address: node.name.clone(),
            poll_wait: Duration::from_secs(20),
            keep_workdirs: node_options.keep_workdirs,
            // Slurm jobs' working directories lie on the shared file system, beside the
            // agent's data directory.
            work_dir: None,
            // Environments are built under the agent's data directory, which a Slurm
            // backend requires on the shared file system.
            env_cache_bytes: tacc_core::ByteSize::gib(50).as_bytes(),
        };
        // Each Slurm node registers once with the join token and keeps its own credential.
        let credential = tacc_agent::stored_credential(&config.data_dir)?.or(join_token.clone());
        let Some(credential) = credential else {
            bail!(
                "node {}: no credential; give the agent a join token that enrols every node of \
                 the partition (`taccd admin agent-token --nodes N`); {}",
                node.name,
                crate::join_token::HOW_TO_PASS
            );
        };
        // A client of its own: the node credential it receives must not replace another's.
        let agent_client = client.clone().with_token(credential);
        let agent = Agent::new(
            agent_client,
            config,
            Arc::new(backend.executor_for(&node.name)),
        )?;
        agents.spawn(agent.run(shutdown.clone()));
    }
    let pilots = async {
        if !args.pilots.enabled() {
            return Ok(());
        }
        let context = crate::pilots::PilotContext {
            client: client.clone(),
            tag: args.slurm_tag.clone(),
            partition: partition.clone(),
            state_dir: state_dir.clone(),
            json: backend.reads_json(),
        };
        crate::pilots::run(args.pilots.clone(), context, shutdown.clone()).await
    };
    let nodes = async {
        while agents.join_next().await.is_some() {}
        Ok(())
    };
    tokio::try_join!(nodes, pilots)?;
    Ok(())
}
