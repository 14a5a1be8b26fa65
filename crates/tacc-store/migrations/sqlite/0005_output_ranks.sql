-- Every rank of a multi-node attempt keeps its outputs: an output is one file of one rank
-- of one attempt, so two ranks that wrote the same relative path keep both. SQLite cannot
-- change a primary key in place; the table is rebuilt, and what earlier versions kept
-- (rank 0's files only) becomes rank 0's.
CREATE TABLE outputs_by_rank (
    task_id   INTEGER NOT NULL REFERENCES tasks (id),
    attempt   INTEGER NOT NULL,
    node_rank INTEGER NOT NULL,
    path      TEXT    NOT NULL,
    size      INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt, node_rank, path)
);
INSERT INTO outputs_by_rank (task_id, attempt, node_rank, path, size)
    SELECT task_id, attempt, 0, path, size FROM outputs;
DROP TABLE outputs;
ALTER TABLE outputs_by_rank RENAME TO outputs;
