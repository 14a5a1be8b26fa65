//! Turning a gang of launch specs into a Slurm job: the `sbatch` argument list (never a
//! shell string), the batch script, the per-node script `srun` starts, and the per-rank
//! files on the shared file system.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SlurmConfig;
use super::stop::{self, StopPolicy};
use crate::LaunchSpec;

/// Everything that goes onto the `sbatch` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitOptions {
    pub job_name: String,
    pub comment: String,
    pub nodes: u32,
    pub node_list: Vec<String>,
    pub cpus_per_node: u64,
    pub memory_mb: Option<u64>,
    pub gpus_per_node: u32,
    /// Slurm's own limit, a backstop: TACC stops the job at the exact limit itself, and
    /// kills it once the grace after the stop signal has run out, so it covers both.
    pub time_limit_minutes: Option<u64>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub task: u64,
    pub attempt: u32,
    pub phase: String,
}

impl SubmitOptions {
    /// What the job needs, from a rank's launch spec: its owner, phase and placement.
    pub fn from_spec(
        spec: &LaunchSpec,
        nodes: u32,
        node_list: Vec<String>,
        config: &SlurmConfig,
        gang_name: &str,
    ) -> SubmitOptions {
        let owner = &spec.owner;
        let placement = &spec.placement;
        let task_name: String = owner
            .task_name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        SubmitOptions {
            job_name: format!("tacc-{}-{task_name}", owner.task),
            comment: format!("tacc:{}/{}", config.tag, gang_name),
            nodes,
            node_list,
            cpus_per_node: placement.cpu_millis.div_ceil(1000).max(1),
            // Slurm's `--mem` counts MiB; a part of one is not worth a request.
            memory_mb: Some(placement.memory_bytes / (1024 * 1024)).filter(|m| *m > 0),
            gpus_per_node: placement.gpu_indices.len() as u32,
            time_limit_minutes: spec
                .time_limit
                .map(|limit| ((limit + spec.kill_grace).as_millis().div_ceil(60_000) as u64) + 1),
            partition: config.partition.clone(),
            account: config
                .accounts
                .get(owner.user.as_str())
                .or_else(|| config.accounts.get("*"))
                .cloned(),
            qos: config.qos.get(owner.priority.as_str()).cloned(),
            task: owner.task.0,
            attempt: owner.attempt.0,
            phase: spec.phase.as_str().to_string(),
        }
    }

    /// The `sbatch` arguments for the gang in `dir`.
    pub fn sbatch_args(&self, dir: &Path) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name={}", self.job_name),
            format!("--comment={}", self.comment),
            format!("--nodes={}", self.nodes),
            "--ntasks-per-node=1".to_string(),
            format!("--cpus-per-task={}", self.cpus_per_node),
            format!("--chdir={}", dir.display()),
            format!("--output={}", dir.join("batch.log").display()),
        ];
        if !self.node_list.is_empty() {
            args.push(format!("--nodelist={}", self.node_list.join(",")));
        }
        if let Some(memory) = self.memory_mb {
            args.push(format!("--mem={memory}M"));
        }
        if self.gpus_per_node > 0 {
            args.push(format!("--gres=gpu:{}", self.gpus_per_node));
        }
        if let Some(minutes) = self.time_limit_minutes {
            args.push(format!("--time={minutes}"));
        }
        if let Some(partition) = &self.partition {
            args.push(format!("--partition={partition}"));
        }
        if let Some(account) = &self.account {
            args.push(format!("--account={account}"));
        }
        if let Some(qos) = &self.qos {
            args.push(format!("--qos={qos}"));
        }
        args.push(dir.join("job.sh").display().to_string());
        args
    }
}

/// What a restarted agent needs to re-find a gang.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangManifest {
    pub task: u64,
    pub attempt: u32,
    pub phase: String,
    pub ranks: Vec<GangRank>,
    pub time_limit_secs: Option<u64>,
    /// The task's stop signal; manifests from before it was recorded mean SIGTERM.
    #[serde(with = "stop::signal_name", default = "stop::signal_name::default")]
    pub stop_signal: nix::sys::signal::Signal,
    /// The grace after the stop signal; older manifests get [`stop::DEFAULT_GRACE`].
    #[serde(default = "default_grace_ms")]
    pub kill_grace_ms: u64,
}

fn default_grace_ms() -> u64 {
    stop::DEFAULT_GRACE.as_millis() as u64
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangRank {
    pub rank: u32,
    pub node: String,
}

impl GangManifest {
    pub fn read(dir: &Path) -> std::io::Result<GangManifest> {
        let text = std::fs::read_to_string(dir.join("manifest.json"))?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// How the re-found job is to be stopped: as its launch asked.
    pub fn stop_policy(&self) -> StopPolicy {
        StopPolicy {
            signal: self.stop_signal,
            grace: std::time::Duration::from_millis(self.kill_grace_ms),
        }
    }
}

/// Quote for bash: a single-quoted word.
pub(super) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// Write the gang directory: batch script, node script, and each rank's script,
/// environment (NUL-separated) and working directory.
pub fn write_gang<'a>(
    dir: &Path,
    options: &SubmitOptions,
    ranks: impl Iterator<Item = (u32, &'a LaunchSpec)>,
) -> std::io::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let mut manifest = GangManifest {
        task: options.task,
        attempt: options.attempt,
        phase: options.phase.clone(),
        ranks: Vec::new(),
        time_limit_secs: None,
        stop_signal: stop::signal_name::default(),
        kill_grace_ms: default_grace_ms(),
    };
    for ((rank, spec), node) in ranks.zip(options.node_list.iter()) {
        manifest.time_limit_secs = spec.time_limit.map(|l| l.as_secs().max(1));
        manifest.stop_signal = spec.stop_signal;
        manifest.kill_grace_ms = spec.kill_grace.as_millis() as u64;
        manifest.ranks.push(GangRank {
            rank,
            node: node.clone(),
        });
        std::fs::write(dir.join(format!("script-{rank}")), &spec.script)?;
        std::fs::write(
            dir.join(format!("workdir-{rank}")),
            spec.workdir.display().to_string(),
        )?;
        let env: BTreeMap<&String, &String> = spec.env.iter().collect();
        let mut file = std::fs::File::create(dir.join(format!("env-{rank}")))?;
        for (key, value) in env {
            write!(file, "{key}={value}\0")?;
        }
    }
    let gang = quote(&dir.display().to_string());
    let trap = manifest.stop_policy().node_trap_line();
    std::fs::write(
        dir.join("job.sh"),
        format!(
            "#!/bin/bash\n\
             # TACC gang job: one task per node, each runs node.sh.\n\
             exec srun --ntasks-per-node=1 --nodes=\"$SLURM_JOB_NUM_NODES\" --kill-on-bad-exit=0 bash {gang}/node.sh\n"
        ),
    )?;
    std::fs::write(
        dir.join("node.sh"),
        format!(
            "#!/bin/bash\n\
             # One node of a TACC gang: load this rank's environment, run its script,\n\
             # keep its output and exit code in per-rank files on the shared file system.\n\
             # The stop signal reaches this shell too: it outlives it to record the exit code.\n\
             {trap}\
             dir={gang}\n\
             rank=${{SLURM_NODEID:-0}}\n\
             master=${{SLURM_LAUNCH_NODE_IPADDR:-$(hostname)}}\n\
             mapfile -d '' vars < \"$dir/env-$rank\"\n\
             extra=(\"TACC_MASTER_ADDR=$master\" \"MASTER_ADDR=$master\" \"SLURM_JOB_ID=$SLURM_JOB_ID\")\n\
             if [ -n \"${{SLURM_JOB_GPUS-}}\" ] && [ -n \"${{CUDA_VISIBLE_DEVICES-}}\" ]; then\n\
             \x20 extra+=(\"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\")\n\
             fi\n\
             cd \"$(cat \"$dir/workdir-$rank\")\" || {{ echo \"tacc: no working directory on $(hostname)\" >\"$dir/err-$rank.log\"; echo 1 >\"$dir/exit-$rank\"; exit 1; }}\n\
             env -i \"${{vars[@]}}\" \"${{extra[@]}}\" bash \"$dir/script-$rank\" >\"$dir/out-$rank.log\" 2>\"$dir/err-$rank.log\" </dev/null\n\
             code=$?\n\
             echo $code >\"$dir/exit-$rank.partial\" && mv \"$dir/exit-$rank.partial\" \"$dir/exit-$rank\"\n\
             exit $code\n"
        ),
    )?;
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).map_err(std::io::Error::other)?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tacc_core::{Priority, TaskId, UserName};

    use super::*;

    fn spec(rank: u32) -> LaunchSpec {
        let mut spec = crate::contract::spec(Path::new("/shared/work"), "echo hi");
        spec.label = format!("tacc-7-1-r{rank}");
        spec.owner.task = TaskId(7);
        spec.owner.task_name = "mnist ddp".into();
        spec.owner.node_rank = rank;
        spec.owner.num_nodes = 2;
        spec.owner.rank = rank;
        spec.owner.user = UserName::new("alice");
        spec.owner.priority = Priority::High;
        spec.placement.cpu_millis = 3500;
        spec.placement.memory_bytes = 2048 * 1024 * 1024 + 1000;
        spec.placement.gpu_indices = vec![0, 1];
        spec.env.insert("TACC_GPUS".into(), "2".into());
        spec.time_limit = Some(Duration::from_secs(90));
        spec
    }

    #[test]
    fn sbatch_arguments_carry_resources_and_mappings() {
        let mut config = SlurmConfig::new("/state".into(), "ci");
        config.accounts.insert("*".into(), "lab".into());
        config.qos.insert("high".into(), "urgent".into());
        config.partition = Some("gpu".into());
        let options = SubmitOptions::from_spec(
            &spec(0),
            2,
            vec!["n1".into(), "n2".into()],
            &config,
            "ci-tacc-7-1",
        );
        let args = options.sbatch_args(Path::new("/state/gangs/g"));
        for expected in [
            "--parsable",
            "--job-name=tacc-7-mnist_ddp",
            "--comment=tacc:ci/ci-tacc-7-1",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--cpus-per-task=4",
            "--mem=2048M",
            "--gres=gpu:2",
            "--time=3",
            "--nodelist=n1,n2",
            "--partition=gpu",
            "--account=lab",
            "--qos=urgent",
            "--output=/state/gangs/g/batch.log",
        ] {
            assert!(
                args.iter().any(|a| a == expected),
                "{expected} missing: {args:?}"
            );
        }
        assert_eq!(args.last().unwrap(), "/state/gangs/g/job.sh");
        assert_eq!(options.phase, "run");
    }

    #[test]
    fn the_job_is_sized_from_the_typed_spec_not_the_environment() {
        let config = SlurmConfig::new("/state".into(), "ci");
        let mut lying = spec(0);
        for (key, value) in [
            ("TACC_CPUS", "64"),
            ("TACC_MEMORY_MB", "1"),
            ("TACC_USER", "bob"),
        ] {
            lying.env.insert(key.into(), value.into());
        }
        lying.phase = crate::Phase::Setup;
        let options = SubmitOptions::from_spec(&lying, 2, vec![], &config, "g");
        assert_eq!(options.cpus_per_node, 4);
        assert_eq!(options.memory_mb, Some(2048));
        assert_eq!(options.gpus_per_node, 2);
        assert_eq!(options.phase, "setup");
    }

    #[test]
    fn gang_files_round_trip_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let config = SlurmConfig::new(dir.path().into(), "ci");
        let (a, b) = (spec(0), spec(1));
        let options = SubmitOptions::from_spec(&a, 2, vec!["n1".into(), "n2".into()], &config, "g");
        let gang = dir.path().join("g");
        write_gang(&gang, &options, [(0, &a), (1, &b)].into_iter()).unwrap();
        let manifest = GangManifest::read(&gang).unwrap();
        assert_eq!(manifest.task, 7);
        assert_eq!(manifest.ranks[1].node, "n2");
        let env = std::fs::read(gang.join("env-1")).unwrap();
        assert!(env.split(|b| *b == 0).any(|kv| kv == b"TACC_GPUS=2"));
        assert_eq!(quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn the_manifest_keeps_the_stop_signal_and_grace_and_node_sh_traps_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = SlurmConfig::new(dir.path().into(), "ci");
        let mut a = spec(0);
        a.stop_signal = nix::sys::signal::Signal::SIGUSR1;
        a.kill_grace = Duration::from_millis(2500);
        let options = SubmitOptions::from_spec(&a, 1, vec!["n1".into()], &config, "g");
        let gang = dir.path().join("g");
        write_gang(&gang, &options, [(0, &a)].into_iter()).unwrap();
        let stop = GangManifest::read(&gang).unwrap().stop_policy();
        assert_eq!(stop.signal, nix::sys::signal::Signal::SIGUSR1);
        assert_eq!(stop.grace, Duration::from_millis(2500));
        let node = std::fs::read_to_string(gang.join("node.sh")).unwrap();
        assert!(node.lines().any(|l| l == "trap : USR1"), "{node}");
    }

    #[test]
    fn a_manifest_from_before_the_stop_signal_reads_with_sigterm_and_the_default_grace() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("manifest.json"),
            r#"{"task":7,"attempt":1,"phase":"run","ranks":[{"rank":0,"node":"n1"}],"time_limit_secs":null}"#,
        )
        .unwrap();
        let stop = GangManifest::read(dir.path()).unwrap().stop_policy();
        assert_eq!(stop.signal, nix::sys::signal::Signal::SIGTERM);
        assert_eq!(stop.grace, super::stop::DEFAULT_GRACE);
    }

    #[test]
    fn slurms_backstop_limit_leaves_room_for_the_grace() {
        let config = SlurmConfig::new("/state".into(), "ci");
        let mut long_grace = spec(0);
        long_grace.time_limit = Some(Duration::from_secs(60));
        long_grace.kill_grace = Duration::from_secs(120);
        let options = SubmitOptions::from_spec(&long_grace, 1, vec![], &config, "g");
        // 3 minutes of limit and grace, plus one to spare.
        assert_eq!(options.time_limit_minutes, Some(4));
    }
}
