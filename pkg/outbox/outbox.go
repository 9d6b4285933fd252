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
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// e must be valid (events.New builds one) and fit one message
// (ErrTooLarge otherwise). Its EventID becomes the row id, so adding the
// same event twice fails, with ErrDuplicateEvent, rather than publishing it
// twice; tx is then aborted, as by any failed statement.
func Add(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
	args, err := addArgs(ctx, e)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, addSQL, args...)
	return addError(e, err)
}

// addError names e in a failed insert's error, and marks a duplicate id
// ErrDuplicateEvent.
func addError(e events.Envelope, err error) error {
	if err == nil {
		return nil
	}
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "outbox_pkey" {
		err = fmt.Errorf("%w: %w", ErrDuplicateEvent, err)
	}
	return fmt.Errorf("outbox: add %s %s: %w", e.EventType, e.EventID, err)
}

var (
	// ErrTooLarge: the event, as the relay would send it (its body and
	// attributes), is over MaxMessageBytes. No queue message can carry it,
	// so Add and QueueAdd refuse it rather than store a row that no relay
	// could ever publish. A stored row found too large (its payload grew
	// when jsonb normalised it) fails each attempt with it as last_error.
	ErrTooLarge = errors.New("outbox: event too large for one message")
	// ErrDuplicateEvent: an event with this id is in the outbox already.
	ErrDuplicateEvent = errors.New("outbox: event id already in the outbox")
)

// MaxMessageBytes is the largest message the relay publishes: its body and
// its attributes, counted as SQS counts them (each attribute's name, type
// and value). It is SQS's limit, and events.Decode refuses a body over it.
const MaxMessageBytes = events.MaxBodyBytes

// QueueAdd queues on b the INSERT that Add runs, so that it travels in one
// round trip with the caller's other statements: send b in the
// transaction that must carry the event (tx.SendBatch), and the event
// exists exactly when that transaction commits. The statement's result is
// read in its turn, as every other of b's; a failed insert fails the batch.
// Read by the batch's Close, its error is Add's (ErrDuplicateEvent for an
// id already in the outbox); read one by one with Exec, PostgreSQL's own.
// ctx gives the row its trace context, as for Add.
func QueueAdd(ctx context.Context, b *pgx.Batch, e events.Envelope) error {
	args, err := addArgs(ctx, e)
	if err != nil {
		return err
	}
	b.Queue(addSQL, args...).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		return addError(e, err)
	}
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
	if err := checkSize(e, headers["traceparent"]); err != nil {
		return nil, err
	}
	h, err := json.Marshal(headers)
	if err != nil {
		return nil, err
	}
	return []any{pgid.Of(e.EventID), e.AggregateID, e.AggregateVersion, e.EventType, []byte(e.Payload), h, e.OccurredAt}, nil
}

// checkSize refuses e with ErrTooLarge when the message the relay would
// send for it is over MaxMessageBytes. Only an event that might be near
// the limit is encoded to know: escaped (for JSON, then for the queue) a
// string takes at most 6 bytes a byte, so below that bound e fits whatever
// its content.
func checkSize(e events.Envelope, traceparent string) error {
	const envelope = 256 // the field names, the id, the version and the time
	attrs := attributesBytes(e.EventType, traceparent)
	if envelope+6*(len(e.EventType)+len(e.AggregateID)+len(e.Payload))+attrs <= MaxMessageBytes {
		return nil
	}
	e.OccurredAt = e.OccurredAt.UTC() // as the relay encodes the stored row
	body, err := e.AppendJSON(nil)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return tooLarge(e, len(events.EscapeForSQS(body))+attrs)
}

// tooLarge is ErrTooLarge for e when its message is n bytes, else nil.
func tooLarge(e events.Envelope, n int) error {
	if n <= MaxMessageBytes {
		return nil
	}
	return fmt.Errorf("%w: %s %s is %d bytes, more than %d (its payload %d)",
		ErrTooLarge, e.EventType, e.EventID, n, MaxMessageBytes, len(e.Payload))
}

// attributes are the message attributes the relay sends with an event.
func attributes(eventID, eventType, traceparent string) map[string]string {
	a := map[string]string{"event_id": eventID, "event_type": eventType}
	if traceparent != "" {
		a["traceparent"] = traceparent
	}
	return a
}

// attributesBytes is what SQS counts of attributes' size against the
// message's: each one's name, data type ("String") and value.
func attributesBytes(eventType, traceparent string) int {
	const str = len("String")
	n := len("event_id") + str + 36 + len("event_type") + str + len(eventType)
	if traceparent != "" {
		n += len("traceparent") + str + len(traceparent)
	}
	return n
}
