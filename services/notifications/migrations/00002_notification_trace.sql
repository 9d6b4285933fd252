-- +goose Up
-- The W3C trace context of the transaction that recorded the intent (the
-- inbox processor's span, itself continuing the payment's trace): the
-- sender continues it around the provider call, so the SMS is part of the
-- payment's trace although it is sent later, by another task.
ALTER TABLE notifications ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE notifications DROP COLUMN traceparent;
