//! Pilot allocations of a Slurm agent: when many short tasks wait, ask Slurm for an
//! allocation that runs a `taccd agent` (process backend) inside it, so the scheduler
//! places those tasks there like on any node instead of each costing an `sbatch` job;
//! give an allocation back once it has been idle for `--pilot-idle`.
//!
//! The decision lives in the Slurm agent, not the server: only the login node can submit
//! to Slurm, and the agent reads the queue through the ordinary API with an operator's
//! token (`--pilot-token-file`), which also lets it issue each pilot a join token and
//! drain or remove pilot nodes. A pilot that is to leave is drained first and cancelled
//! only once no task runs on it, so it never takes new work after that decision and no
//! task is lost. A pilot whose Slurm agent is gone ends with its allocation (`--time`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use tacc_core::{HumanDuration, TaskState, labels};
use tacc_exec::slurm::pilot::{PilotJob, cancel_pilot, list_pilots};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args, Clone)]
pub struct PilotArgs {
    /// Turns pilot allocations on: a file holding an admin's API token, with which the
    /// agent reads the queue, issues each pilot a join token and drains/removes pilots.
    #[arg(long, value_name = "FILE")]
    pilot_token_file: Option<PathBuf>,
    /// Short tasks (one node, time limit at most half of --pilot-time) that must be
    /// waiting before an allocation is requested.
    #[arg(long, default_value_t = 8)]
    pilot_min_queue: usize,
    /// Length of each allocation (Slurm `--time`); tasks whose time limit is at most half
    /// of it are left to pilots.
    #[arg(long, default_value = "30m")]
    pilot_time: HumanDuration,
    /// An allocation that ran no task this long is given back.
    #[arg(long, default_value = "1m")]
    pilot_idle: HumanDuration,
    /// Most allocations held at once.
    #[arg(long, default_value_t = 4)]
    pilot_max: usize,
    /// The server's URL as the compute nodes reach it (default: --server).
    #[arg(long)]
    pilot_server: Option<String>,
    /// `--server-fingerprint` the pilots pass (a TLS server with its own certificate).
    #[arg(long)]
    pilot_server_fingerprint: Option<String>,
    /// The `taccd` the allocations run, on the shared file system (default: this one).
    #[arg(long)]
    pilot_taccd: Option<PathBuf>,
}

impl Default for PilotArgs {
    /// Off, with the command line's defaults.
    fn default() -> Self {
        PilotArgs {
            pilot_token_file: None,
            pilot_min_queue: 8,
            pilot_time: HumanDuration::from_secs(30 * 60),
            pilot_idle: HumanDuration::from_secs(60),
            pilot_max: 4,
            pilot_server: None,
            pilot_server_fingerprint: None,
            pilot_taccd: None,
        }
    }
}

impl PilotArgs {
    pub fn enabled(&self) -> bool {
        self.pilot_token_file.is_some()
    }

    /// Tasks at most this long (seconds) are short: left to pilots.
    pub fn short_secs(&self) -> u64 {
        self.pilot_time.as_secs() / 2
    }
}

/// What the manager needs from the Slurm agent.
pub struct PilotContext {
    pub client: tacc_client::Client,
    pub tag: String,
    pub partition: Option<String>,
    pub state_dir: PathBuf,
    pub json: bool,
}

/// Slurm states after which a pilot job holds no allocation.
fn ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING" | "SUSPENDED" | "REQUEUED"
    )
}

/// How often the manager looks at the queue: a burst of short tasks waits at most this
/// long before its allocations are asked for.
const TICK: Duration = Duration::from_millis(200);
/// How often it asks Slurm about its pilots while any may hold or await an allocation
/// (each look is an RPC to slurmctld); never while none may.
const SLURM_LOOK_EVERY: Duration = Duration::from_millis(500);
/// A queue longer than this is listed at most every [`LONG_QUEUE_LOOK_EVERY`], not every
/// tick: listing it costs the server in proportion to its length.
const LONG_QUEUE: usize = 1000;
const LONG_QUEUE_LOOK_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Manager {
    /// Pilot nodes idle since, by node name.
    idle_since: BTreeMap<String, Instant>,
    /// Pilot nodes drained to leave (name → job).
    leaving: BTreeMap<String, u64>,
    submissions: u64,
    /// This installation's pilot jobs with their Slurm states as last seen, and when;
    /// a job submitted since is added as pending. None before the first look.
    slurm: Option<(Instant, BTreeMap<u64, String>)>,
    /// When the queue was last listed, and how many tasks it held.
    queue_look: Option<(Instant, usize)>,
}

pub async fn run(args: PilotArgs, ctx: PilotContext, shutdown: CancellationToken) -> Result<()> {
    let token_file = args
        .pilot_token_file
        .clone()
        .context("pilot allocations need --pilot-token-file")?;
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| {
            format!(
                "cannot read --pilot-token-file {} (it holds an admin's API token)",
                token_file.display()
            )
        })?
        .trim()
        .to_string();
    let admin = ctx.client.clone().with_token(token);
    let who = admin.whoami().await.context(
        "the server refuses the token of --pilot-token-file (give an admin's token: `taccd admin user add NAME --role admin`)",
    )?;
    tracing::info!(
        "pilot allocations on: {} short task(s) waiting ask for one of {} (at most {}), given back after {} idle; acting as {}",
        args.pilot_min_queue,
        args.pilot_time,
        args.pilot_max,
        args.pilot_idle,
        who.name
    );
    let job = PilotJob {
        taccd: match &args.pilot_taccd {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("cannot find this taccd binary")?,
        },
        server: args
            .pilot_server
            .clone()
            .unwrap_or_else(|| ctx.client.base_url().to_string()),
        server_fingerprint: args.pilot_server_fingerprint.clone(),
        token_file: PathBuf::new(),
        dir: ctx.state_dir.join("pilots"),
        time: args.pilot_time.as_std(),
        partition: ctx.partition.clone(),
        tag: ctx.tag.clone(),
    };
    let mut manager = Manager::default();
    loop {
        if let Err(e) = manager.tick(&args, &ctx, &admin, &job).await {
            tracing::warn!("pilot allocations: {e:#}");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

impl Manager {
    async fn tick(
        &mut self,
        args: &PilotArgs,
        ctx: &PilotContext,
        admin: &tacc_client::Client,
        job: &PilotJob,
    ) -> Result<()> {
        let nodes = admin.list_nodes().await?;
        let pilot_nodes = nodes
            .iter()
            .any(|node| node.labels.contains_key(labels::PILOT));
        let look = match &self.slurm {
            None => true,
            Some((at, jobs)) => {
                (pilot_nodes || jobs.values().any(|state| !ended(state)))
                    && at.elapsed() >= SLURM_LOOK_EVERY
            }
        };
        if look {
            let jobs = list_pilots(&ctx.tag, ctx.json)
                .await?
                .into_iter()
                .map(|j| (j.job_id, j.state))
                .collect();
            self.slurm = Some((Instant::now(), jobs));
        }
        let live: BTreeSet<u64> = self
            .slurm
            .iter()
            .flat_map(|(_, jobs)| jobs)
            .filter(|(_, state)| !ended(state))
            .map(|(id, _)| *id)
            .collect();
        for node in &nodes {
            let Some(pilot) = node
                .labels
                .get(labels::PILOT)
                .and_then(|v| v.parse::<u64>().ok())
            else {
                continue;
            };
            if !live.contains(&pilot) {
                // The allocation is over: the node is gone for good.
                if node.state != "up" || node.running_tasks.is_empty() {
                    self.idle_since.remove(&node.name);
                    self.leaving.remove(&node.name);
                    match admin.remove_node(&node.name).await {
                        Ok(()) => {
                            tracing::info!(
                                "pilot {} (Slurm job {pilot}) ended; node removed",
                                node.name
                            );
                            // Its working directories and caches; its log `<job>.log` stays.
                            let _ = std::fs::remove_dir_all(job.dir.join(pilot.to_string()));
                        }
                        Err(e) => tracing::warn!("cannot remove pilot node {}: {e}", node.name),
                    }
                }
                continue;
            }
            if self.leaving.contains_key(&node.name) {
                // Drained in an earlier round: whatever was placed before that shows here.
                if node.running_tasks.is_empty() {
                    tracing::info!(
                        "giving back pilot {} (Slurm job {pilot}): idle for {}",
                        node.name,
                        args.pilot_idle
                    );
                    cancel_pilot(pilot).await?;
                }
                continue;
            }
            if !node.running_tasks.is_empty() || node.state != "up" {
                self.idle_since.remove(&node.name);
                continue;
            }
            let since = *self
                .idle_since
                .entry(node.name.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() >= args.pilot_idle.as_std() {
                admin
                    .drain_node(&node.name, false)
                    .await
                    .with_context(|| format!("cannot drain pilot node {}", node.name))?;
                self.leaving.insert(node.name.clone(), pilot);
            }
        }
        let leaving: BTreeSet<u64> = self.leaving.values().copied().collect();
        // Allocations held and not leaving, those still starting included.
        let held = live.iter().filter(|id| !leaving.contains(id)).count();
        if held >= args.pilot_max {
            return Ok(());
        }
        if self
            .queue_look
            .is_some_and(|(at, listed)| listed > LONG_QUEUE && at.elapsed() < LONG_QUEUE_LOOK_EVERY)
        {
            return Ok(());
        }
        let short = args.short_secs();
        let queued = admin
            .list_tasks(&tacc_client::TaskQuery {
                states: vec![TaskState::Queued],
                limit: Some(10_000),
                ..Default::default()
            })
            .await?;
        self.queue_look = Some((Instant::now(), queued.len()));
        let waiting = queued
            .into_iter()
            .filter(|t| t.num_nodes <= 1 && t.time_limit_secs.is_some_and(|l| l <= short))
            .count();
        // One allocation per --pilot-min-queue short tasks waiting, requested together so
        // a long queue does not wait for one allocation to start before the next is asked.
        let wanted = (waiting / args.pilot_min_queue.max(1)).min(args.pilot_max);
        for _ in held..wanted {
            self.submit(args, admin, job, waiting).await?;
        }
        Ok(())
    }

    async fn submit(
        &mut self,
        args: &PilotArgs,
        admin: &tacc_client::Client,
        job: &PilotJob,
        waiting: usize,
    ) -> Result<()> {
        // A join token of its own per allocation, valid a little past the allocation's end.
        let issued = admin
            .create_agent_token(Some(args.pilot_time.as_secs() + 600), None, None)
            .await
            .context("cannot issue a join token for a pilot")?;
        std::fs::create_dir_all(&job.dir)
            .with_context(|| format!("cannot create {}", job.dir.display()))?;
        remove_expired_tokens(
            &job.dir,
            Duration::from_secs(args.pilot_time.as_secs() + 600),
        );
        self.submissions += 1;
        let token_file = job.dir.join(format!(
            "join-{}-{}.token",
            std::process::id(),
            self.submissions
        ));
        std::fs::write(&token_file, issued.token.as_bytes())
            .with_context(|| format!("cannot write {}", token_file.display()))?;
        let mut job = job.clone();
        job.token_file = token_file;
        let id = job.submit().await?;
        if let Some((_, jobs)) = &mut self.slurm {
            jobs.insert(id, "PENDING".to_string());
        }
        tracing::info!(
            "{waiting} short task(s) waiting: requested pilot allocation (Slurm job {id}, {})",
            args.pilot_time
        );
        Ok(())
    }
}

/// Join-token files older than their tokens' lifetime: nothing can use them any more.
fn remove_expired_tokens(dir: &std::path::Path, lifetime: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let expired = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > lifetime);
        if name.starts_with("join-") && name.ends_with(".token") && expired {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
