-- +goose Up
-- One row per event, written in the producer's own business transaction and
-- published by the relay afterwards. published_at stays NULL until the
-- queue has acknowledged the send.
CREATE TABLE outbox (
    id                uuid        PRIMARY KEY,             -- = event_id (UUIDv7)
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    payload           jsonb       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',  -- traceparent, ...
    occurred_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(), -- backoff lives here, not in a sleep
    claimed_until     timestamptz,                        -- a relay's lease; expired = up for grabs
    last_error        text
);

-- The relay's claim scans only unpublished rows, oldest due first.
CREATE INDEX outbox_unpublished ON outbox (next_attempt_at, id) WHERE published_at IS NULL;
-- The cleanup scans only published rows.
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

-- A wake-up hint for relays: one notification per inserting statement (and
-- PostgreSQL folds identical ones within a transaction). Polling remains the
-- source of truth, so a lost notification only costs one poll interval.
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- +goose Down
DROP TABLE outbox;
DROP FUNCTION outbox_notify();
