-- Every rank of a multi-node attempt keeps its outputs: an output is one file of one rank
-- of one attempt, so two ranks that wrote the same relative path keep both. What earlier
-- versions kept (rank 0's files only) becomes rank 0's.
ALTER TABLE outputs ADD COLUMN node_rank BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outputs ALTER COLUMN node_rank DROP DEFAULT;
ALTER TABLE outputs DROP CONSTRAINT outputs_pkey;
ALTER TABLE outputs ADD PRIMARY KEY (task_id, attempt, node_rank, path);
