-- +goose Up
-- The dedupe table. Range-partitioned by message_id: event ids are UUIDv7,
-- whose leading 48 bits are the creation time in milliseconds, so each daily
-- partition holds exactly the ids minted that day, and the primary key
-- (consumer, message_id) contains the partition key as PostgreSQL requires,
-- keeping it unique across the whole table. Old days are dropped whole
-- (see partitions.go), never deleted row by row.
CREATE TABLE processed_messages (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    payload_hash bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
) PARTITION BY RANGE (message_id);

-- +goose Down
DROP TABLE processed_messages;
