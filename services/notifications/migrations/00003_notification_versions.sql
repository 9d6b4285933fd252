-- +goose Up
-- The newest version of each payment that an SMS intent was recorded for
-- (rule 5, order by version): an event whose payment already reached this
-- version or a later one, such as a CashbackCredited (version 1) stored
-- after its CashbackReversed (version 2) was applied, records no intent.
-- Written in the intent's transaction, so the two cannot disagree.
CREATE TABLE notification_versions (
    aggregate_id text        PRIMARY KEY,
    version      bigint      NOT NULL,
    event_id     uuid        NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE notification_versions;
