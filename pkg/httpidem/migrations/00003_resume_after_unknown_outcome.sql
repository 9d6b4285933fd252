-- +goose Up
-- Set when an attempt failed with an outcome it could not know (an
-- external call that timed out: it may have taken effect). The key is
-- released for its client's retry, and if none has finished it by then,
-- Store.Resume takes it over at this time, as it does a crashed attempt's.
ALTER TABLE idempotency_keys ADD COLUMN resume_after timestamptz;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN resume_after;
