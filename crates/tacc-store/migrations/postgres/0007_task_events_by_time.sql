-- Usage accounting (`tcloud usage`) looks for the tasks with events in a time window;
-- without this index that is a scan of every event ever recorded.
CREATE INDEX task_events_by_at ON task_events (at, task_id);
