-- An administrator's drain of a node survives a server restart: a drained node finishes
-- what runs on it and is given nothing new until it is resumed.
ALTER TABLE nodes ADD COLUMN drained BIGINT  NOT NULL DEFAULT 0;
