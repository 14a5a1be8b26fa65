//! `tcloud submit pipeline.yaml`: a pipeline file (a top-level `stages:`) is read and
//! checked, each stage's code directory snapshotted and uploaded (only missing chunks),
//! and the whole pipeline submitted in one request.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use tacc_proto::{SubmitPipeline, SubmitStage};
use tacc_schema::load_pipeline;

use super::Ctx;
use crate::errors::CliError;
use crate::format::{self, out, out_json};
use crate::sanitize::field;
use crate::upload::upload_snapshot;

/// Whether `path` is a pipeline file rather than a task file.
pub fn is_pipeline_file(path: &Path) -> bool {
    path.is_file()
        && std::fs::read_to_string(path).is_ok_and(|text| tacc_schema::is_pipeline(&text))
}

/// `tcloud check pipeline.yaml`: the pipeline is read and checked, nothing is sent.
pub fn check_pipeline(path: &Path, as_json: bool) -> Result<()> {
    match load_pipeline(path) {
        Ok(loaded) => {
            let stages: Vec<String> = loaded
                .spec
                .stages
                .iter()
                .map(|s| {
                    if s.needs.is_empty() {
                        field(&s.name)
                    } else {
                        format!("{} (needs {})", field(&s.name), field(&s.needs.join(", ")))
                    }
                })
                .collect();
            if as_json {
                return out_json(&json!({
                    "valid": true,
                    "name": loaded.spec.name,
                    "source": loaded.source.display().to_string(),
                    "stages": loaded.spec.stages.iter().map(|s| &s.name).collect::<Vec<_>>(),
                    "error": null,
                }));
            }
            out(format!(
                "{} is a valid pipeline: {}, stages {}",
                field(&path.display().to_string()),
                field(&loaded.spec.name),
                stages.join(" · ")
            ))?;
            Ok(())
        }
        Err(error) => {
            if as_json {
                out_json(&json!({"valid": false, "name": null, "error": error.to_string()}))?;
                return Err(CliError::silent(crate::errors::INVALID).into());
            }
            Err(CliError::schema(&error).into())
        }
    }
}

pub async fn submit_pipeline(
    ctx: &Ctx,
    path: &Path,
    follow: bool,
    as_json: bool,
    wait_for_capacity: bool,
) -> Result<()> {
    let loaded = load_pipeline(path).map_err(|e| CliError::schema(&e))?;
    let client = ctx.client()?;
    let mut stages = Vec::with_capacity(loaded.spec.stages.len());
    let mut uploaded = 0u64;
    for (stage, root) in loaded.spec.stages.iter().zip(&loaded.code_roots) {
        let exclude = stage.task.code.exclude.clone();
        let scanned = root.clone();
        let tree = tokio::task::spawn_blocking(move || tacc_compiler::scan(&scanned, &exclude))
            .await
            .context("the code scanner failed")?
            .map_err(|e| {
                CliError::invalid(format!(
                    "cannot snapshot the code directory {} of stage `{}`: {e}",
                    root.display(),
                    stage.name
                ))
            })?;
        let report = upload_snapshot(&client, tree, !as_json).await?;
        uploaded += report.uploaded_bytes;
        stages.push(SubmitStage {
            name: stage.name.clone(),
            needs: stage.needs.clone(),
            spec: serde_json::to_value(&stage.task).context("cannot encode a stage's spec")?,
            snapshot: report.snapshot,
        });
    }
    let reply = client
        .submit_pipeline(&SubmitPipeline {
            name: loaded.spec.name.clone(),
            stages,
            source: Some(loaded.source.display().to_string()),
            notify: loaded
                .spec
                .notify
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .context("cannot encode the pipeline's notify")?,
            wait_for_capacity,
        })
        .await?;
    // What the platform changed of a stage, said as a single submit says it.
    for (stage, overrides) in &reply.overrides {
        for applied in overrides {
            eprintln!(
                "warning: stage `{}`: {}",
                field(stage),
                crate::sanitize::text(&applied.to_string())
            );
        }
    }
    if as_json {
        out_json(&json!({
            "group": reply.group,
            "stages": reply.stages,
            "overrides": reply.overrides,
            "uploaded_bytes": uploaded,
        }))?;
    } else {
        out(format!(
            "Submitted pipeline {} ({}, {} stages) — uploaded {}",
            reply.group,
            field(&loaded.spec.name),
            reply.stages.len(),
            format::size(uploaded),
        ))?;
        for stage in &reply.stages {
            let what = match (stage.task, stage.group) {
                (Some(task), _) => format!("task {task}"),
                (None, Some(group)) if stage.sweep => format!("sweep {group}"),
                (None, Some(group)) => format!("array {group}"),
                (None, None) => String::new(),
            };
            let detail = if stage.state == "cached" {
                stage.reason.clone().unwrap_or_default()
            } else {
                what
            };
            out(format!("  {:<16} {:<9} {detail}", stage.name, stage.state))?;
        }
        if !follow {
            out(format!("  watch it with `tcloud ps {}`", reply.group))?;
        }
    }
    if follow {
        super::groups::follow_group(&client, reply.group).await?;
    }
    Ok(())
}
