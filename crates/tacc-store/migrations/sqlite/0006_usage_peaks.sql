-- The highest use seen of each rank of each attempt (CPU, memory, GPU), for `tcloud show`
-- after the task ended. Each measure keeps its own maximum.
CREATE TABLE usage_peaks (
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    attempt INTEGER NOT NULL,
    node_rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    cpu_millis INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    gpu_utilization_percent INTEGER NOT NULL,
    gpu_memory_bytes INTEGER NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt, node_rank)
);
