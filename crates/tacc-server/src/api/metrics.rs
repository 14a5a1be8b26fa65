//! `GET /metrics`: the server's metrics in the Prometheus text exposition format, for a
//! Prometheus server presenting a scrape token (`taccd admin metrics-token`) or an admin.

use super::prelude::*;

/// The content type of the Prometheus text format, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) async fn scrape(State(app): State<AppState>) -> ApiResult<Response> {
    let nodes = app.control.node_views().await;
    let names = app.control.node_names().await;
    let text = app.metrics.text(nodes, &names).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static(TEXT_FORMAT),
        )],
        text,
    )
        .into_response())
}
