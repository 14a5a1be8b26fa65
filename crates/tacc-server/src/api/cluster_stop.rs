//! `POST /v1/admin/cluster/stop` (an admin stops the embedded cluster: `tcloud down`) and
//! `GET /v1/admin/cluster/stop` (how far the stop has got). See `crate::cluster_stop`.

use std::sync::Arc;

use tacc_proto::{ClusterStopView, StopCluster};

use super::prelude::*;
use crate::cluster_stop::{self, ClusterStop};

/// The stop of the cluster this server embeds; a plain `taccd server` has none.
fn embedded(app: &AppState) -> ApiResult<&Arc<ClusterStop>> {
    app.cluster_stop.as_ref().ok_or_else(|| {
        ServerError::Conflict(
            "only the embedded cluster (`taccd dev`, as `tcloud up` starts it) stops on \
             request; stop this server with SIGTERM (its agents and their tasks carry on, and \
             the server started next adopts them)"
                .into(),
        )
    })
}

pub(super) async fn stop(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<StopCluster>,
) -> ApiResult<Json<ClusterStopView>> {
    let stop = embedded(&app)?;
    let view = app
        .control
        .audit
        .audited(
            &caller,
            "admin.cluster_stop",
            "cluster".into(),
            format!("mode {}", body.mode.as_str()),
            cluster_stop::request(&app.control, stop, body.mode, app.shutdown.clone()),
        )
        .await?;
    Ok(Json(view))
}

pub(super) async fn progress(State(app): State<AppState>) -> ApiResult<Json<ClusterStopView>> {
    let stop = embedded(&app)?;
    Ok(Json(cluster_stop::view(&app.control, stop).await?))
}

/// New work (a submission, a rerun) is refused while the cluster stops.
pub(super) fn refuse_while_stopping(app: &AppState) -> ApiResult<()> {
    match &app.cluster_stop {
        Some(stop) => stop.refuse_new_work(),
        None => Ok(()),
    }
}
