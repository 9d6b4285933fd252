-- +goose Up
-- One row per (endpoint, Idempotency-Key) an API client sent. The row is
-- inserted BEFORE the operation runs (the claim), holds a lease while it runs
-- (lock_token, locked_at), and ends holding the final response, saved in
-- the same transaction as the operation's effect.
CREATE TABLE idempotency_keys (
    scope         text        NOT NULL,  -- method + path: 'POST /v1/payments', 'POST /v1/payments/pay_1/refund'
    key           text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash  bytea       NOT NULL,  -- sha256 of the normalised request: same key + other hash = 422
    resource_id   text,                  -- decided by the first attempt (e.g. the payment id), reused by every retry
    attempts      integer     NOT NULL DEFAULT 1,
    lock_token    uuid,                  -- the attempt holding the lease; fences a stale attempt's save
    locked_at     timestamptz,           -- NULL = not running; older than the lock timeout = crashed, up for takeover
    response_code integer,               -- NULL until the operation finished
    response_body bytea,                 -- replayed byte for byte
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    PRIMARY KEY (scope, key),
    CHECK ((response_code IS NULL) = (response_body IS NULL))
);

-- The retention cleanup deletes by age.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

-- +goose Down
DROP TABLE idempotency_keys;
