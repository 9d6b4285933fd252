-- +goose NO TRANSACTION
-- +goose Up
-- The payment and version each SMS is for, so that the sender sends a
-- payment's SMS in version order (rule 5): a row is not claimed while an
-- older one of its payment is still PENDING or SENDING. Without it, a
-- CashbackReversed recorded while its CashbackCredited's SMS waited out a
-- retryable refusal went out first, and the customer read "it is in your
-- wallet" after "reversed". Rows recorded before this migration have no
-- payment here and are sent in no particular order, as before.
ALTER TABLE notifications
    ADD COLUMN IF NOT EXISTS aggregate_id      text,
    ADD COLUMN IF NOT EXISTS aggregate_version bigint;

-- Only the open rows, which the claim looks among; built CONCURRENTLY so
-- intake keeps writing while it builds. A failed build leaves an INVALID
-- index and this migration unrecorded: whatever exists when it runs is
-- such a leftover, dropped and built again.
DROP INDEX CONCURRENTLY IF EXISTS notifications_open_by_payment;
CREATE INDEX CONCURRENTLY notifications_open_by_payment
    ON notifications (aggregate_id, aggregate_version) WHERE status IN ('PENDING', 'SENDING');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS notifications_open_by_payment;
ALTER TABLE notifications DROP COLUMN IF EXISTS aggregate_version, DROP COLUMN IF EXISTS aggregate_id;
