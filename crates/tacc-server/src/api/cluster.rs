//! Cluster-wide routes: health, datasets, nodes, garbage collection.

use super::prelude::*;

pub(super) async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

pub(super) async fn whoami(
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<tacc_proto::WhoAmI>> {
    let user = user_of(&caller)?;
    Ok(Json(tacc_proto::WhoAmI {
        name: user.name.clone(),
        group: user.group.clone(),
        role: user.role,
    }))
}

pub(super) async fn list_datasets(
    State(app): State<AppState>,
) -> Json<Vec<tacc_proto::DatasetView>> {
    Json(
        app.control
            .config
            .datasets
            .iter()
            .map(|(name, source)| tacc_proto::DatasetView {
                name: name.clone(),
                source: source.clone(),
            })
            .collect(),
    )
}

pub(super) async fn list_nodes(State(app): State<AppState>) -> Json<Vec<tacc_proto::NodeView>> {
    Json(app.control.node_views().await)
}

/// Run one chunk garbage-collection pass now (it also runs periodically).
pub(super) async fn collect_garbage(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<tacc_proto::GcReport>> {
    let stats = app.control.collect_garbage().await?;
    app.control.audit.record(
        &caller,
        "admin.gc",
        "chunks".into(),
        true,
        format!("{} chunk(s) removed", stats.chunks_removed),
    );
    Ok(Json(tacc_proto::GcReport {
        chunks_kept: stats.chunks_kept,
        chunks_removed: stats.chunks_removed,
        bytes_removed: stats.bytes_removed,
        temp_files_removed: stats.temp_files_removed,
    }))
}
