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

/// Every node, like `sinfo`; a node's running tasks are listed only where the caller
/// may see them (the ids of other users' tasks are not theirs to know).
pub(super) async fn list_nodes(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<tacc_proto::NodeView>>> {
    let user = user_of(&caller)?;
    let mut views = app.control.node_views().await;
    if user.role != tacc_core::Role::Admin {
        for view in &mut views {
            let mut visible = Vec::with_capacity(view.running_tasks.len());
            for task in &view.running_tasks {
                let Some(record) = app.control.query().task(*task).await? else {
                    continue;
                };
                let group = app.control.auth.group_of(&record.user).await?;
                if crate::auth::may_act_for(user, &record.user, group.as_deref()) {
                    visible.push(*task);
                }
            }
            view.running_tasks = visible;
        }
    }
    Ok(Json(views))
}

/// Run one chunk garbage-collection pass now (it also runs periodically).
pub(super) async fn collect_garbage(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<tacc_proto::GcReport>> {
    let stats = app
        .control
        .audit
        .audited(
            &caller,
            "admin.gc",
            "chunks".into(),
            "a garbage-collection pass".into(),
            app.artifacts.collect_garbage(),
        )
        .await?;
    Ok(Json(tacc_proto::GcReport {
        chunks_kept: stats.chunks_kept,
        chunks_removed: stats.chunks_removed,
        bytes_removed: stats.bytes_removed,
        temp_files_removed: stats.temp_files_removed,
    }))
}
