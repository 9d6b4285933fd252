-- +goose Up
-- The validated request (Request.Fingerprint's JSON) beside its hash, so an
-- operation whose attempt crashed can be finished without its client
-- (Store.Resume). NULL for keys claimed before this column: those wait for
-- their client's retry, as before.
ALTER TABLE idempotency_keys ADD COLUMN request bytea;

-- Resume looks for unfinished keys only: a handful among a day's keys.
CREATE INDEX idempotency_keys_unfinished ON idempotency_keys (created_at) WHERE response_code IS NULL;

-- +goose Down
DROP INDEX idempotency_keys_unfinished;
ALTER TABLE idempotency_keys DROP COLUMN request;
