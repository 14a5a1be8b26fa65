//! `tcloud dev [DIR]`: a dev session. DIR's code (and its task file's environment,
//! resources and setup, when it has one) queued as a `kind: interactive` task that holds
//! its allocation; once it runs, `tcloud shell` into it. It ends when idle for its
//! `idle_timeout` (no session in use, no CPU or GPU used), or with `tcloud cancel`.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tacc_core::{ByteSize, HumanDuration, TaskId, TaskState};
use tacc_proto::SubmitTask;
use tacc_schema::{TaskKind, TaskSpec};

use super::Ctx;
use crate::errors::{CliError, FAILURE};
use crate::format::out;
use crate::sanitize::field;
use crate::upload::upload_snapshot;

/// What `tcloud dev` was asked beside the directory.
#[derive(Debug, Default)]
pub struct DevOptions {
    pub gpus: Option<tacc_core::GpuCount>,
    pub cpus: Option<f64>,
    pub memory: Option<ByteSize>,
    pub idle_timeout: Option<HumanDuration>,
    pub name: Option<String>,
    /// Queue it and say how to enter, without waiting for it or opening a shell.
    pub detach: bool,
}

/// Whether `dir` holds a task file of its own.
fn has_task_file(dir: &Path) -> bool {
    tacc_schema::TASK_FILE_NAMES
        .iter()
        .chain(std::iter::once(&tacc_schema::LEGACY_FILE_NAME))
        .any(|name| dir.join(name).is_file())
}

/// A dev session to submit: its spec, the code it snapshots, and where it came from.
struct DevTask {
    spec: TaskSpec,
    code_root: std::path::PathBuf,
    source: std::path::PathBuf,
    warnings: Vec<String>,
}

/// The dev session's task: DIR's task file made interactive (its `run` replaced by the
/// holder: a dev session runs what its user types), or a bare one for DIR's code.
fn dev_task(path: &Path, options: &DevOptions) -> Result<DevTask> {
    let mut task = if path.is_file() || has_task_file(path) {
        let loaded = tacc_schema::load_task(path).map_err(|e| CliError::schema(&e))?;
        let warnings = loaded.rendered_warnings();
        let mut spec = loaded.spec;
        if spec.kind == TaskKind::Batch {
            spec.run = tacc_schema::DEV_HOLDER.to_string();
            spec.array = None;
            spec.sweep = None;
        }
        spec.kind = TaskKind::Interactive;
        DevTask {
            spec,
            code_root: loaded.code_root,
            source: loaded.source,
            warnings,
        }
    } else {
        let dir = std::fs::canonicalize(path).map_err(|e| {
            CliError::invalid(format!(
                "cannot use {} as the dev session's code directory: {e}",
                path.display()
            ))
        })?;
        if !dir.is_dir() {
            return Err(CliError::invalid(format!("{} is not a directory", dir.display())).into());
        }
        // Named after the directory, as a task file there would be.
        let source = dir.join("task.yaml");
        let (spec, _) =
            tacc_schema::parse_task(&source.display().to_string(), "kind: interactive\n")
                .map_err(|e| CliError::schema(&e))?;
        DevTask {
            spec,
            code_root: dir,
            source,
            warnings: Vec::new(),
        }
    };
    let spec = &mut task.spec;
    if let Some(gpus) = options.gpus {
        spec.resources.gpus = gpus;
    }
    if let Some(cpus) = options.cpus {
        spec.resources.cpus = cpus;
    }
    if let Some(memory) = options.memory {
        spec.resources.memory = memory;
    }
    if let Some(timeout) = options.idle_timeout {
        spec.idle_timeout = Some(timeout);
    }
    if let Some(name) = &options.name {
        spec.name = name.clone();
    }
    spec.validate().map_err(|e| CliError::schema(&e))?;
    Ok(task)
}

/// How to come back to (or end) a running dev session.
fn how_to_return(id: TaskId, spec: &TaskSpec) -> String {
    let idle = spec
        .dev_idle_timeout()
        .unwrap_or(tacc_schema::DEFAULT_IDLE_TIMEOUT);
    format!(
        "dev session {id} holds its allocation until idle for {idle} (no session in use, no CPU \
         or GPU used): `tcloud shell {id}` to return, `tcloud cancel {id}` to end it now"
    )
}

pub async fn dev(ctx: &Ctx, path: &Path, options: DevOptions) -> Result<()> {
    let task = dev_task(path, &options)?;
    for warning in &task.warnings {
        eprintln!("{}", crate::sanitize::text(warning));
    }
    let client = ctx.client()?;
    let tree = super::submit::scan_code(&task.code_root, &task.spec).await?;
    let report = upload_snapshot(&client, tree, true).await?;
    let reply = client
        .submit(&SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&task.spec).context("cannot encode the task spec")?,
            snapshot: report.snapshot.clone(),
            source: Some(task.source.display().to_string()),
            wait_for_capacity: false,
        })
        .await?;
    let id = reply.task_id;
    out(format!(
        "Submitted dev session {id} ({}) — snapshot {}",
        field(&task.spec.name),
        report.snapshot.short()
    ))?;
    let interactive = std::io::stdin().is_terminal();
    if options.detach || !interactive {
        out(how_to_return(id, &task.spec))?;
        return Ok(());
    }
    // Wait for it to start, saying once why it waits.
    let mut said_waiting = false;
    loop {
        let view = client.get_task(id).await?;
        match view.state {
            TaskState::Running => break,
            state if state.is_terminal() => {
                return Err(CliError::new(
                    FAILURE,
                    format!(
                        "dev session {id} is {state} before it ran{}",
                        view.reason
                            .map(|r| format!(": {}", field(&r)))
                            .unwrap_or_default()
                    ),
                )
                .into());
            }
            state => {
                if !said_waiting {
                    eprintln!(
                        "Waiting for dev session {id} to start ({state}; `tcloud why {id}` \
                         says why it waits)…"
                    );
                    said_waiting = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let shell = super::interactive::shell(ctx, id, 0).await;
    eprintln!("{}", how_to_return(id, &task.spec));
    shell
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_a_task_file_becomes_a_bare_dev_session_named_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("my-project");
        std::fs::create_dir(&project).unwrap();
        let options = DevOptions {
            gpus: Some(2.into()),
            idle_timeout: Some(HumanDuration::from_secs(600)),
            ..Default::default()
        };
        let task = dev_task(&project, &options).unwrap();
        assert_eq!(task.spec.name, "my-project");
        assert!(task.spec.is_interactive());
        assert_eq!(task.spec.run, tacc_schema::DEV_HOLDER);
        assert_eq!(task.spec.resources.gpus, 2.into());
        assert_eq!(task.spec.idle_timeout, Some(HumanDuration::from_secs(600)));
    }

    #[test]
    fn a_task_file_keeps_its_environment_and_setup_but_not_its_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("task.yaml"),
            "name: train\nresources: {cpus: 2}\nsetup: pip list\nenvironment:\n  vars: {A: b}\nrun: python train.py\n",
        )
        .unwrap();
        let task = dev_task(dir.path(), &DevOptions::default()).unwrap();
        assert!(task.spec.is_interactive());
        assert_eq!(task.spec.run, tacc_schema::DEV_HOLDER);
        assert_eq!(task.spec.setup.as_deref(), Some("pip list"));
        assert_eq!(task.spec.resources.cpus, 2.0);
        assert_eq!(
            task.spec.environment.vars.get("A").map(String::as_str),
            Some("b")
        );
        // A timeout below the minimum is refused like the file's own mistakes.
        let short = DevOptions {
            idle_timeout: Some(HumanDuration::from_secs(2)),
            ..Default::default()
        };
        assert!(dev_task(dir.path(), &short).is_err());
    }
}
