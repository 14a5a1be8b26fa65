-- Pipelines: a `pipeline` group has one row per stage, in file order, with the stages it
-- needs and its cache key (code snapshot, normalised spec, input identities). A stage
-- that ran points at its task (a single task, an element of the pipeline group) or at its
-- array group; a cached stage points at the earlier run whose outputs it reuses.
CREATE TABLE pipeline_stages (
    pipeline_id   BIGINT  NOT NULL REFERENCES task_groups (id),
    position      BIGINT  NOT NULL,
    name          TEXT    NOT NULL,
    needs         TEXT    NOT NULL,
    cache_key     TEXT    NOT NULL,
    task_id       BIGINT  REFERENCES tasks (id),
    group_id      BIGINT  REFERENCES task_groups (id),
    cached        BIGINT  NOT NULL DEFAULT 0,
    user_name     TEXT    NOT NULL,
    pipeline_name TEXT    NOT NULL,
    PRIMARY KEY (pipeline_id, position)
);
-- The cache: an earlier run of the same user's pipeline and stage with the same key.
CREATE INDEX pipeline_stages_by_key
    ON pipeline_stages (user_name, pipeline_name, name, cache_key);
-- A task or array group to the stage it ran as (when it ends).
CREATE INDEX pipeline_stages_by_task ON pipeline_stages (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX pipeline_stages_by_group ON pipeline_stages (group_id) WHERE group_id IS NOT NULL;
