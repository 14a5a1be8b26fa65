-- The highest use seen of each rank of each attempt (CPU, memory, GPU), for `tcloud show`
-- after the task ended. Each measure keeps its own maximum.
CREATE TABLE usage_peaks (
    task_id BIGINT  NOT NULL REFERENCES tasks (id),
    attempt BIGINT  NOT NULL,
    node_rank BIGINT  NOT NULL,
    node TEXT NOT NULL,
    cpu_millis BIGINT  NOT NULL,
    memory_bytes BIGINT  NOT NULL,
    gpu_utilization_percent BIGINT  NOT NULL,
    gpu_memory_bytes BIGINT  NOT NULL,
    at BIGINT  NOT NULL,
    PRIMARY KEY (task_id, attempt, node_rank)
);
