//! Pipeline stages in PostgreSQL: the pipeline group, every stage's task or array group and
//! the stage rows written in one transaction.

use sqlx::PgPool;

use super::groups::insert_group;
use super::numbered;
use crate::rows::corrupt;
use crate::sql::STAGE_COLUMNS;
pub(super) use crate::sql::pipelines::{pipeline_stages, stage_of, stages_with_key};
use crate::{
    GroupRecord, NewGroup, NewStage, NewStageRun, Result, StageRecord, StageSource, TaskRecord,
};

pub(super) async fn create_pipeline(
    pool: &PgPool,
    fence: &crate::lease::Fence,
    group: NewGroup,
    stages: Vec<NewStage>,
    keyed: Option<crate::Keyed>,
) -> Result<(GroupRecord, Vec<StageRecord>, Vec<TaskRecord>)> {
    let mut tx = pool.begin().await?;
    super::check_fence(&mut tx, fence).await?;
    let made = insert_pipeline(&mut tx, group, stages).await?;
    if let Some(keyed) = keyed {
        let kept = keyed.kept(crate::Created::Pipeline(&made.0, &made.1, &made.2));
        super::idempotency::insert_key(&mut tx, &kept).await?;
    }
    tx.commit().await?;
    Ok(made)
}

/// Insert a pipeline inside the caller's transaction.
async fn insert_pipeline(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    group: NewGroup,
    stages: Vec<NewStage>,
) -> Result<(GroupRecord, Vec<StageRecord>, Vec<TaskRecord>)> {
    let singles: Vec<(u32, crate::NewTask)> = stages
        .iter()
        .enumerate()
        .filter_map(|(position, stage)| match &stage.run {
            NewStageRun::Task(task) => Some((position as u32, task.clone())),
            _ => None,
        })
        .collect();
    let user = group.user.clone();
    let pipeline_name = group.name.clone();
    let (mut record, single_tasks) = insert_group(tx, group, singles).await?;
    let mut singles = single_tasks.into_iter();
    let mut records = Vec::with_capacity(stages.len());
    let mut tasks = Vec::new();
    for (position, stage) in stages.into_iter().enumerate() {
        let (source, cached) = match stage.run {
            NewStageRun::Task(_) => {
                let task = singles
                    .next()
                    .ok_or_else(|| corrupt("fewer single-task stages inserted than given"))?;
                let source = StageSource::Task(task.id);
                tasks.push(task);
                (source, false)
            }
            NewStageRun::Array { group, elements } => {
                let (array, elements) = insert_group(tx, group, elements).await?;
                tasks.extend(elements);
                (StageSource::Group(array.id), false)
            }
            NewStageRun::Cached(source) => (source, true),
        };
        let (task_id, group_id) = source.columns();
        let needs = serde_json::to_string(&stage.needs).map_err(corrupt)?;
        sqlx::query(&numbered(&format!(
            "INSERT INTO pipeline_stages ({STAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )))
        .bind(record.id.0 as i64)
        .bind(position as i64)
        .bind(&stage.name)
        .bind(&needs)
        .bind(&stage.cache_key)
        .bind(task_id)
        .bind(group_id)
        .bind(i64::from(cached))
        .bind(&user)
        .bind(&pipeline_name)
        .execute(&mut **tx)
        .await?;
        records.push(StageRecord {
            pipeline: record.id,
            position: position as u32,
            name: stage.name,
            needs: stage.needs,
            cache_key: stage.cache_key,
            source,
            cached,
            user: user.clone(),
            pipeline_name: pipeline_name.clone(),
        });
    }
    // A single stage is the pipeline's element without an index: it is no array element
    // (no `TACC_ARRAY_INDEX`).
    sqlx::query(&numbered(
        "UPDATE tasks SET group_index = NULL WHERE group_id = ?",
    ))
    .bind(record.id.0 as i64)
    .execute(&mut **tx)
    .await?;
    for task in tasks.iter_mut().filter(|t| t.group == Some(record.id)) {
        task.group_index = None;
    }
    // The pipeline's size is its number of stages, not its single-task elements.
    sqlx::query(&numbered("UPDATE task_groups SET size = ? WHERE id = ?"))
        .bind(records.len() as i64)
        .bind(record.id.0 as i64)
        .execute(&mut **tx)
        .await?;
    record.size = records.len() as u32;
    Ok((record, records, tasks))
}
