-- +goose NO TRANSACTION
-- +goose Up
-- An earlier 00003, rerun after its concurrent build had failed, took the
-- INVALID outbox_due it found for done and dropped the old index: such a
-- database claims with no usable index. Rebuilding it (CONCURRENTLY, so
-- producers keep inserting) repairs that one and costs the others one
-- build of an index of the unpublished rows only.
REINDEX INDEX CONCURRENTLY outbox_due;

-- +goose Down
SELECT 1;
