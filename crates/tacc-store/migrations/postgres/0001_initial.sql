-- PostgreSQL mirror of ../sqlite/0001_initial.sql (BIGINT for every integer, BIGSERIAL ids that
-- are never reused). Text keys that lists are ordered by (snapshot ids, output paths, user and
-- secret names) collate "C": bytewise, as SQLite orders them, whatever the database's locale.
-- Tasks and their whole history. JSON columns hold values the store does not interpret.
CREATE TABLE tasks (
    id               BIGSERIAL PRIMARY KEY,
    name             TEXT    NOT NULL,
    user_name        TEXT    NOT NULL,
    spec             TEXT    NOT NULL,
    snapshot         TEXT    NOT NULL,
    source           TEXT,
    state            TEXT    NOT NULL,
    reason           TEXT,
    exit_code        INTEGER,
    attempt          BIGINT  NOT NULL,
    placements       TEXT    NOT NULL DEFAULT '[]',
    cancel_requested BIGINT  NOT NULL DEFAULT 0,
    submitted_at     BIGINT  NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT
);
CREATE INDEX tasks_by_state ON tasks (state, id);

CREATE TABLE task_events (
    task_id  BIGINT  NOT NULL REFERENCES tasks (id),
    seq      BIGINT  NOT NULL,
    at       BIGINT  NOT NULL,
    attempt  BIGINT  NOT NULL,
    state    TEXT    NOT NULL,
    reason   TEXT,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE nodes (
    id            BIGSERIAL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    capacity      TEXT    NOT NULL,
    gpu_type      TEXT,
    labels        TEXT    NOT NULL DEFAULT '{}',
    address       TEXT    NOT NULL,
    registered_at BIGINT  NOT NULL
);

CREATE TABLE snapshots (
    id          TEXT    COLLATE "C" PRIMARY KEY,
    manifest    TEXT    NOT NULL,
    total_bytes BIGINT  NOT NULL,
    created_at  BIGINT  NOT NULL
);

CREATE TABLE outputs (
    task_id  BIGINT  NOT NULL REFERENCES tasks (id),
    attempt  BIGINT  NOT NULL,
    path     TEXT    COLLATE "C" NOT NULL,
    size     BIGINT  NOT NULL,
    PRIMARY KEY (task_id, attempt, path)
);
