-- +goose Up
-- The API client that made the payment: only it may read or refund it.
-- Payments from before clients were recorded belong to no client ('') and
-- are no longer reachable over the API (they stay in the table).
ALTER TABLE payments ADD COLUMN client text NOT NULL DEFAULT '';
ALTER TABLE payments ALTER COLUMN client DROP DEFAULT;

-- +goose Down
ALTER TABLE payments DROP COLUMN client;
