//! `tcloud sweep gN`: a sweep's leaderboard (best trial first, with its parameters and
//! the best and last value of the metric), `--json`, and `--best-outputs DIR` to fetch
//! the best succeeded trial's outputs. Parameters and reasons come from the task file
//! and the server: they go through [`crate::sanitize`] before reaching the terminal.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use tacc_core::GroupId;
use tacc_proto::SweepBoard;

use super::Ctx;
use crate::errors::{CliError, TASK_FAILED};
use crate::format::{out, out_json, precise_duration, print_table, table};
use crate::sanitize::{field, opt_field};

fn value(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.4}"))
}

fn parameters(trial: &tacc_proto::TrialView) -> String {
    trial
        .parameters
        .iter()
        .map(|(name, value)| format!("{}={}", field(name), field(value)))
        .collect::<Vec<_>>()
        .join(" ")
}

pub async fn sweep(
    ctx: &Ctx,
    group: GroupId,
    json: bool,
    best_outputs: Option<PathBuf>,
) -> Result<()> {
    let client = ctx.client()?;
    let board: SweepBoard = client.sweep(group).await?;
    if let Some(dest) = best_outputs {
        let Some(best) = board.best_trial else {
            return Err(CliError::invalid(format!(
                "sweep {group} has no succeeded trial with a `{}` value yet: wait for one \
                 (`tcloud sweep {group}`) and try again",
                field(&board.metric)
            ))
            .into());
        };
        return super::files::download(ctx, best, None, None, None, Some(dest)).await;
    }
    if json {
        return out_json(&board);
    }
    out(format!(
        "sweep {} `{}`: {} over {} trials ({} at once), {} {}{}",
        board.group.id,
        field(&board.group.name),
        board.method,
        board.max_trials,
        board.parallel,
        board.goal,
        field(&board.metric),
        board
            .best_trial
            .map_or(String::new(), |t| format!("; best trial: task {t}")),
    ))?;
    let mut t = table([
        "TRIAL",
        "TASK",
        "STATE",
        "PARAMETERS",
        "BEST",
        "LAST",
        "STEP",
        "REASON",
    ]);
    for trial in &board.trials {
        t.add_row([
            trial.index.to_string(),
            trial.task_id.to_string(),
            trial.state.as_str().to_uppercase(),
            parameters(trial),
            value(trial.best),
            value(trial.last),
            trial.step.map_or_else(|| "-".into(), |s| s.to_string()),
            opt_field(trial.reason.as_deref()),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

/// The sweep has launched every trial and every one has ended.
fn ended(board: &SweepBoard) -> bool {
    board.trials.len() as u32 >= board.max_trials
        && board.trials.iter().all(|t| t.state.is_terminal())
}

/// `submit --follow` on a sweep: wait until every trial has been launched and has
/// ended (a sweep has no unfinished trial for a moment between one trial's end and the
/// next one's launch), then one line; success when there is a best trial.
pub async fn follow_sweep(
    client: &tacc_client::Client,
    id: GroupId,
    started: Instant,
) -> Result<()> {
    let mut board = client.sweep(id).await?;
    while !ended(&board) {
        tokio::time::sleep(super::groups::POLL).await;
        board = client.sweep(id).await?;
    }
    let stopped = board
        .trials
        .iter()
        .filter(|t| {
            t.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("early_stopped:"))
        })
        .count();
    let best = board
        .trials
        .iter()
        .find(|t| Some(t.task_id) == board.best_trial);
    eprintln!(
        "sweep {id} ended after {}: {} trials, {stopped} stopped early; {}",
        precise_duration(started.elapsed().as_millis() as u64),
        board.trials.len(),
        match best {
            Some(best) => format!(
                "best trial {} (task {}): {} {} {}",
                best.index,
                best.task_id,
                parameters(best),
                field(&board.metric),
                value(best.last)
            ),
            None => format!("no trial succeeded with a `{}` value", field(&board.metric)),
        }
    );
    if best.is_some() {
        Ok(())
    } else {
        Err(CliError::silent(TASK_FAILED).into())
    }
}
