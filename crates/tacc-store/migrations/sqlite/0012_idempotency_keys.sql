-- Idempotency keys: the reply a mutating request got, under the key its client chose,
-- written in the transaction of the work it acknowledges. Kept 24 hours (the store
-- removes expired rows when it writes a new key).
CREATE TABLE idempotency_keys (
    user_name    TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    route        TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    status       INTEGER NOT NULL,
    body         TEXT    NOT NULL,
    PRIMARY KEY (user_name, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
