-- +goose Up
-- One row per successful charge. A payment is written once, SUCCEEDED, in
-- the same transaction as its PaymentSucceeded outbox row and the saved API
-- response; a refund moves it to REFUNDED and bumps version, which is the
-- aggregate_version of the event it emits (consumers order by it).
CREATE TABLE payments (
    id                  text        PRIMARY KEY CHECK (id LIKE 'pay\_%'),
    user_id             text        NOT NULL,
    amount_paise        bigint      NOT NULL CHECK (amount_paise > 0),
    currency            text        NOT NULL,
    method              text        NOT NULL,
    status              text        NOT NULL CHECK (status IN ('SUCCEEDED', 'REFUNDED')),
    version             bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    provider_ref        text        NOT NULL,  -- Stripe PaymentIntent id
    provider_refund_ref text,                  -- Stripe Refund id, once refunded
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'REFUNDED') = (provider_refund_ref IS NOT NULL))
);

CREATE INDEX payments_user_id ON payments (user_id, created_at);

-- +goose Down
DROP TABLE payments;
