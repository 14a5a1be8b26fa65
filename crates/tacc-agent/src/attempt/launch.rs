//! The launch stage of an attempt: choose the runtime (and say so when it is not the
//! node's default), report the attempt started, build each process's environment, then
//! run `setup` once and `run` — one process, or one per local rank — through the
//! executor, moving to another runtime when one fails for an infrastructure reason. Each
//! launch carries its owner (task, attempt, ranks, user, priority) and phase typed, for
//! the runtime to read.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tacc_compiler::{Instruction, NodeContext};
use tacc_core::UserName;
use tacc_exec::{ExitOutcome, LaunchSpec, Owner, Phase, Placement};
use tacc_proto::{AgentReport, Assignment};
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use super::execution::LogLines;
use super::prepare::Surroundings;
use super::ranks::{RankLaunch, RanksEnded, run_ranks, share_of};
use super::report;
use crate::Shared;
use crate::environments::EnvLease;
use crate::identity::TaskIdentity;
use crate::now;
use crate::runtimes::Failover;

/// Variables of the agent's own environment that tasks inherit.
const INHERITED_VARS: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TERM", "SHELL",
];

/// Everything the launch stage needs about the attempt on this node.
pub(super) struct Launch<'a> {
    pub assignment: &'a Assignment,
    pub instruction: &'a Instruction,
    pub identity: &'a TaskIdentity,
    pub surroundings: Surroundings,
    /// The checkpoint directory, when it holds the previous attempt's checkpoint.
    pub resume_from: Option<std::path::PathBuf>,
    /// What the process runtime binds onto `/tmp` and `/dev/shm`, where the agent gives
    /// attempts private ones.
    pub private_tmp: Option<tacc_exec::PrivateTmp>,
    /// When the attempt's preparation began: the time limit counts from there.
    pub started: Instant,
    pub workdir: &'a Path,
    /// The working directory's name, which names the launches too.
    pub name: &'a str,
}

/// `setup`, then `run`, to the attempt's end on this node. An `Err` is a failure before
/// or of `setup`, or a launch that could not start; how the task's own processes ended
/// is `Ok`.
pub(super) async fn setup_then_run(
    shared: &Arc<Shared>,
    launch: Launch<'_>,
    cancel: &CancellationToken,
) -> Result<RanksEnded, AttemptError> {
    let Launch {
        assignment,
        instruction,
        identity,
        surroundings,
        resume_from,
        private_tmp,
        started,
        workdir,
        name,
    } = launch;
    let attempt = assignment.attempt;
    let mut runtime = Failover::choose(shared, instruction, attempt, cancel)
        .await
        .map_err(AttemptError::NoRuntime)?;
    report(shared, AgentReport::Started { attempt, at: now() });
    shared.sampling.begin(
        attempt,
        assignment.node_rank,
        assignment.gpu_indices.clone(),
        now(),
    );
    shared
        .resizing
        .begin(attempt, instruction.processes_per_node.max(1));
    crate::runtimes::announce(shared, attempt, &runtime.choice);

    let node = NodeContext {
        node_rank: assignment.node_rank,
        local_rank: 0,
        gpu_indices: assignment.gpu_indices.clone(),
        master_addr: assignment.master_addr.clone(),
        master_port: assignment.master_port,
        workdir: workdir.to_path_buf(),
        userdir: surroundings.userdir,
    };
    let mut base: BTreeMap<String, String> = INHERITED_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    base.extend(identity.vars(&node.userdir));
    let processes = instruction.processes_per_node.max(1);
    // Judged once per launch: a stat of the MPS control pipe.
    let mps = instruction.gpu_share_percent.and_then(|_| {
        crate::gpu_share_env::mps_pipe_directory(
            std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok().as_deref(),
        )
    });
    let env_of = |local_rank: u32| {
        let node = NodeContext {
            local_rank,
            ..node.clone()
        };
        let mut env = instruction.environment(&node, &base);
        crate::gpu_share_env::apply(
            &mut env,
            shared.gpus.as_ref(),
            &assignment.gpu_indices,
            instruction.gpu_share_percent,
            mps.as_deref(),
        );
        if let Some(lease) = &surroundings.environment {
            activate(&mut env, lease);
        }
        crate::secrets::inject(&mut env, &assignment.secrets);
        if let Some(dir) = &resume_from {
            env.insert("TACC_RESUME_FROM".into(), dir.display().to_string());
        }
        env
    };
    let owner_of = |local_rank: u32| Owner {
        task: instruction.task,
        task_name: instruction.name.clone(),
        attempt: instruction.attempt,
        node_rank: assignment.node_rank,
        num_nodes: instruction.num_nodes,
        local_rank,
        rank: assignment.node_rank * processes + local_rank,
        user: UserName::new(&instruction.user),
        priority: instruction.priority,
    };
    // Lines carry the process's RANK wherever there is more than one.
    let several = instruction.num_nodes * processes > 1;
    let lines_of = |rank: u32| LogLines {
        prefix: several.then(|| format!("[{rank}] ")),
        secrets: shared.secrets.clone(),
    };
    let lines = lines_of(assignment.node_rank * processes);
    let limit = instruction.time_limit_secs.map(Duration::from_secs);
    let remaining = || limit.map(|l| l.saturating_sub(started.elapsed()));
    let grace = shared
        .lease
        .cap_grace(Duration::from_secs(instruction.kill_grace_secs));
    let stop_signal = stop_signal_of(instruction);
    let data_dir = &shared.config.data_dir;
    let placement = Placement {
        image: instruction.image.clone(),
        cpu_millis: instruction.per_node.cpu_millis,
        memory_bytes: instruction.per_node.memory_bytes,
        gpu_indices: assignment.gpu_indices.clone(),
        // Paths the environment names outside the working directory.
        extra_mounts: vec![
            (node.userdir.clone(), true),
            (data_dir.join("datasets"), false),
            (data_dir.join("envs"), false),
        ],
        run_as: identity.run_as,
        private_tmp,
    };
    let env = env_of(0);

    if let Some(setup) = &instruction.setup {
        let spec = LaunchSpec {
            label: format!("tacc-setup-{name}"),
            owner: owner_of(0),
            phase: Phase::Setup,
            workdir: workdir.to_path_buf(),
            script: setup.clone(),
            env: env.clone(),
            time_limit: remaining(),
            kill_grace: grace,
            stop_signal,
            placement: placement.clone(),
        };
        match runtime
            .launch(spec, lines.clone(), &format!("{name}-setup"))
            .await?
        {
            ExitOutcome::Exited(0) => {}
            ExitOutcome::Exited(code) => return Err(AttemptError::SetupExited(code)),
            ExitOutcome::Signalled(signal) => return Err(AttemptError::SetupSignalled(signal)),
            // Out of time, cancelled, or ended by the infrastructure during setup.
            other => return Ok(RanksEnded::whole_node(other)),
        }
    }
    if cancel.is_cancelled() {
        return Ok(RanksEnded::whole_node(ExitOutcome::Cancelled));
    }
    // Beside the run, in this same task (no task spawned and woken per attempt): the
    // metrics tail (only the first node's: every node's ranks see the same steps) and the
    // checkpoint sync. Both stop once the run has ended: every metric line is sent before
    // the attempt's end is reported, and the sync is over before the outputs are kept
    // (which upload the directory's final state).
    let beside_stop = CancellationToken::new();
    let beside = async {
        let tailing = async {
            if assignment.node_rank == 0 {
                crate::metrics::follow(
                    shared.clone(),
                    attempt,
                    workdir.join(tacc_compiler::METRICS_FILE),
                    beside_stop.clone(),
                )
                .await;
            }
        };
        let syncing = super::checkpoint::sync_while_running(
            shared.clone(),
            attempt,
            workdir.to_path_buf(),
            beside_stop.clone(),
        );
        tokio::join!(tailing, syncing);
    };
    let ended = async {
        if processes > 1 {
            let launches = (0..processes)
                .map(|local_rank| {
                    let owner = owner_of(local_rank);
                    let rank = owner.rank;
                    RankLaunch {
                        rank,
                        spec: LaunchSpec {
                            label: format!("tacc-{name}-p{local_rank}"),
                            owner,
                            phase: Phase::Run,
                            workdir: workdir.to_path_buf(),
                            script: instruction.run.clone(),
                            env: env_of(local_rank),
                            time_limit: remaining(),
                            kill_grace: grace,
                            stop_signal,
                            placement: Placement {
                                cpu_millis: share_of(placement.cpu_millis, processes),
                                memory_bytes: share_of(placement.memory_bytes, processes),
                                ..placement.clone()
                            },
                        },
                        lines: lines_of(rank),
                        record_name: format!("{name}-p{local_rank}"),
                    }
                })
                .collect();
            let executor = crate::runtimes::executor(shared, runtime.choice.runtime);
            run_ranks(shared, executor, attempt, launches, cancel).await
        } else {
            let spec = LaunchSpec {
                label: format!("tacc-{name}"),
                owner: owner_of(0),
                phase: Phase::Run,
                workdir: workdir.to_path_buf(),
                script: instruction.run.clone(),
                env,
                time_limit: remaining(),
                kill_grace: grace,
                stop_signal,
                placement,
            };
            Ok(RanksEnded::whole_node(
                runtime.launch(spec, lines, name).await?,
            ))
        }
    };
    let run = async {
        let ended = ended.await;
        beside_stop.cancel();
        ended
    };
    let (ended, ()) = tokio::join!(run, beside);
    ended
}

/// Put the environment's `bin` first on PATH and set its marker variable, as `activate` does.
fn activate(env: &mut BTreeMap<String, String>, lease: &EnvLease) {
    let path = match env.get("PATH") {
        Some(path) if !path.is_empty() => format!("{}:{path}", lease.bin_dir.display()),
        _ => lease.bin_dir.display().to_string(),
    };
    env.insert("PATH".into(), path);
    env.remove("PYTHONHOME");
    env.extend(lease.vars.clone());
}

/// The signal that asks the attempt to stop: the task's `checkpoint.signal` (validated by
/// the server; a name this node does not know falls back to SIGTERM, said in its log).
fn stop_signal_of(instruction: &Instruction) -> nix::sys::signal::Signal {
    use nix::sys::signal::Signal;
    let Some(name) = instruction.stop_signal.as_deref() else {
        return Signal::SIGTERM;
    };
    name.parse().unwrap_or_else(|_| {
        tracing::warn!(
            "task {} asks for the checkpoint signal `{name}`, which this node does not know: \
             it gets SIGTERM instead",
            instruction.task
        );
        Signal::SIGTERM
    })
}
