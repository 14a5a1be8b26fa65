//! Pilot jobs: one Slurm allocation that runs a `taccd agent` (process backend) for as
//! long as it has short TACC tasks to run, instead of one `sbatch` job per task (as
//! HyperQueue's automatic allocation does). This module only speaks to Slurm: it writes
//! the pilot's batch script, submits it, lists this installation's pilots (by their
//! `--comment tacc-pilot:TAG`, distinct from the gangs' `tacc:TAG/…` so gang recovery
//! never mistakes one for the other) and cancels them. When to ask for one and when to
//! give one back is the Slurm agent's decision (`taccd`'s `pilots` module).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::script::quote;
use super::status::JobStatus;
use super::{read_jobs, slurm_command};
use crate::ExecError;

/// What one pilot job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PilotJob {
    /// The `taccd` binary the allocation runs (on the file system the nodes share).
    pub taccd: PathBuf,
    /// The server URL as the compute nodes reach it.
    pub server: String,
    /// `--server-fingerprint` for a TLS server with a self-signed certificate.
    pub server_fingerprint: Option<String>,
    /// A file holding a join token for the pilot's agent (private to the agent's user).
    pub token_file: PathBuf,
    /// Under it, each pilot's data directory `<job id>/` and its log `<job id>.log`.
    pub dir: PathBuf,
    /// The allocation's length (Slurm `--time`, whole minutes, at least one).
    pub time: Duration,
    pub partition: Option<String>,
    /// Marks this installation's pilots (`--comment tacc-pilot:TAG`).
    pub tag: String,
}

impl PilotJob {
    pub fn comment(&self) -> String {
        comment_of(&self.tag)
    }

    /// The batch script: the agent learns its job id and its allocation's end from the
    /// environment, and the end is counted from when the script starts, which is no
    /// earlier than the allocation's start, so the advertised end is never late.
    pub fn script(&self) -> String {
        let mut agent = format!(
            "exec {} agent --server {} --data-dir {}/\"$SLURM_JOB_ID\" --name \"pilot-$SLURM_JOB_ID\"",
            quote(&self.taccd.display().to_string()),
            quote(&self.server),
            quote(&self.dir.display().to_string()),
        );
        if let Some(fingerprint) = &self.server_fingerprint {
            agent.push_str(&format!(" --server-fingerprint {}", quote(fingerprint)));
        }
        format!(
            "#!/bin/sh\n# A TACC pilot: a taccd agent that runs short TACC tasks inside this allocation.\nset -e\nTACC_PILOT_JOB=\"$SLURM_JOB_ID\"\nTACC_PILOT_ENDS=$(( $(date +%s) + {secs} ))\nTACC_JOIN_TOKEN=$(cat {token})\nexport TACC_PILOT_JOB TACC_PILOT_ENDS TACC_JOIN_TOKEN\n{agent}\n",
            secs = self.minutes() * 60,
            token = quote(&self.token_file.display().to_string()),
        )
    }

    fn minutes(&self) -> u64 {
        self.time.as_secs().div_ceil(60).max(1)
    }

    fn sbatch_args(&self, script: &Path) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            "--job-name=tacc-pilot".to_string(),
            format!("--comment={}", self.comment()),
            "--nodes=1".to_string(),
            "--exclusive".to_string(),
            format!("--time={}", self.minutes()),
            format!("--chdir={}", self.dir.display()),
            format!("--output={}", self.dir.join("%j.log").display()),
        ];
        if let Some(partition) = &self.partition {
            args.push(format!("--partition={partition}"));
        }
        args.push(script.display().to_string());
        args
    }

    /// Write the script and `sbatch` it; the job id.
    pub async fn submit(&self) -> Result<u64, ExecError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| ExecError::Slurm(format!("cannot create {}: {e}", self.dir.display())))?;
        let script = self.dir.join("pilot.sh");
        std::fs::write(&script, self.script())
            .map_err(|e| ExecError::Slurm(format!("cannot write {}: {e}", script.display())))?;
        let args = self.sbatch_args(&script);
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = slurm_command("sbatch", &arg_refs).await?;
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| ExecError::Slurm(format!("sbatch printed no job id: {text}")))
    }
}

fn comment_of(tag: &str) -> String {
    format!("tacc-pilot:{tag}")
}

/// This installation's pilot jobs Slurm still lists (any state).
pub async fn list_pilots(tag: &str, json: bool) -> Result<Vec<JobStatus>, ExecError> {
    let wanted = comment_of(tag);
    Ok(read_jobs(json)
        .await?
        .into_values()
        .filter(|job| job.comment == wanted)
        .collect())
}

/// Give an allocation back.
pub async fn cancel_pilot(job: u64) -> Result<(), ExecError> {
    slurm_command("scancel", &[&job.to_string()])
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> PilotJob {
        PilotJob {
            taccd: "/opt/tacc/bin/taccd".into(),
            server: "http://10.0.0.1:8383".into(),
            server_fingerprint: None,
            token_file: "/shared/tacc/pilot.token".into(),
            dir: "/shared/tacc/pilots".into(),
            time: Duration::from_secs(90),
            partition: Some("debug".into()),
            tag: "lab".into(),
        }
    }

    #[test]
    fn the_pilot_script_runs_an_agent_that_knows_its_allocation() {
        let script = job().script();
        assert!(
            script.contains("TACC_PILOT_ENDS=$(( $(date +%s) + 120 ))"),
            "{script}"
        );
        assert!(
            script.contains("exec '/opt/tacc/bin/taccd' agent --server 'http://10.0.0.1:8383'"),
            "{script}"
        );
        assert!(script.contains("TACC_JOIN_TOKEN=$(cat '/shared/tacc/pilot.token')"));
        let args = job().sbatch_args(Path::new("/shared/tacc/pilots/pilot.sh"));
        assert!(args.contains(&"--time=2".to_string()), "{args:?}");
        assert!(args.contains(&"--comment=tacc-pilot:lab".to_string()));
        assert!(args.contains(&"--partition=debug".to_string()));
    }
}
