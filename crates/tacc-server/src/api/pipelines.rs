//! Pipeline routes: a whole pipeline submitted in one request, and the agents' fetch of a
//! stage's input files (the kept outputs of the stages it needs).

use tacc_proto::{PipelineSubmitted, StageView, SubmitPipeline};
use tacc_schema::TaskSpec;
use tacc_store::{Created, StageRecord, StageSource};

use super::idempotency::{RequestKey, stored};
use super::outputs::rank_dir;
use super::prelude::*;
use crate::control::StageSubmission;

pub(super) async fn submit_pipeline(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(body): Json<SubmitPipeline>,
) -> ApiResult<Response> {
    let user = user_of(&caller)?;
    let request = serde_json::to_vec(&body).map_err(|e| ServerError::Internal(e.to_string()))?;
    let key = RequestKey::from_request(&headers, &user.name, "POST /v1/pipelines", &request)?;
    if let Some(key) = &key
        && let Some(reply) = key.replay(&app.control).await?
    {
        return Ok(reply);
    }
    super::cluster_stop::refuse_while_stopping(&app)?;
    let submitted = submit_new(&app, user, body, key.as_ref()).await;
    match (submitted, &key) {
        (Err(error), Some(key)) => key.after_failure(&app.control, error).await,
        // The kept reply, so that a retry gets exactly what this request got.
        (Ok(_), Some(key)) => key.replay(&app.control).await?.ok_or_else(|| {
            ServerError::Internal("the pipeline's idempotency key was not kept".into())
        }),
        (done, None) => done,
    }
}

/// A new pipeline's stages as [`Control::stage_views`] shows them, from what was just
/// made: every stage that runs is queued. `sweeps` names the stages that are sweeps.
fn stages_at_creation(
    stages: &[StageRecord],
    tasks: &[TaskRecord],
    sweeps: &std::collections::BTreeSet<String>,
) -> Vec<StageView> {
    stages
        .iter()
        .map(|stage| {
            let (task, group) = match stage.source {
                StageSource::Task(task) => (Some(task), None),
                StageSource::Group(group) => (None, Some(group)),
            };
            let mut counts = std::collections::BTreeMap::new();
            let (state, reason) = if stage.cached {
                (
                    "cached".to_string(),
                    Some(format!("cached: {}", stage.source)),
                )
            } else {
                let mine: Vec<&TaskRecord> = tasks
                    .iter()
                    .filter(|t| Some(t.id) == task || (group.is_some() && t.group == group))
                    .collect();
                if group.is_some() {
                    for t in &mine {
                        *counts.entry(t.state).or_insert(0u64) += 1;
                    }
                }
                let state = if mine.is_empty() { "empty" } else { "queued" };
                (state.to_string(), None)
            };
            StageView {
                name: stage.name.clone(),
                needs: stage.needs.clone(),
                state,
                task,
                group,
                sweep: sweeps.contains(&stage.name),
                counts,
                reason,
            }
        })
        .collect()
}

async fn submit_new(
    app: &AppState,
    user: &UserCaller,
    body: SubmitPipeline,
    key: Option<&RequestKey>,
) -> ApiResult<Response> {
    let notify: Option<tacc_schema::NotifySpec> = body
        .notify
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| {
            ServerError::InvalidTask(format!(
                "the pipeline's `notify` is not valid: {e}; write {{\"webhook\": URL, \"secret\": NAME}}"
            ))
        })?;
    let mut stages = Vec::with_capacity(body.stages.len());
    let mut sweeps = std::collections::BTreeSet::new();
    let mut tasks = 0u64;
    for stage in body.stages {
        let spec: TaskSpec = serde_json::from_value(stage.spec).map_err(|e| {
            ServerError::InvalidTask(format!(
                "the spec of stage `{}` is not valid: {e}",
                stage.name
            ))
        })?;
        tasks += spec.array.as_ref().map_or(1, |a| a.len() as u64);
        if spec.sweep.is_some() {
            sweeps.insert(stage.name.clone());
        }
        // Knowing a snapshot's id is not a capability: only who uploaded it may run it.
        if user.role != tacc_core::Role::Admin
            && !app
                .control
                .query()
                .is_snapshot_owner(&stage.snapshot, &user.name)
                .await?
        {
            return Err(ServerError::InvalidTask(format!(
                "snapshot {} of stage `{}` is unknown to this server: upload the code first \
                 (tcloud submit does this)",
                stage.snapshot, stage.name
            )));
        }
        stages.push(StageSubmission {
            name: stage.name,
            needs: stage.needs,
            spec,
            snapshot: stage.snapshot,
        });
    }
    app.submissions.admit_tasks(user, tasks).await?;
    let keyed = key.map(|k| {
        let sweeps = sweeps.clone();
        k.keyed(Box::new(move |created| match created {
            Created::Pipeline(group, stages, tasks) => stored(
                StatusCode::CREATED,
                &PipelineSubmitted {
                    group: group.id,
                    stages: stages_at_creation(stages, tasks, &sweeps),
                    overrides: stage_overrides(stages, tasks),
                },
            ),
            Created::Task(_) | Created::Group(..) => {
                unreachable!("a pipeline's key is kept with the pipeline")
            }
        }))
    });
    let (group, stage_records) = app
        .pipelines
        .submit(
            &user.name,
            body.name,
            stages,
            crate::control::SubmitOptions {
                source: body.source,
                wait_for_capacity: body.wait_for_capacity,
                ..Default::default()
            },
            notify,
            keyed,
        )
        .await?;
    let stages = app.control.facts.stage_views(group.id).await?;
    let mut tasks = Vec::new();
    for stage in stage_records.iter().filter(|s| !s.cached) {
        match stage.source {
            StageSource::Task(task) => tasks.extend(app.control.query().task(task).await?),
            StageSource::Group(group) => tasks.extend(
                app.control
                    .query()
                    .tasks(&tacc_store::TaskFilter {
                        group: Some(group),
                        limit: Some(1),
                        ..Default::default()
                    })
                    .await?,
            ),
        }
    }
    Ok((
        StatusCode::CREATED,
        Json(PipelineSubmitted {
            group: group.id,
            stages,
            overrides: stage_overrides(&stage_records, &tasks),
        }),
    )
        .into_response())
}

/// What the platform changed of what each stage asked for, by stage name, as kept with
/// the stage's task (an array's or sweep's elements were all submitted alike: any one
/// says it). A cached stage ran nothing now and has none.
fn stage_overrides(
    stages: &[StageRecord],
    tasks: &[TaskRecord],
) -> std::collections::BTreeMap<String, Vec<tacc_proto::Override>> {
    stages
        .iter()
        .filter(|stage| !stage.cached)
        .filter_map(|stage| {
            let record = tasks.iter().find(|t| match stage.source {
                StageSource::Task(task) => t.id == task,
                StageSource::Group(group) => t.group == Some(group),
            })?;
            let overrides = crate::control::Submission::of(record).overrides;
            (!overrides.is_empty()).then(|| (stage.name.clone(), overrides))
        })
        .collect()
}

/// One input file of an attempt this node runs: the `index`th of its assignment's
/// inputs, streamed from the producing task's kept outputs.
pub(super) async fn get_input(
    State(app): State<AppState>,
    Path((node, task, attempt, index)): Path<(u64, u64, u32, usize)>,
) -> ApiResult<Response> {
    let attempt_ref = tacc_proto::AttemptRef {
        task: TaskId(task),
        attempt: AttemptNo(attempt),
    };
    let record = app.control.facts.task_record(TaskId(task)).await?;
    if !crate::agent_access::attempt_is_on_node(record.as_ref(), NodeId(node), attempt_ref, false) {
        return Err(ServerError::Forbidden(format!(
            "task {task} attempt {attempt} is not running on node {node}; its inputs are not \
             for this node"
        )));
    }
    let record = super::tasks::load(&app.control, TaskId(task)).await?;
    let inputs = app.control.facts.attempt_inputs(&record).await?;
    let Some(input) = inputs.get(index) else {
        return Err(ServerError::NotFound(format!(
            "task {task} has {} input files; there is no file {index}",
            inputs.len()
        )));
    };
    let relative = super::outputs::safe_relative(&input.path)?;
    let file = rank_dir(&app.control, input.task, input.attempt, input.rank).join(relative);
    let opened = tokio::fs::File::open(&file).await.map_err(|_| {
        ServerError::NotFound(format!(
            "the output `{}` of task {} (input of stage `{}`) is no longer kept",
            input.path, input.task, input.stage
        ))
    })?;
    let length = opened.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(opened)).into_response();
    super::headers::as_download(&mut response, &input.path);
    response.headers_mut().insert(
        axum::http::header::CONTENT_LENGTH,
        HeaderValue::from(length),
    );
    Ok(response)
}
