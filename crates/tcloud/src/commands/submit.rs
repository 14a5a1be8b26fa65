//! `tcloud submit` and `tcloud check`.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use tacc_proto::SubmitTask;
use tacc_schema::{LoadedTask, TaskSpec, load_task};

use super::Ctx;
use super::tasks::follow_to_end;
use crate::errors::{CliError, INVALID};
use crate::format::{self, out, out_json};
use crate::sanitize::{self, field};
use crate::upload::upload_snapshot;

fn load(path: &Path) -> Result<LoadedTask> {
    load_task(path).map_err(|e| CliError::schema(&e).into())
}

/// The code directory's tree as the snapshot will hold it (its `code.exclude` applied),
/// scanned off the async threads.
pub(super) async fn scan_code(root: &Path, spec: &TaskSpec) -> Result<tacc_compiler::ScannedTree> {
    let (dir, exclude) = (root.to_path_buf(), spec.code.exclude.clone());
    tokio::task::spawn_blocking(move || tacc_compiler::scan(&dir, &exclude))
        .await
        .context("the code scanner failed")?
        .map_err(|e| {
            CliError::invalid(format!(
                "cannot snapshot the code directory {}: {e}",
                root.display()
            ))
            .into()
        })
}

fn print_warnings(task: &LoadedTask) {
    for warning in task.rendered_warnings() {
        eprintln!("{}", sanitize::text(&warning));
    }
}

/// `16 cpu, 64GiB, 4 gpu` with the GPU type, time limit and disk limit when set.
fn describe_resources(spec: &TaskSpec) -> String {
    let r = &spec.resources;
    let mut text = format::resources_with_share(&r.per_node(), r.gpu_share_percent());
    if let Some(gpu_type) = &r.gpu_type {
        text.push_str(&format!(" ({gpu_type})"));
    }
    if let Some(limit) = r.time_limit {
        text.push_str(&format!(", time limit {limit}"));
    }
    if let Some(disk) = r.disk {
        text.push_str(&format!(", disk {disk}"));
    }
    text
}

fn first_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("").to_string();
    if lines.next().is_some() {
        format!("{first} …")
    } else {
        first
    }
}

/// The server's refusal of one field of the task (a rule only it knows, such as where
/// webhooks may go), pointed at the line of the file that wrote the field, as the file's
/// own mistakes are; any other error as it came.
fn locate(task: &LoadedTask, error: tacc_client::ClientError) -> anyhow::Error {
    if let tacc_client::ClientError::Api { code, message, .. } = &error
        && code == "invalid_task"
        && let Some(tacc_schema::SchemaError::Invalid {
            field,
            message,
            help,
        }) = tacc_schema::SchemaError::invalid_from_rendered(message)
    {
        return CliError::schema(&task.error_at(&field, message, help)).into();
    }
    error.into()
}

pub fn check(path: &Path, as_json: bool) -> Result<()> {
    if super::pipelines::is_pipeline_file(path) {
        return super::pipelines::check_pipeline(path, as_json);
    }
    match load_task(path) {
        Ok(task) => {
            if as_json {
                return out_json(&json!({
                    "valid": true,
                    "name": task.spec.name,
                    "source": task.source.display().to_string(),
                    "warnings": task.warnings,
                    "error": null,
                }));
            }
            print_warnings(&task);
            let file = task
                .source
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| task.source.display().to_string());
            // A task file may come from someone else's repository: show, never execute.
            out(format!(
                "{} is valid: {}, {} node(s) × ({}), run: {}",
                field(&file),
                field(&task.spec.name),
                task.spec.resources.nodes,
                field(&describe_resources(&task.spec)),
                field(&first_line(&task.spec.run))
            ))?;
            Ok(())
        }
        Err(error) => {
            if as_json {
                // Each located mistake with its place, in file order, for editors and CI.
                let errors: Vec<_> = error
                    .diagnostics()
                    .iter()
                    .map(|d| {
                        json!({
                            "file": d.file,
                            "line": d.line,
                            "column": d.column,
                            "message": d.message,
                            "help": d.help,
                        })
                    })
                    .collect();
                out_json(&json!({
                    "valid": false,
                    "name": null,
                    "warnings": [],
                    "error": error.to_string(),
                    "errors": errors,
                }))?;
                return Err(CliError::silent(INVALID).into());
            }
            Err(CliError::schema(&error).into())
        }
    }
}

/// What `tcloud submit` was asked beside the file.
pub struct SubmitOptions {
    pub follow: bool,
    pub as_json: bool,
    pub name: Option<String>,
    pub array: Option<String>,
    /// Accept a request no node can hold today, for a cluster that will grow.
    pub wait_for_capacity: bool,
}

/// What the platform changed of what the task asked for, each a warning on stderr.
/// The legacy options the task file's translation did not honour as written, as the
/// overrides the task keeps (`tcloud show`: asked and applied).
fn translated(task: &LoadedTask) -> Vec<tacc_proto::Override> {
    task.legacy_changes
        .iter()
        .map(|change| tacc_proto::Override {
            field: change.key.clone(),
            asked: Some(change.asked.clone()),
            applied: change.applied.clone(),
            why: change.why.clone(),
        })
        .collect()
}

fn print_overrides(overrides: &[tacc_proto::Override]) {
    for applied in overrides {
        eprintln!("warning: {}", sanitize::text(&applied.to_string()));
    }
}

pub async fn submit(ctx: &Ctx, path: &Path, options: SubmitOptions) -> Result<()> {
    let SubmitOptions {
        follow,
        as_json,
        name,
        array,
        wait_for_capacity,
    } = options;
    if super::pipelines::is_pipeline_file(path) {
        if name.is_some() || array.is_some() {
            return Err(CliError::invalid(
                "--name and --array apply to a task file; a pipeline file names itself and its stages (set `array:` on a stage)",
            )
            .into());
        }
        return super::pipelines::submit_pipeline(ctx, path, follow, as_json, wait_for_capacity)
            .await;
    }
    let mut task = load(path)?;
    print_warnings(&task);
    if let Some(name) = name {
        task.spec.name = name;
        task.spec.validate().map_err(|e| CliError::schema(&e))?;
    }
    if let Some(array) = array {
        let parsed = array
            .parse::<tacc_schema::ArraySpec>()
            .map_err(|e| CliError::invalid(format!("--array {array}: {e}")))?;
        task.spec.array = Some(parsed);
    }
    let client = ctx.client()?;
    let tree = scan_code(&task.code_root, &task.spec).await?;
    let report = upload_snapshot(&client, tree, !as_json).await?;
    let spec = serde_json::to_value(&task.spec).context("cannot encode the task spec")?;
    let translated = translated(&task);
    let reply = client
        .submit(&SubmitTask {
            translated: translated.clone(),
            spec,
            snapshot: report.snapshot.clone(),
            source: Some(task.source.display().to_string()),
            wait_for_capacity,
        })
        .await
        .map_err(|error| locate(&task, error))?;
    let id = reply.task_id;
    if !as_json {
        // What this client translated was warned of already, with its line and caret.
        let server_said: Vec<_> = reply
            .overrides
            .iter()
            .filter(|o| !translated.contains(o))
            .cloned()
            .collect();
        print_overrides(&server_said);
    }
    if let Some(group) = &reply.group {
        if as_json {
            out_json(&json!({
                "group": group.group,
                "kind": if task.spec.sweep.is_some() { "sweep" } else { "array" },
                "trials": task.spec.sweep.as_ref().map(|s| s.trials().len()),
                "elements": group.elements,
                "first_task": group.first_task,
                "state": reply.state,
                "snapshot": report.snapshot,
                "uploaded_bytes": report.uploaded_bytes,
                "total_bytes": report.total_bytes,
                "overrides": reply.overrides,
            }))?;
        } else {
            out(format!(
                "Submitted {} — snapshot {}, uploaded {} of {}",
                group_announcement(&task.spec, group),
                report.snapshot.short(),
                format::size(report.uploaded_bytes),
                format::size(report.total_bytes),
            ))?;
            if !follow {
                out(format!("  watch it with `tcloud ps {}`", group.group))?;
            }
        }
        if follow {
            super::groups::follow_group(&client, group.group).await?;
        }
        return Ok(());
    }
    if as_json {
        out_json(&json!({
            "task_id": id,
            "state": reply.state,
            "snapshot": report.snapshot,
            "uploaded_bytes": report.uploaded_bytes,
            "total_bytes": report.total_bytes,
            "chunks_uploaded": report.chunks_uploaded,
            "chunks_total": report.chunks_total,
            "overrides": reply.overrides,
        }))?;
    } else {
        out(format!(
            "Submitted task {id} ({}) — snapshot {}, uploaded {} of {} ({} of {} chunks)",
            field(&task.spec.name),
            report.snapshot.short(),
            format::size(report.uploaded_bytes),
            format::size(report.total_bytes),
            report.chunks_uploaded,
            report.chunks_total
        ))?;
        if !follow {
            out(format!("  follow its log with `tcloud logs -f {id}`"))?;
        }
    }
    if follow {
        follow_to_end(&client, id, as_json).await?;
    }
    Ok(())
}

/// What a submitted group is, counted as the task file counts it: a sweep by its trials
/// (the server queues only the first `parallel` of them at once, which is what
/// `group.elements` counts), an array by its elements.
fn group_announcement(spec: &TaskSpec, group: &tacc_proto::GroupSubmitted) -> String {
    match &spec.sweep {
        Some(sweep) => format!(
            "sweep {} ({}, {} trials, {} at a time: tasks {}…)",
            group.group,
            field(&spec.name),
            sweep.trials().len(),
            sweep.parallel,
            group.first_task,
        ),
        None => format!(
            "array {} ({}, {} elements: tasks {}…)",
            group.group,
            field(&spec.name),
            group.elements,
            group.first_task,
        ),
    }
}
