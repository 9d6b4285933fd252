-- +goose Up

-- Cashback rates over time. A credit uses the rate in force at the payment
-- event's occurred_at (rule 4), never the rate at processing time, so a
-- retry after a rate change credits what the first attempt would have.
-- Rows are history: add a new row to change the rate, never edit one.
CREATE TABLE cashback_rates (
    effective_from timestamptz PRIMARY KEY,
    rate_bp        integer     NOT NULL CHECK (rate_bp BETWEEN 0 AND 10000), -- basis points: 200 = 2%
    created_at     timestamptz NOT NULL DEFAULT now()
);
-- The default: 2% for everything since the epoch.
INSERT INTO cashback_rates (effective_from, rate_bp) VALUES ('1970-01-01T00:00:00Z', 200);

-- The last state seen per payment, for versioned writes (rule 5). A refund
-- is terminal: once a payment is REFUNDED here, no PaymentSucceeded copy
-- (stale, or arriving late because the refund overtook it) credits
-- anything. A refund that arrives before its PaymentSucceeded creates the
-- row, so the later PaymentSucceeded finds it.
CREATE TABLE payment_versions (
    payment_id    text        PRIMARY KEY,
    status        text        NOT NULL CHECK (status IN ('SUCCEEDED', 'REFUNDED')),
    version       bigint      NOT NULL,   -- highest aggregate_version seen
    last_event_id uuid        NOT NULL,   -- the event that set status
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One credit per payment, whatever event ids carried it (rule 3: the
-- business key as belt and braces behind the dedupe key).
CREATE TABLE cashback_credits (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id           text        NOT NULL UNIQUE,
    user_id              text        NOT NULL,
    recipient            text        NOT NULL,  -- phone if the payment had one, else user_id
    payment_amount_paise bigint      NOT NULL CHECK (payment_amount_paise > 0),
    currency             text        NOT NULL,
    rate_bp              integer     NOT NULL,
    amount_paise         bigint      NOT NULL CHECK (amount_paise >= 0),  -- the cashback
    event_id             uuid        NOT NULL,  -- the PaymentSucceeded that credited it
    payment_version      bigint      NOT NULL,
    occurred_at          timestamptz NOT NULL,  -- the payment event's occurred_at: picks the rate
    credited_at          timestamptz NOT NULL DEFAULT now(),
    status               text        NOT NULL DEFAULT 'CREDITED' CHECK (status IN ('CREDITED', 'REVERSED')),
    reversed_at          timestamptz,
    reversal_event_id    uuid,                  -- the PaymentRefunded that reversed it
    CHECK ((status = 'REVERSED') = (reversed_at IS NOT NULL))
);
CREATE INDEX cashback_credits_user ON cashback_credits (user_id, id);

-- Wallet balances. Only credits and reversals move them here; a reversal
-- may take a balance below zero if it was spent elsewhere (not modelled),
-- so there is deliberately no CHECK (balance_paise >= 0).
CREATE TABLE wallets (
    user_id       text        PRIMARY KEY,
    balance_paise bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE wallets;
DROP TABLE cashback_credits;
DROP TABLE payment_versions;
DROP TABLE cashback_rates;
