//! Commands of the compiler layer: `rerun` (same snapshot, environment and datasets) and
//! `dataset ls` (datasets the administrator registered).

use anyhow::Result;
use serde_json::json;
use tacc_core::TaskId;

use super::Ctx;
use super::tasks::follow_to_end;
use crate::format::{out, out_json, table};
use crate::sanitize::field;

pub async fn rerun(ctx: &Ctx, id: TaskId, follow: bool, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let reply = client.rerun(id).await?;
    let new_id = reply.task_id;
    if as_json {
        out_json(&json!({
            "task_id": new_id,
            "rerun_of": id,
            "state": reply.state,
        }))?;
    } else {
        out(format!(
            "Submitted task {new_id}, a rerun of task {id} (same code snapshot, environment and datasets)"
        ))?;
        if !follow {
            out(format!("  follow its log with `tcloud logs -f {new_id}`"))?;
        }
    }
    if follow {
        follow_to_end(&client, new_id, as_json).await?;
    }
    Ok(())
}

pub async fn dataset_ls(ctx: &Ctx, as_json: bool) -> Result<()> {
    let datasets = ctx.client()?.list_datasets().await?;
    if as_json {
        return out_json(&datasets);
    }
    if datasets.is_empty() {
        out(
            "no datasets are registered on this cluster (an administrator registers one with \
             `taccd server --dataset NAME=SOURCE`); a task can still name an absolute path or \
             an http(s) URL as `source`",
        )?;
        return Ok(());
    }
    let mut t = table(["NAME", "SOURCE"]);
    for dataset in &datasets {
        t.add_row([field(&dataset.name), field(&dataset.source)]);
    }
    out(t.to_string())?;
    Ok(())
}
