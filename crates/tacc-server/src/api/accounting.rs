//! `GET /v1/usage` (allocated resource-hours by user or group, like `sreport`) and
//! `GET /v1/usage/fairshare` (the fair-share standing, like `sshare`). What a caller may
//! see is decided in [`crate::accounting`], shared with the dashboard.

use super::prelude::*;
use tacc_proto::{FairShareReport, UsageQuery, UsageReport};

pub(super) async fn usage_report(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<UsageQuery>,
) -> ApiResult<Json<UsageReport>> {
    let user = user_of(&caller)?;
    Ok(Json(app.accounting.usage_report(user, &query).await?))
}

pub(super) async fn fairshare_report(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<FairShareReport>> {
    let user = user_of(&caller)?;
    let standing = app.control.fairshare_standing(crate::now()).await;
    Ok(Json(app.accounting.fairshare_report(user, standing).await?))
}
