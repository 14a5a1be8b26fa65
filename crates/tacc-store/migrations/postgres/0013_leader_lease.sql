-- The leadership lease of replicated servers on one database: one row, the replica
-- holding it (and the URL it serves at), a fencing epoch raised on every takeover, and
-- when it lapses unless renewed. Writes that change task state check the epoch in their
-- own transaction, so a replica that lost the lease cannot commit them.
CREATE TABLE leader_lease (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    holder     TEXT    NOT NULL,
    leader_url TEXT    NOT NULL,
    epoch      BIGINT  NOT NULL,
    expires_at BIGINT  NOT NULL
);
