-- +goose NO TRANSACTION
-- +goose Up
-- Every producer's insert pays for each index of the outbox. The published
-- index costs it nothing (its predicate is false for a new row); the
-- relay's claim index is paid on every insert, so it keeps only what the
-- claim needs: due rows, earliest first. Ties (all the rows of one
-- transaction share next_attempt_at) need no order of their own, and the
-- id that used to break them tripled the key (8 bytes to 24). Built
-- CONCURRENTLY, so producers keep inserting while it builds; the old index
-- serves the claim until the new one is valid. A concurrent build that
-- fails (a timeout, a killed deploy) leaves an INVALID outbox_due behind
-- and this migration unrecorded: whatever outbox_due exists when it runs
-- is such a leftover, dropped and built again, never taken for done.
DROP INDEX CONCURRENTLY IF EXISTS outbox_due;
CREATE INDEX CONCURRENTLY outbox_due ON outbox (next_attempt_at) WHERE published_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_unpublished;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_unpublished ON outbox (next_attempt_at, id) WHERE published_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_due;
