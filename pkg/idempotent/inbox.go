package idempotent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/internal/snapshot"
	"github.com/effectively-once/payments-cashback/pkg/worker"
)

// gaugeCap bounds the rows each backlog gauge reads: inbox_pending and
// inbox_failed read gaugeCap when at least that many rows are in that
// state, and the oldest pending age is taken over the pending rows read, so
// a scrape costs the same however large the backlog (Backlog and
// `inboxctl backlog` still count exactly).
var gaugeCap int64 = 10000

// gaugeQueryTimeout bounds one read of the gauges' values.
const gaugeQueryTimeout = 2 * time.Second

// DefaultQueueRetention is the longest an SQS queue keeps a message (14
// days, also what sqstransport.EnsureQueue sets on queues and DLQs).
const DefaultQueueRetention = 14 * day

// InboxConfig tunes an Inbox. Zero values take the defaults in brackets.
type InboxConfig struct {
	// Retention is the dedupe window [DefaultRetention]: a copy whose
	// occurred_at, or the time in its UUIDv7 id, is older than this is
	// refused with ErrExpired. Use the same value for the Maintainer, which
	// deletes DONE rows once they fall out of this window.
	Retention time.Duration
	// QueueRetention is the longest the source queue (and its DLQ) can hand
	// a message back [DefaultQueueRetention]; NewInbox refuses a Retention
	// that does not exceed it by a day (see ValidateRetention).
	QueueRetention time.Duration
	// Logger [slog.Default()]; MeterProvider [otel.GetMeterProvider()].
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	// MetricsCacheTTL is how long the backlog gauges' values are reused
	// before they are read again [5s]: a scrape never costs more than one
	// bounded query per TTL.
	MetricsCacheTTL time.Duration
	// Now is the clock for the retention check [time.Now]; tests inject one.
	Now func() time.Time
}

func (c *InboxConfig) defaults() {
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.QueueRetention <= 0 {
		c.QueueRetention = DefaultQueueRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.MetricsCacheTTL <= 0 {
		c.MetricsCacheTTL = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Inbox is one consumer's inbox: store first, apply later.
//
// A Consumer applies a message's effect while the transport waits, so the
// message stays in flight (its visibility extended) for as long as the
// effect runs. The inbox splits the two halves:
//
//	Receive:   INSERT INTO inbox ... ON CONFLICT DO NOTHING (autocommit) -> ack
//	Processor: claim the head row of a key; apply its effect and mark it DONE
//	           in one transaction; on error back off in the row; FAILED at the end
//
// Receiving is one short statement, so the queue's copy is deleted within
// milliseconds however slow the effect, and a slow or failing effect never
// holds up the queue: retries, backoff and the FAILED state live in the row
// (next_attempt_at, attempts, last_error), where operators see them
// (cmd/inboxctl), not in a sleeping subscriber. The inbox row is the dedupe
// key too: it is kept until it is DONE and its event is out of the retention
// window (Maintainer), and a copy older than the window is refused.
//
// Creating an Inbox also registers the observable gauges inbox_pending,
// inbox_oldest_pending_age_seconds and inbox_failed for its consumer (each
// collection runs one indexed query); create one Inbox per consumer per
// process and Close it when done.
type Inbox struct {
	pool     *pgxpool.Pool
	consumer string
	cfg      InboxConfig
	log      *slog.Logger

	received, refused   metric.Int64Counter
	processed, timeouts metric.Int64Counter
	gauges              metric.Registration
	attrConsumer        attribute.KeyValue

	mu            sync.Mutex
	stored        worker.Signal // wakes the processors after each store
	sharedWorkers int           // processor workers made on pool (see ProcessorConfig.Pool)
}

// NewInbox returns the inbox of consumer (for example "notifications").
func NewInbox(pool *pgxpool.Pool, consumer string, cfg InboxConfig) (*Inbox, error) {
	if consumer == "" {
		return nil, errors.New("idempotent: inbox consumer name is empty")
	}
	if pool == nil {
		return nil, errors.New("idempotent: NewInbox needs a pool")
	}
	cfg.defaults()
	if err := ValidateRetention(cfg.Retention, cfg.QueueRetention); err != nil {
		return nil, err
	}
	in := &Inbox{pool: pool, consumer: consumer, cfg: cfg, log: cfg.Logger.With("consumer", consumer),
		attrConsumer: attribute.String("consumer", consumer)}
	m := cfg.MeterProvider.Meter(meterName)
	var err error
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&in.received, "inbox_received_total", "Messages offered to an inbox, by outcome (stored, duplicate, conflict, expired, invalid, failed)."},
		{&in.refused, "inbox_refused_total", "Messages an inbox refused to store, by reason (expired, conflict, invalid); the transport parks them. Alert when it rises."},
		{&in.processed, "inbox_processed_total", "Inbox attempts that ended, by outcome (done, retry, failed)."},
		{&in.timeouts, "inbox_handler_timeouts_total", "Inbox handlers cut at the processor's HandlerTimeout; their rows are retried."},
	} {
		if *c.dst, err = m.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	pending, err := m.Int64ObservableGauge("inbox_pending",
		metric.WithDescription("PENDING inbox rows: received, not yet applied."))
	if err != nil {
		return nil, err
	}
	oldest, err := m.Float64ObservableGauge("inbox_oldest_pending_age_seconds",
		metric.WithDescription("Seconds the oldest PENDING inbox row has waited since it was received (0 if none); alert when it grows."))
	if err != nil {
		return nil, err
	}
	failed, err := m.Int64ObservableGauge("inbox_failed",
		metric.WithDescription("FAILED inbox rows waiting for an operator (inboxctl failed / replay); each blocks its ordering key. Alert when above 0."))
	if err != nil {
		return nil, err
	}
	cache := snapshot.New(cfg.MetricsCacheTTL, gaugeQueryTimeout, in.boundedBacklog)
	in.gauges, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		b, err := cache.Get(ctx)
		if err != nil {
			return fmt.Errorf("idempotent: inbox %s backlog: %w", consumer, err)
		}
		attrs := metric.WithAttributes(in.attrConsumer)
		o.ObserveInt64(pending, b.Pending, attrs)
		o.ObserveFloat64(oldest, b.OldestPending.Seconds(), attrs)
		o.ObserveInt64(failed, b.Failed, attrs)
		return nil
	}, pending, oldest, failed)
	if err != nil {
		return nil, err
	}
	return in, nil
}

// boundedBacklog is Backlog for the gauges: each count reads at most
// gaugeCap rows of the inbox_unfinished index.
func (in *Inbox) boundedBacklog(ctx context.Context) (Backlog, error) {
	b := Backlog{Consumer: in.consumer}
	var secs float64
	err := in.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM (SELECT 1 FROM inbox WHERE consumer = $1 AND status IN ('PENDING', 'FAILED')
		    AND status = 'PENDING' LIMIT $2) p),
		(SELECT coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 FROM (SELECT received_at FROM inbox
		  WHERE consumer = $1 AND status IN ('PENDING', 'FAILED') AND status = 'PENDING' LIMIT $2) p),
		(SELECT count(*) FROM (SELECT 1 FROM inbox WHERE consumer = $1 AND status IN ('PENDING', 'FAILED')
		    AND status = 'FAILED' LIMIT $2) f)`, in.consumer, gaugeCap).Scan(&b.Pending, &secs, &b.Failed)
	b.OldestPending = time.Duration(secs * float64(time.Second))
	return b, err
}

// Consumer is the consumer name that scopes this inbox's keys.
func (in *Inbox) Consumer() string { return in.consumer }

// Close unregisters the inbox's gauges. It does not close the pool.
func (in *Inbox) Close() error { return in.gauges.Unregister() }

// Backlog reports this consumer's PENDING count, the age of its oldest
// PENDING row and its FAILED count: the figures the gauges export.
func (in *Inbox) Backlog(ctx context.Context) (Backlog, error) {
	bs, err := InboxBacklog(ctx, in.pool, in.consumer)
	if err != nil || len(bs) == 0 {
		return Backlog{Consumer: in.consumer}, err
	}
	return bs[0], nil
}

// KeyFunc picks the ordering key of an event: events that share a key are
// applied one at a time, in aggregate_version order; different keys run in
// parallel.
type KeyFunc func(events.Envelope) string

// ByAggregate is the usual KeyFunc: the events of one aggregate (one
// payment, one cashback credit) are applied in version order.
func ByAggregate(e events.Envelope) string { return e.AggregateID }

// Receiver returns Receive as a plain handler that a transport calls per
// message, keyed by key (nil means ByAggregate). It returns nil when the
// message may be acknowledged; see Receive for the errors. The SQS adapter
// is inboxsqs.Handler.
func (in *Inbox) Receiver(key KeyFunc) func(ctx context.Context, e events.Envelope) error {
	if key == nil {
		key = ByAggregate
	}
	return func(ctx context.Context, e events.Envelope) error {
		_, err := in.Receive(ctx, e, key(e))
		return err
	}
}

// Receive stores e as a PENDING row under orderingKey, in one autocommitted
// INSERT ... ON CONFLICT DO NOTHING on the key (consumer, event_id). It
// never runs the effect; a Processor does, later. Acknowledge the message
// (delete it from its queue) exactly when the error is nil:
//
//   - stored, nil: the row is new and committed. A crash before this point
//     left nothing, so the redelivered copy is stored then; a crash after it
//     but before the ack makes the redelivery a duplicate.
//   - !stored, nil: a duplicate: the row was already there with the same
//     content hash, whatever its state (PENDING, DONE or FAILED). Nothing is
//     changed; the copy is acked and forgotten. Concurrent copies serialise
//     on the primary key and exactly one of them stores.
//   - ErrConflict: the event id is already stored with a different payload
//     (a producer reused an id). Nothing is changed.
//   - ErrExpired: the copy is older than the retention window, by its
//     occurred_at or by the time in its id, so its dedupe row may already
//     have been cleaned up and storing it could apply it twice. It is not
//     stored, it is logged with its event id and counted in
//     inbox_refused_total{reason="expired"}. It is refused rather than kept
//     as a FAILED row on purpose: replaying such a row would be exactly the
//     unsafe double apply the window exists to prevent, and a FAILED row would
//     block its ordering key behind an event that may never be applied. The
//     transport parks it in the DLQ with the reason, for a human.
//   - an invalid envelope or an empty ordering key: a permanent error.
//
// ErrConflict, ErrExpired and the invalid-input errors are permanent
// (IsPermanent), so sqstransport parks the message in the DLQ instead of
// retrying it. Any other error (the database is unreachable) is transient:
// nothing was stored, do not ack, the message comes back.
func (in *Inbox) Receive(ctx context.Context, e events.Envelope, orderingKey string) (stored bool, err error) {
	out, err := in.receive(ctx, e, orderingKey)
	in.recordReceive(ctx, e, out, err)
	return out == receivedStored, err
}

// receiveOutcome labels what Receive did, for metrics and logs.
type receiveOutcome string

const (
	receivedStored    receiveOutcome = "stored"
	receivedDuplicate receiveOutcome = "duplicate"
	receivedConflict  receiveOutcome = "conflict"
	receivedExpired   receiveOutcome = "expired"
	receivedInvalid   receiveOutcome = "invalid"
	receivedFailed    receiveOutcome = "failed"
)

func (in *Inbox) receive(ctx context.Context, e events.Envelope, orderingKey string) (receiveOutcome, error) {
	if out, err := in.check(e, orderingKey); err != nil {
		return out, err
	}
	hash := e.Hash()
	tag, err := in.pool.Exec(ctx, `INSERT INTO inbox
		(consumer, message_id, ordering_key, event_type, aggregate_id, aggregate_version, occurred_at, payload, payload_hash, traceparent)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT DO NOTHING`,
		in.consumer, e.EventID, orderingKey, e.EventType, e.AggregateID, e.AggregateVersion, e.OccurredAt,
		[]byte(e.Payload), hash, traceparent(ctx))
	if err != nil {
		return receivedFailed, fmt.Errorf("idempotent: inbox %s: store %s: %w", in.consumer, e.EventID, err)
	}
	if tag.RowsAffected() == 1 {
		in.wake(1)
		return receivedStored, nil
	}
	// 0 rows: the key is committed already (ON CONFLICT waited for any
	// concurrent inserter to finish). Same content or not?
	var have []byte
	err = in.pool.QueryRow(ctx, `SELECT payload_hash FROM inbox WHERE consumer = $1 AND message_id = $2`,
		in.consumer, e.EventID).Scan(&have)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Cleaned up between the two statements: the row was DONE and out
		// of the window by the maintainer's clock. Let the copy come back.
		return receivedFailed, fmt.Errorf("idempotent: inbox %s: row %s vanished while checking a duplicate", in.consumer, e.EventID)
	case err != nil:
		return receivedFailed, fmt.Errorf("idempotent: inbox %s: read existing %s: %w", in.consumer, e.EventID, err)
	case string(have) != string(hash):
		return receivedConflict, ErrConflict
	}
	return receivedDuplicate, nil
}

func (in *Inbox) recordReceive(ctx context.Context, e events.Envelope, out receiveOutcome, err error) {
	in.received.Add(ctx, 1, metric.WithAttributes(in.attrConsumer, attribute.String("outcome", string(out))))
	switch out {
	case receivedExpired, receivedConflict, receivedInvalid:
		in.refused.Add(ctx, 1, metric.WithAttributes(in.attrConsumer, attribute.String("reason", string(out))))
	}
	switch out {
	case receivedExpired:
		in.log.ErrorContext(ctx, "inbox refused a message older than the dedupe window: not stored, not applied; park it for a human",
			"event_id", e.EventID, "event_type", e.EventType, "occurred_at", e.OccurredAt, "retention", in.cfg.Retention)
	case receivedConflict:
		in.log.ErrorContext(ctx, "inbox refused an event id reused with a different payload: not stored",
			"event_id", e.EventID, "event_type", e.EventType)
	case receivedInvalid:
		in.log.ErrorContext(ctx, "inbox refused an invalid message", "event_id", e.EventID, "error", err)
	case receivedFailed:
		in.log.WarnContext(ctx, "inbox could not store a message: left for redelivery", "event_id", e.EventID, "error", err)
	}
}

// wake nudges this process's processors after a store, so a fresh row is
// picked up without waiting for the next poll. It is only a hint: polling
// (which also serves rows stored by other replicas) stays the source of truth.
// It wakes one idle worker per row stored (n), not every worker for each:
// one claim takes a row, and the others would only claim nothing on the
// cores that claim needs. A worker that claims a full batch wakes the rest
// (Processor.Run).
func (in *Inbox) wake(n int) {
	for range n {
		in.stored.NotifyOne()
	}
}

// beyondWindow is the retention rule shared with Consumer.expired: a copy is
// too old when its occurred_at, or the time in its UUIDv7 id (which also
// decides when its dedupe row is dropped), is before now - retention.
func beyondWindow(id uuid.UUID, occurredAt, now time.Time, retention time.Duration) bool {
	horizon := now.Add(-retention)
	return occurredAt.Before(horizon) || (id.Version() == 7 && events.IDTime(id).Before(horizon))
}

// traceparent is the W3C trace context of ctx's span, or nil without one.
func traceparent(ctx context.Context) any {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	if tp := c["traceparent"]; tp != "" {
		return tp
	}
	return nil
}

// Permanent marks err as one that no retry can fix. A ProcessFunc that
// returns it fails its row at once (FAILED, with the error text) instead of
// backing off; a transport parks such a message instead of redelivering it.
// It is errs.Permanent: one marker for the whole library.
func Permanent(err error) error { return errs.Permanent(err) }

// IsPermanent reports whether err, or an error it wraps, is marked
// permanent (ErrConflict, ErrExpired, Permanent(...), errs.Permanent(...)).
func IsPermanent(err error) bool { return errs.IsPermanent(err) }
