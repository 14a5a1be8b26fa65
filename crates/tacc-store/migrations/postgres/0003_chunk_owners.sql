-- Who uploaded which chunk: a user may build a snapshot only from chunks they uploaded
-- themselves (knowing a chunk's hash is not proof of holding its bytes).
CREATE TABLE chunk_owners (
    user_name TEXT NOT NULL,
    hash      TEXT NOT NULL,
    PRIMARY KEY (user_name, hash)
);
