//! Pipeline routes: a whole pipeline submitted in one request, and the agents' fetch of a
//! stage's input files (the kept outputs of the stages it needs).

use tacc_proto::{PipelineSubmitted, SubmitPipeline};
use tacc_schema::TaskSpec;

use super::outputs::rank_dir;
use super::prelude::*;
use crate::control::StageSubmission;

pub(super) async fn submit_pipeline(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<SubmitPipeline>,
) -> ApiResult<(StatusCode, Json<PipelineSubmitted>)> {
    let user = user_of(&caller)?;
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
    let mut tasks = 0u64;
    for stage in body.stages {
        let spec: TaskSpec = serde_json::from_value(stage.spec).map_err(|e| {
            ServerError::InvalidTask(format!(
                "the spec of stage `{}` is not valid: {e}",
                stage.name
            ))
        })?;
        tasks += spec.array.as_ref().map_or(1, |a| a.len() as u64);
        // Knowing a snapshot's id is not a capability: only who uploaded it may run it.
        if user.role != tacc_core::Role::Admin
            && !app
                .control
                .store
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
    app.control.admit_tasks(user, tasks).await?;
    let (group, _) = app
        .control
        .submit_pipeline(&user.name, body.name, stages, body.source, notify)
        .await?;
    let stages = app.control.stage_views(group.id).await?;
    Ok((
        StatusCode::CREATED,
        Json(PipelineSubmitted {
            group: group.id,
            stages,
        }),
    ))
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
    if !app
        .control
        .attempt_is_on_node(NodeId(node), attempt_ref, false)
        .await?
    {
        return Err(ServerError::Forbidden(format!(
            "task {task} attempt {attempt} is not running on node {node}; its inputs are not \
             for this node"
        )));
    }
    let record = super::tasks::load(&app.control, TaskId(task)).await?;
    let inputs = app.control.stage_inputs(&record).await?;
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
    response.headers_mut().insert(
        axum::http::header::CONTENT_LENGTH,
        HeaderValue::from(length),
    );
    Ok(response)
}
