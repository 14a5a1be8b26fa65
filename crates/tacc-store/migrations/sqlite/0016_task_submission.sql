-- How a task was submitted, beyond its spec, as the server records it (JSON): whether it
-- was accepted on purpose for a cluster that will grow (`--wait-for-capacity`), and what
-- the platform changed of what it asked for (a lowered priority, a default applied), so
-- `tcloud show` tells what was asked and what applies.
ALTER TABLE tasks ADD COLUMN submission TEXT NOT NULL DEFAULT '{}';
