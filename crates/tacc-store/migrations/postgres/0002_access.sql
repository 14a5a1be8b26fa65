-- Who may use the cluster. Tokens are kept only as the SHA-256 of their secret, secrets
-- only as AEAD ciphertext: neither table holds anything a reader of the file could use.
CREATE TABLE users (
    name       TEXT    COLLATE "C" PRIMARY KEY,
    group_name TEXT,
    role       TEXT    NOT NULL,
    created_at BIGINT  NOT NULL
);

-- `user_name` is the user a `user` token acts as, or who issued an `agent_join` token
-- (possibly the operator, so not a reference to `users`); `node_id` binds a `node` token.
CREATE TABLE tokens (
    id         BIGSERIAL PRIMARY KEY,
    kind       TEXT    NOT NULL,
    hash       TEXT    NOT NULL UNIQUE,
    user_name  TEXT,
    node_id    BIGINT,
    created_at BIGINT  NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT,
    label      TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX tokens_by_user ON tokens (user_name, id);

CREATE TABLE audit (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT  NOT NULL,
    actor   TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    target  TEXT    NOT NULL,
    outcome TEXT    NOT NULL,
    detail  TEXT    NOT NULL
);
CREATE INDEX audit_by_time ON audit (at, id);

CREATE TABLE secrets (
    user_name  TEXT    NOT NULL,
    name       TEXT    COLLATE "C" NOT NULL,
    nonce      BYTEA   NOT NULL,
    ciphertext BYTEA   NOT NULL,
    updated_at BIGINT  NOT NULL,
    PRIMARY KEY (user_name, name)
);

-- A snapshot may be offered before it is committed, so no reference to `snapshots`.
CREATE TABLE snapshot_owners (
    snapshot  TEXT NOT NULL,
    user_name TEXT NOT NULL,
    PRIMARY KEY (snapshot, user_name)
);
