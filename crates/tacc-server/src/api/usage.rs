//! `GET /v1/tasks/{id}/usage`: what a task's ranks use now, their peaks, and the flags
//! (first failed rank, silent ranks) — for `tcloud top` and `tcloud show`.

use super::prelude::*;

pub(super) async fn task_usage(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<tacc_proto::TaskUsage>> {
    Ok(Json(app.usage.task_usage(&app.control, TaskId(id)).await?))
}
