-- The leadership lease of replicated servers on one database (PostgreSQL): one row, the
-- replica holding it (and the URL it serves at), a fencing epoch raised on every
-- takeover, and when it lapses unless renewed. SQLite is single-server, so its one server
-- always leads; the table is here so both stores keep one schema and one contract.
CREATE TABLE leader_lease (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    holder     TEXT    NOT NULL,
    leader_url TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
