// Package idempotent makes at-least-once delivery apply effects exactly once.
//
// A Consumer records each message's key (consumer name, event id) in
// processed_messages in the SAME transaction as the message's effect:
//
//	BEGIN
//	INSERT INTO processed_messages ... ON CONFLICT DO NOTHING   -- the claim, first
//	SELECT payload_hash ...                                     -- only after 0 rows
//	  1 row  -> run the effect in this transaction, COMMIT       -> Applied
//	  0 rows -> ROLLBACK                                        -> Duplicate (or Conflict)
//
// The guarantee, for a message delivered any number of times, by any number
// of replicas, concurrently or not, within the retention window:
//   - its effect commits at most once, and exactly once if some delivery's
//     transaction commits;
//   - a crash before COMMIT leaves nothing (no key, no effect), so the
//     redelivery applies it; a crash after COMMIT but before the ack leaves
//     both, so the redelivery is a Duplicate;
//   - two concurrent deliveries serialise on the key's unique index: the
//     second INSERT waits for the first transaction and then inserts 0 rows;
//   - a copy whose payload differs from the committed one is a Conflict, not
//     a Duplicate, and is reported;
//   - a copy older than the window is Expired and refused, since its key may
//     have been forgotten;
//   - a copy whose id was minted more than MaxFutureSkew ahead of the
//     consumer's clock is refused at once with a permanent error (ErrAhead)
//     naming the skew, so the transport parks it with that reason.
//
// The key is the envelope's event_id, never the SQS MessageId, which changes
// on every redrive. The package also holds the inbox (store first, process
// later) and the retention maintenance of both tables: run a Maintainer
// beside them. processed_messages is partitioned by day, and Migrate
// creates only DefaultPartitionsAhead days; without a Maintainer, new
// messages fail (retryably, naming it) once those days are past.
package idempotent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
	"github.com/effectively-once/payments-cashback/pkg/retry"
)

// Message is what a Consumer needs to know about a delivery: its key, a hash
// of its content, and when it happened.
type Message struct {
	EventID    uuid.UUID // the event id: the dedupe key
	Hash       []byte    // content digest: same ID + other Hash = Conflict
	OccurredAt time.Time // checked against the retention window
}

// MessageOf derives the Message of an envelope.
func MessageOf(e events.Envelope) Message {
	return Message{EventID: e.EventID, Hash: e.Hash(), OccurredAt: e.OccurredAt}
}

// Effect is the work a message does. It must touch nothing but tx: it can
// run more than once (a serialization failure retries the transaction; a
// redelivery after a rollback runs it again), and only what it does through
// tx is undone when that happens. tx is lent: the consumer commits it with
// the dedupe record, so its Commit and Rollback return ErrTxOwned (and the
// message fails, rolled back); return an error to roll back.
type Effect func(ctx context.Context, tx pgx.Tx) error

// Consumer deduplicates messages for one named consumer. The name scopes
// the keys: two consumers of the same event each apply it once.
type Consumer struct {
	pool       *pgxpool.Pool
	name       string
	retention  time.Duration
	queueRet   time.Duration
	maxRetries uint
	now        func() time.Time
	log        *slog.Logger
	outcomes   metric.Int64Counter
}

// Option configures a Consumer.
type Option func(*Consumer)

// WithRetention sets the dedupe window (default DefaultRetention). Keep it
// equal to the retention the partition maintenance uses. NewConsumer
// refuses a window that does not exceed the queue retention by a day (see
// ValidateRetention): a copy the queue could still hand back would
// otherwise be refused as Expired, its effect never applied.
func WithRetention(d time.Duration) Option { return func(c *Consumer) { c.retention = d } }

// WithQueueRetention is the longest the source queue (and its DLQ) can
// hand a message back (default DefaultQueueRetention, SQS's 14 days): set
// it, with a shorter WithRetention, for a queue that keeps messages less.
func WithQueueRetention(d time.Duration) Option { return func(c *Consumer) { c.queueRet = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *Consumer) { c.log = l } }

// WithMaxRetries bounds how often a transaction that failed with a
// serialization error or deadlock is run again (default 5).
func WithMaxRetries(n uint) Option { return func(c *Consumer) { c.maxRetries = n } }

// NewConsumer returns a Consumer named name (for example "rewards").
func NewConsumer(pool *pgxpool.Pool, name string, opts ...Option) (*Consumer, error) {
	if name == "" {
		return nil, errors.New("idempotent: consumer name is empty")
	}
	if pool == nil {
		return nil, errors.New("idempotent: NewConsumer needs a pool")
	}
	c := &Consumer{pool: pool, name: name, retention: DefaultRetention, queueRet: DefaultQueueRetention, maxRetries: 5, now: time.Now, log: slog.Default()}
	for _, o := range opts {
		o(c)
	}
	if err := ValidateRetention(c.retention, c.queueRet); err != nil {
		return nil, err
	}
	var err error
	c.outcomes, err = otel.Meter(meterName).Int64Counter("idempotent_messages_total",
		metric.WithDescription("Messages seen by an idempotent consumer, by outcome (applied, duplicate, conflict, expired, failed)."))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// meterName names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var meterName = reflect.TypeFor[Item]().PkgPath()

// Name is the consumer name that scopes the keys.
func (c *Consumer) Name() string { return c.name }

// expired reports whether msg is older than the window, judged both by its
// occurred_at and by the time in its UUIDv7 id (which picks its partition).
func (c *Consumer) expired(msg Message) bool {
	return beyondWindow(msg.EventID, msg.OccurredAt, c.now(), c.retention)
}

// Handle applies effect for msg at most once per consumer, as the package
// documentation describes. It returns:
//   - Applied, nil: effect committed together with the key;
//   - Duplicate, nil: committed before with the same hash; effect not run;
//   - Conflict, ErrConflict: committed before with another hash; not run;
//   - Expired, ErrExpired: older than the window; not run;
//   - Failed, err: effect or database error; everything rolled back. An
//     Effect that panics is recovered and fails so, err a *errs.PanicError
//     (logged with its stack; not permanent): a subscriber counts it
//     towards MaxPanics as a panic that reached it.
//
// Ack the message exactly when Outcome.Done() is true.
func (c *Consumer) Handle(ctx context.Context, msg Message, effect Effect) (Outcome, error) {
	out, err := c.handle(ctx, msg, effect)
	c.record(ctx, msg, out, err)
	return out, err
}

// ahead refuses an id minted more than MaxFutureSkew after c's clock, with
// a permanent error that says by how much.
func (c *Consumer) ahead(msg Message) error { return msg.Ahead(c.now()) }

// refuse is the outcome of a message that must not be tried, if any: an
// invalid one (ErrInvalidMessage, ErrNilEffect), one older than the window
// or one from too far ahead.
func (c *Consumer) refuse(msg Message, effect Effect) (Outcome, error) {
	if effect == nil {
		return Failed, ErrNilEffect
	}
	if err := msg.Validate(); err != nil {
		return Failed, err
	}
	if c.expired(msg) {
		return Expired, ErrExpired
	}
	if err := c.ahead(msg); err != nil {
		return Failed, err
	}
	return 0, nil
}

func (c *Consumer) handle(ctx context.Context, msg Message, effect Effect) (Outcome, error) {
	if out, err := c.refuse(msg, effect); err != nil {
		return out, err
	}
	return c.retry(ctx, func() (Outcome, error) {
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			return Failed, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		// A new message (the common case) costs only the claim: BEGIN,
		// this INSERT, the effect, COMMIT. A duplicate costs one more
		// statement, the read of the committed key's hash; being a new
		// statement, it sees the row of a concurrent claim the INSERT
		// waited for.
		tag, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash)
			VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, c.name, pgid.Of(msg.EventID), msg.Hash)
		if err != nil {
			return Failed, claimError(err)
		}
		if tag.RowsAffected() == 0 {
			var hash []byte
			if err := tx.QueryRow(ctx, `SELECT payload_hash FROM processed_messages WHERE consumer = $1 AND message_id = $2`,
				c.name, pgid.Of(msg.EventID)).Scan(&hash); err != nil {
				return Failed, fmt.Errorf("idempotent: read the hash of key %s: %w", msg.EventID, err)
			}
			if !bytes.Equal(hash, msg.Hash) {
				return Conflict, ErrConflict
			}
			return Duplicate, nil
		}
		if err := c.run(ctx, msg, func() error { return effect(ctx, lentTx{tx}) }); err != nil {
			return Failed, err
		}
		if err := tx.Commit(ctx); err != nil {
			return Failed, err
		}
		return Applied, nil
	})
}

// run calls f, an Effect (or a BatchEffect: msg is then zero), and turns
// a panic in it into a *errs.PanicError, logged here with its stack (the
// error cannot carry it to the transport's log): the caller's deferred
// rollback undoes what it wrote, and the message fails like an effect error
// instead of taking its batch, and the caller's outcomes, with it.
func (c *Consumer) run(ctx context.Context, msg Message, f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("idempotent: effect panicked: %w", &errs.PanicError{Value: v})
			args := []any{"consumer", c.name, "panic", v, "stack", string(debug.Stack())}
			if msg.EventID != uuid.Nil {
				args = append(args, "event_id", msg.EventID)
			}
			c.log.ErrorContext(ctx, "effect panicked: rolled back, the message fails like an effect error", args...)
		}
	}()
	return f()
}

// retry runs attempt again after serialization failures and deadlocks,
// with jittered exponential backoff; any other error is final.
func (c *Consumer) retry(ctx context.Context, attempt func() (Outcome, error)) (Outcome, error) {
	b := retry.Policy{Base: 5 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.5}.BackOff()
	out, err := backoff.Retry(ctx, func() (Outcome, error) {
		out, err := attempt()
		if err != nil && !retryable(err) {
			return out, backoff.Permanent(err)
		}
		return out, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(c.maxRetries+1), backoff.WithMaxElapsedTime(0))
	var pe *backoff.PermanentError
	if errors.As(err, &pe) {
		err = pe.Unwrap()
	}
	if err != nil && (out == 0 || out.Done()) {
		out = Failed
	}
	return out, err
}

func (c *Consumer) record(ctx context.Context, msg Message, out Outcome, err error) {
	c.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("consumer", c.name), attribute.String("outcome", out.String())))
	switch out {
	case Conflict:
		c.log.ErrorContext(ctx, "event id reused with a different payload: not applied",
			"consumer", c.name, "event_id", msg.EventID)
	case Expired:
		c.log.ErrorContext(ctx, "message older than the dedupe window: refused, not applied",
			"consumer", c.name, "event_id", msg.EventID, "occurred_at", msg.OccurredAt, "retention", c.retention)
	case Failed:
		if errors.Is(err, ErrAhead) {
			c.log.ErrorContext(ctx, "event id from the future: refused, not applied, to be parked",
				"consumer", c.name, "event_id", msg.EventID, "error", err)
			return
		}
		if errs.IsPanic(err) {
			return // logged with its stack where it was recovered
		}
		var p interface{ Permanent() bool }
		if errors.As(err, &p) && p.Permanent() {
			c.log.ErrorContext(ctx, "effect refused the message permanently: rolled back, to be parked",
				"consumer", c.name, "event_id", msg.EventID, "error", err)
			return
		}
		c.log.WarnContext(ctx, "effect failed: rolled back, left for redelivery",
			"consumer", c.name, "event_id", msg.EventID, "error", err)
	}
}
