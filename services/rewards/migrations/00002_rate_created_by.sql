-- +goose Up
-- Who scheduled each rate: the API client's name. A rate is a money
-- decision; the default row from the first migration has none.
ALTER TABLE cashback_rates ADD COLUMN created_by text;

-- +goose Down
ALTER TABLE cashback_rates DROP COLUMN created_by;
