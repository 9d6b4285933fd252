-- +goose Up
-- The relays' wake-up moves out of the producer's transaction (see
-- outbox.Notifier): a trigger calling pg_notify makes every commit that
-- inserts outbox rows take a server-wide lock at commit and hold it through
-- the WAL flush, so those commits go one at a time. Polling stays the
-- source of truth; the Notifier's NOTIFY, sent after the commit, is the hint.
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
DROP FUNCTION IF EXISTS outbox_notify();

-- +goose Down
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
