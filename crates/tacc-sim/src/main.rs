//! `tacc-sim`: replays a GPU-cluster trace through `tacc-scheduler` with a virtual clock
//! and reports JCT, queueing delay, utilisation, makespan, preemptions and fairness;
//! `--adaptive` replays it twice under a per-job speed model, with static and with
//! adaptive CPU and memory allocation, and reports both side by side.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;
use tacc_scheduler::pool::PoolPolicy;
use tacc_sim::{
    NodeOptions, SpeedModel, cdf_chart, compare_table, load_trace, run_compare, run_nodes,
    run_pool, table,
};

/// Replay a trace (job_id,user,submit_time_s,duration_s,num_gpus,num_nodes,status,vc).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Trace CSV file.
    trace: PathBuf,
    /// Model the cluster as one pool of this many GPUs (no nodes, no placement).
    #[arg(long, conflicts_with_all = ["nodes", "gpus_per_node"])]
    pool_gpus: Option<u32>,
    /// Number of nodes (node mode).
    #[arg(long, default_value_t = 64)]
    nodes: u32,
    /// GPUs per node (node mode).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Replay only this tenant's jobs (for ITP: that cluster's).
    #[arg(long)]
    vc: Option<String>,
    /// Policy, or several separated by commas (each is replayed and compared).
    #[arg(long, default_value = "fairshare", value_delimiter = ',')]
    policy: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write a JCT CDF per policy to this file: SVG or PNG, by its extension.
    #[arg(long, conflicts_with = "adaptive")]
    plot: Option<PathBuf>,
    /// Node mode: give tasks no time limit (instead of their true duration).
    #[arg(long)]
    no_time_limits: bool,
    /// Node mode: tasks are not preemptible.
    #[arg(long)]
    not_preemptible: bool,
    /// Node mode: guarantee each tenant GPUs in proportion to its trace GPU-hours.
    #[arg(long)]
    vc_guarantees: bool,
    /// Node mode: replay under the speed model twice, with static and with adaptive CPU
    /// and memory allocation, and print both (docs/ADAPTIVE.md).
    #[arg(long, conflicts_with = "pool_gpus")]
    adaptive: bool,
    /// With --adaptive: the speed model (TOML; default: crates/tacc-sim/speed-model.toml,
    /// compiled in). Sections it leaves out keep the defaults.
    #[arg(long, requires = "adaptive")]
    speed_model: Option<PathBuf>,
    /// With --adaptive: virtual seconds between two samples of every running job
    /// (default: the model's, 60).
    #[arg(long, requires = "adaptive")]
    sample_every: Option<u64>,
    /// Node mode: CPUs per node (default: 8 per GPU).
    #[arg(long)]
    cpus_per_node: Option<u64>,
    /// Node mode: memory per node in GiB (default: 64 per GPU).
    #[arg(long)]
    memory_per_node: Option<u64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let jobs = load_trace(&args.trace, args.vc.as_deref())?;
    if args.nodes == 0 || args.gpus_per_node == 0 {
        bail!("--nodes and --gpus-per-node must be positive");
    }
    if args.cpus_per_node == Some(0) || args.memory_per_node == Some(0) {
        bail!("--cpus-per-node and --memory-per-node must be positive (or left out)");
    }
    let mut options = NodeOptions::new(args.nodes, args.gpus_per_node);
    options.oracle_time_limits = !args.no_time_limits;
    options.preemptible = !args.not_preemptible;
    options.proportional_guarantees = args.vc_guarantees;
    options.cpus_per_node = args.cpus_per_node;
    options.memory_gib_per_node = args.memory_per_node;
    if args.adaptive {
        let mut model = match &args.speed_model {
            Some(path) => SpeedModel::load(path)?,
            None => SpeedModel::default_model(),
        };
        if let Some(every) = args.sample_every {
            if every == 0 || every > model.adaptive.window_s {
                bail!(
                    "--sample-every must be between 1 and the model's window ({} s)",
                    model.adaptive.window_s
                );
            }
            model.adaptive.sample_every_s = every;
        }
        let mut reports = Vec::new();
        for policy in &args.policy {
            reports.extend(run_compare(&jobs, policy, &options, &model)?);
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&reports)?);
        } else {
            print!("{}", compare_table(&reports));
        }
        return Ok(());
    }
    let mut reports = Vec::new();
    for policy in &args.policy {
        let report = match args.pool_gpus {
            Some(gpus) => {
                let pool_policy: PoolPolicy = policy.parse()?;
                run_pool(&jobs, pool_policy, gpus)
            }
            None => run_nodes(&jobs, policy, &options)?,
        };
        reports.push(report);
    }
    if let Some(path) = &args.plot {
        cdf_chart(&reports)
            .write(path)
            .context("cannot write the --plot file")?;
    }
    if args.json {
        let json = if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&reports)?
        };
        println!("{json}");
    } else {
        print!("{}", table(&reports));
    }
    Ok(())
}
