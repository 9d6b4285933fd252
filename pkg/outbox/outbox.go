// Package outbox is the transactional outbox: events are written in the same
// database transaction as the state change that caused them (Add), and a
// Relay publishes them afterwards, at least once.
//
// The guarantee: an event is published if and only if its transaction
// committed. A crash after COMMIT and before the publish loses nothing (the
// row waits); a crash after the publish and before the row is marked
// re-publishes it (consumers deduplicate by event_id, see pkg/idempotent).
// Nothing is ever published for a transaction that rolled back.
package outbox

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// VersionTable is the goose version table of this package's schema.
const VersionTable = "outbox_schema_version"

// Migrate creates or upgrades the outbox table. Safe to run from several
// replicas at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	return migrate.Up(ctx, pool, sub, VersionTable)
}

// Add writes e to the outbox inside tx, the caller's transaction: the event
// exists exactly when tx commits. Add never commits or rolls back tx. The
// W3C trace context of ctx, if any, is stored with the row and travels with
// the message, so one trace spans producer, relay and consumer.
//
// e must be valid (events.New builds one); its EventID becomes the row id,
// so adding the same event twice fails on the primary key rather than
// publishing it twice.
func Add(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
	args, err := addArgs(ctx, e)
	if err != nil {
		return err
	}
	if _, err = tx.Exec(ctx, addSQL, args...); err != nil {
		return fmt.Errorf("outbox: add %s %s: %w", e.EventType, e.EventID, err)
	}
	return nil
}

// QueueAdd queues on b the INSERT that Add runs, so that it travels in one
// round trip with the caller's other statements: send b in the
// transaction that must carry the event (tx.SendBatch), and the event
// exists exactly when that transaction commits. The statement's result is
// read in its turn, as every other of b's; a failed insert fails the batch.
// ctx gives the row its trace context, as for Add.
func QueueAdd(ctx context.Context, b *pgx.Batch, e events.Envelope) error {
	args, err := addArgs(ctx, e)
	if err != nil {
		return err
	}
	b.Queue(addSQL, args...)
	return nil
}

const addSQL = `INSERT INTO outbox (id, aggregate_id, aggregate_version, event_type, payload, headers, occurred_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7)`

func addArgs(ctx context.Context, e events.Envelope) ([]any, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	headers := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, headers)
	h, err := json.Marshal(headers)
	if err != nil {
		return nil, err
	}
	return []any{pgid.Of(e.EventID), e.AggregateID, e.AggregateVersion, e.EventType, []byte(e.Payload), h, e.OccurredAt}, nil
}
