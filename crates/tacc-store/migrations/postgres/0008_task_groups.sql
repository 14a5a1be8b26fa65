-- Task groups (arrays; sweeps and pipelines later): one row per submission of many
-- tasks, each element pointing at it with its index.
CREATE TABLE task_groups (
    id          BIGSERIAL PRIMARY KEY,
    kind        TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    user_name   TEXT    NOT NULL,
    spec        TEXT    NOT NULL,
    size        BIGINT  NOT NULL,
    created_at  BIGINT  NOT NULL
);
CREATE INDEX task_groups_by_user ON task_groups (user_name, id);

ALTER TABLE tasks ADD COLUMN group_id BIGINT  REFERENCES task_groups (id);
ALTER TABLE tasks ADD COLUMN group_index BIGINT ;
-- A group's counts by state, and its elements, without scanning every task.
CREATE INDEX tasks_by_group ON tasks (group_id, state) WHERE group_id IS NOT NULL;
-- `tcloud ps` lists ungrouped tasks, newest first.
CREATE INDEX tasks_ungrouped ON tasks (id) WHERE group_id IS NULL;
-- `tcloud history`: ended tasks, newest end first, a page at a time.
CREATE INDEX tasks_by_finished ON tasks (finished_at, id) WHERE finished_at IS NOT NULL;
CREATE INDEX tasks_by_user ON tasks (user_name, id);

-- The notification outbox: queued in the transaction that ends a task or a group, so a
-- restart loses none; a row is kept after delivery as the record of it.
CREATE TABLE deliveries (
    id            BIGSERIAL PRIMARY KEY,
    event_key     TEXT    NOT NULL UNIQUE,
    user_name     TEXT    NOT NULL,
    url           TEXT    NOT NULL,
    secret_name   TEXT    NOT NULL,
    body          TEXT    NOT NULL,
    attempts      BIGINT  NOT NULL DEFAULT 0,
    next_at       BIGINT  NOT NULL,
    last_error    TEXT,
    delivered_at  BIGINT,
    gave_up       BIGINT  NOT NULL DEFAULT 0,
    created_at    BIGINT  NOT NULL
);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE delivered_at IS NULL AND gave_up = 0;
