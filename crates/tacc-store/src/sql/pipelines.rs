//! Reads of pipeline stages in either SQL store. Creating a pipeline stays with each store:
//! it runs inside the store's own transaction.

use tacc_core::GroupId;

use super::STAGE_COLUMNS;
use crate::rows::stage_from_row;
use crate::statement::{Run, Statement};
use crate::{Result, StageRecord, StageSource};

pub(crate) async fn pipeline_stages(
    pool: &impl Run,
    pipeline: GroupId,
) -> Result<Vec<StageRecord>> {
    let select = Statement::new(format!(
        "SELECT {STAGE_COLUMNS} FROM pipeline_stages WHERE pipeline_id = ? ORDER BY position"
    ))
    .bind(pipeline.0 as i64);
    pool.fetch_all(select)
        .await?
        .iter()
        .map(stage_from_row)
        .collect()
}

pub(crate) async fn stage_of(pool: &impl Run, source: StageSource) -> Result<Option<StageRecord>> {
    let (column, id) = match source {
        StageSource::Task(task) => ("task_id", task.0),
        StageSource::Group(group) => ("group_id", group.0),
    };
    let select = Statement::new(format!(
        "SELECT {STAGE_COLUMNS} FROM pipeline_stages WHERE {column} = ? AND cached = 0 LIMIT 1"
    ))
    .bind(id as i64);
    pool.fetch_optional(select)
        .await?
        .as_ref()
        .map(stage_from_row)
        .transpose()
}

pub(crate) async fn stages_with_key(
    pool: &impl Run,
    user: &str,
    pipeline: &str,
    stage: &str,
    cache_key: &str,
) -> Result<Vec<StageRecord>> {
    let select = Statement::new(format!(
        "SELECT {STAGE_COLUMNS} FROM pipeline_stages WHERE user_name = ? AND pipeline_name = ? \
         AND name = ? AND cache_key = ? ORDER BY pipeline_id DESC LIMIT 20"
    ))
    .bind(user)
    .bind(pipeline)
    .bind(stage)
    .bind(cache_key);
    pool.fetch_all(select)
        .await?
        .iter()
        .map(stage_from_row)
        .collect()
}
