-- +goose Up

-- One row per message to send: the intent, recorded once per (event,
-- channel) when a CashbackCredited / CashbackReversed is applied, then
-- driven by the sender through
--
--   PENDING --claim--> SENDING --provider accepted--> SENT
--      ^                  |  \--provider rejected / attempts exhausted / policy skip--> FAILED
--      +--retryable error-+   (next_attempt_at = backoff)
--
-- A row stays SENDING only while a sender holds its lease (claim_id,
-- sending_since). A row found SENDING past the lease belongs to a sender
-- that crashed mid-call: the reconciler looks it up at the provider by
-- idempotency_key, or applies the per-kind policy (resend with the same
-- key, or skip to FAILED "unknown outcome").
CREATE TABLE notifications (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id            uuid        NOT NULL,
    event_type          text        NOT NULL,
    channel             text        NOT NULL CHECK (channel IN ('sms')),
    kind                text        NOT NULL,  -- picks the SENDING policy: cashback | cashback_reversed
    recipient           text        NOT NULL,
    body                text        NOT NULL,
    status              text        NOT NULL DEFAULT 'PENDING'
                                    CHECK (status IN ('PENDING', 'SENDING', 'SENT', 'FAILED')),
    idempotency_key     text        NOT NULL UNIQUE,  -- sms:<event_id>, sent with every attempt
    provider_message_id text,
    attempts            integer     NOT NULL DEFAULT 0,   -- provider calls started
    next_attempt_at     timestamptz NOT NULL DEFAULT now(), -- backoff lives here, not in a sleep
    claim_id            uuid,                 -- the lease of the sender that set SENDING
    sending_since       timestamptz,          -- when that lease began
    last_error          text,
    failure_reason      text,                 -- why FAILED
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz,
    UNIQUE (event_id, channel),
    CHECK ((status = 'SENT') = (provider_message_id IS NOT NULL AND sent_at IS NOT NULL)),
    CHECK ((status = 'SENDING') = (claim_id IS NOT NULL AND sending_since IS NOT NULL))
);
-- The sender's claim: due PENDING rows, oldest first.
CREATE INDEX notifications_due ON notifications (next_attempt_at, id) WHERE status = 'PENDING';
-- The reconciler's scan: SENDING rows by lease age.
CREATE INDEX notifications_sending ON notifications (sending_since) WHERE status = 'SENDING';

-- +goose Down
DROP TABLE notifications;
