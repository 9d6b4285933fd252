-- +goose Up
-- The inbox: a received message is stored here (and its SQS copy deleted at
-- once); a processor applies it later. The primary key is the dedupe key,
-- scoped per consumer exactly like processed_messages: a second copy of an
-- event inserts 0 rows. See inbox.go and processor.go for the guarantees.
--
-- Life of a row: PENDING -> DONE, or PENDING -> FAILED (attempts exhausted or
-- a permanent error) -> PENDING again by an operator's replay.
CREATE TABLE inbox (
    consumer          text        NOT NULL,
    message_id        uuid        NOT NULL,            -- the event id (UUIDv7)
    ordering_key      text        NOT NULL CHECK (ordering_key <> ''),
    event_type        text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    occurred_at       timestamptz NOT NULL,
    payload           jsonb       NOT NULL,
    payload_hash      bytea       NOT NULL,            -- events.Envelope.Hash of the stored copy
    traceparent       text,                            -- W3C trace context of the receive
    status            text        NOT NULL DEFAULT 'PENDING'
                                  CHECK (status IN ('PENDING', 'DONE', 'FAILED')),
    attempts          integer     NOT NULL DEFAULT 0,  -- counted when an attempt starts
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_attempt_at   timestamptz,
    last_error        text,                            -- kept after a later success, for the record
    received_at       timestamptz NOT NULL DEFAULT now(),
    processed_at      timestamptz,
    PRIMARY KEY (consumer, message_id)
) WITH (fillfactor = 80); -- room for HOT updates: a claim changes no indexed column

-- The unfinished rows of each key in apply order. The processor walks it one
-- key at a time (the first entry of a key is its head: the only row of that
-- key that may run); backlog figures and the FAILED listing read it too.
-- Queries must repeat the predicate verbatim for the planner to use it.
CREATE INDEX inbox_unfinished ON inbox
    (consumer, ordering_key, aggregate_version, occurred_at, message_id)
    INCLUDE (status, received_at)
    WHERE status IN ('PENDING', 'FAILED');

-- +goose Down
DROP TABLE inbox;
