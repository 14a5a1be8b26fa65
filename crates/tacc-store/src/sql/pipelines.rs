//! Pipeline stages in either SQL store: a pipeline's group, every stage's task or array
//! group and the stage rows written inside a transaction the store has begun (and, on
//! PostgreSQL, fenced), and the reads of stages.

use tacc_core::GroupId;

use super::STAGE_COLUMNS;
use super::groups::insert_group;
use crate::rows::{corrupt, stage_from_row};
use crate::statement::{Run, Statement, Transact};
use crate::{
    GroupRecord, NewGroup, NewStage, NewStageRun, Result, StageRecord, StageSource, TaskRecord,
};

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

/// Insert a pipeline inside the caller's transaction.
pub(crate) async fn insert_pipeline(
    tx: &mut impl Transact,
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
        let insert = Statement::new(format!(
            "INSERT INTO pipeline_stages ({STAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(record.id.0 as i64)
        .bind(position as i64)
        .bind(&stage.name)
        .bind(needs)
        .bind(&stage.cache_key)
        .bind(task_id)
        .bind(group_id)
        .bind(i64::from(cached))
        .bind(&user)
        .bind(&pipeline_name);
        tx.execute(insert).await?;
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
    tx.execute(
        Statement::new("UPDATE tasks SET group_index = NULL WHERE group_id = ?")
            .bind(record.id.0 as i64),
    )
    .await?;
    for task in tasks.iter_mut().filter(|t| t.group == Some(record.id)) {
        task.group_index = None;
    }
    // The pipeline's size is its number of stages, not its single-task elements.
    tx.execute(
        Statement::new("UPDATE task_groups SET size = ? WHERE id = ?")
            .bind(records.len() as i64)
            .bind(record.id.0 as i64),
    )
    .await?;
    record.size = records.len() as u32;
    Ok((record, records, tasks))
}
