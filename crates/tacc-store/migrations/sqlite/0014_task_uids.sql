-- The Unix uid each TACC user's tasks run as on every node (unless the operator mapped the
-- user to an account of their own): allocated once by the server, never changed, never
-- given to a second user (the UNIQUE key refuses it even to racing writers).
CREATE TABLE task_uids (
    user_name TEXT    PRIMARY KEY,
    uid       INTEGER NOT NULL UNIQUE
);
