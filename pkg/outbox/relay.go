package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
	"github.com/effectively-once/payments-cashback/pkg/internal/snapshot"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/retry"
	"github.com/effectively-once/payments-cashback/pkg/worker"
)

// Message is one outbox row ready for the wire.
type Message struct {
	EventID    uuid.UUID         // the event id
	Body       []byte            // the JSON envelope
	Attributes map[string]string // event_id, event_type and, if known, traceparent
}

// Publisher sends messages to a queue or topic. PublishBatch returns, per
// message id, the error of each message that was NOT accepted; every message
// absent from that map was accepted. An error return means none can be
// assumed accepted. Each error's text becomes the failed row's last_error,
// made valid UTF-8, without NUL and cut to 2 KB, so no error text can fail
// the batch's mark. pkg/sqstransport.Publisher implements it with
// SendMessageBatch.
type Publisher interface {
	PublishBatch(ctx context.Context, msgs []Message) (failed map[uuid.UUID]error, err error)
}

// RelayConfig tunes a Relay. Zero values take the defaults in brackets.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes [100], at most
	// MaxBatchSize. The publisher splits them into SQS batches of 10 and
	// sends those concurrently.
	BatchSize int
	// Workers is how many claim-publish-mark loops run in this process [2],
	// so one batch is being claimed while another is on the wire.
	Workers int
	// PollInterval is the fallback when no notification arrives [500ms].
	PollInterval time.Duration
	// Lease bounds how long a batch's claim can outlive a relay that stops
	// talking to the server [30s]. The claim is a row lock held by the
	// batch's transaction, and the transaction runs with
	// idle_in_transaction_session_timeout = Lease: a relay that dies
	// releases its rows at once (its session ends), one that hangs or is
	// cut off from the server after Lease. The setting is in whole
	// milliseconds, and 0 would turn it off: a Lease is rounded up to a
	// whole millisecond, and one above MaxLease is clamped to it.
	Lease time.Duration
	// PublishTimeout bounds one batch's publish [Lease/2]. A message still
	// unsent when it runs out counts as failed and is rescheduled by
	// backoff, and the rest of the batch is marked, while the claim still
	// holds. The lease runs from the end of the claim, and after the
	// publish the mark must still reach the server, so PublishTimeout must
	// leave the mark a margin of the lease, which NewRelay checks:
	// PublishTimeout <= Lease - min(max(MarkTimeout, 1s), Lease/2). A publish allowed (nearly) the
	// whole lease would have its session ended by the server before the
	// mark, and the rows the queue accepted would be claimed and sent again.
	PublishTimeout time.Duration
	// MarkTimeout bounds the statements that record a batch's outcome [5s],
	// on a context of their own, so a slow publish cannot starve them.
	MarkTimeout time.Duration
	// RetryBase and RetryMax bound the per-row backoff after a failed send
	// [retry.BaseDefault, retry.MaxDefault]: next_attempt_at = now +
	// min(RetryMax, RetryBase*2^(attempts-1)) jittered by ±25%, the retry
	// package's schedule.
	RetryBase, RetryMax time.Duration
	// DisableListen turns off LISTEN/NOTIFY (for PgBouncer in transaction
	// mode, where a session's LISTEN does not survive); polling alone then
	// drives the relay.
	DisableListen bool
	// DeleteOnPublish deletes each row the queue accepted, in its batch's
	// transaction, instead of marking it published. A row then costs its
	// claim's lock and a delete: no new row version, no index entries, no
	// later cleanup. The guarantee is the same (a row leaves the outbox only
	// once the queue has accepted it, and a crash before the COMMIT leaves
	// it to be sent again), but a published row is gone at once, with
	// nothing left to inspect: published_at is never set. Failed sends are
	// rescheduled as without it. Default off.
	DeleteOnPublish bool
	// KeepPublished is how long published rows stay for inspection before
	// the cleanup deletes them [24h]; CleanupInterval is how often it runs [1m].
	KeepPublished, CleanupInterval time.Duration
	Logger                         *slog.Logger
	// MetricsCacheTTL is how long the backlog gauges' values are reused
	// before they are read again [5s]: a scrape never costs more than one
	// bounded query per TTL.
	MetricsCacheTTL time.Duration
	// MeterProvider receives the relay's metrics (default: the global one).
	MeterProvider metric.MeterProvider
}

func (c *RelayConfig) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	def(&c.PollInterval, 500*time.Millisecond)
	def(&c.Lease, 30*time.Second)
	c.Lease = min(leaseMillis(c.Lease), MaxLease)
	def(&c.PublishTimeout, c.Lease/2)
	def(&c.MarkTimeout, 5*time.Second)
	def(&c.RetryBase, retry.BaseDefault)
	def(&c.RetryMax, retry.MaxDefault)
	def(&c.KeepPublished, 24*time.Hour)
	def(&c.CleanupInterval, time.Minute)
	def(&c.MetricsCacheTTL, 5*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// markMargin is the part of lease that RelayConfig.PublishTimeout must
// leave for the mark, given the MarkTimeout: the MarkTimeout, at least 1 s
// (the mark may take that long to reach the server, and a mark sent late
// finds its session ended), but at most half the lease (the default
// PublishTimeout's split), so a short lease still leaves the publish half.
func markMargin(lease, markTimeout time.Duration) time.Duration {
	return min(max(markTimeout, time.Second), lease/2)
}

// leaseMillis rounds a positive lease up to a whole millisecond, the unit
// of idle_in_transaction_session_timeout, so that no lease becomes 0
// there, which turns the timeout off.
func leaseMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// MaxBatchSize is the largest RelayConfig.BatchSize (and RELAY_BATCH_SIZE):
// a claim allocates room for BatchSize messages on every poll and holds
// them through the publish, and far fewer keep the queue busy (the
// publisher sends them 10 at a time).
const MaxBatchSize = 10_000

// MaxLease is the longest RelayConfig.Lease. The lease is the claim's
// idle_in_transaction_session_timeout, an int4 of milliseconds in
// PostgreSQL (about 24.8 days at most): past that every claim fails. A
// day is far above any useful lease (a batch's publish takes milliseconds)
// and well inside the setting's range.
const MaxLease = 24 * time.Hour

// Relay publishes committed outbox rows. Any number of relays, in one
// process or many, may run against the same table. Each batch is one short
// READ COMMITTED transaction: it locks the due rows with FOR UPDATE SKIP
// LOCKED (the lock is the claim: replicas skip the rows and never wait on
// each other nor fail to serialise), publishes them, and records each row's
// outcome just before COMMIT, so a row costs one write besides its lock
// (an UPDATE, or with DeleteOnPublish a DELETE). A row is marked published
// (or deleted) only after the publisher accepted it; a relay that dies in
// between takes its transaction with it, and the rows are sent again. A
// row that cannot be read or encoded fails on its own, as a refused send
// does (rescheduled with last_error and backoff), and the rest of its batch
// is sent: no one row stops the relay.
type Relay struct {
	pool *pgxpool.Pool
	pub  Publisher
	cfg  RelayConfig
	log  *slog.Logger

	published, failures metric.Int64Counter
	backlog             *snapshot.Cache[backlog]
	gauges              metric.Registration
	closeOnce           sync.Once
	ran                 atomic.Bool
}

// ErrRelayUsed: Run was called on a Relay that has run, or is running.
// A Relay runs once (Run unregisters its gauges when it returns); build
// another for another run.
var ErrRelayUsed = errors.New("outbox: this Relay has run already; build a new one with NewRelay")

// backlog is what the gauges export.
type backlog struct {
	unpublished int64
	oldest      float64 // seconds
}

// NewRelay returns a relay that publishes the outbox of pool through pub.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg RelayConfig) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a publisher")
	}
	cfg.defaults()
	if cfg.BatchSize > MaxBatchSize {
		return nil, fmt.Errorf("outbox: BatchSize %d is above MaxBatchSize %d: a claim allocates room for BatchSize messages on every poll",
			cfg.BatchSize, MaxBatchSize)
	}
	if most := cfg.Lease - markMargin(cfg.Lease, cfg.MarkTimeout); cfg.PublishTimeout > most {
		return nil, fmt.Errorf("outbox: PublishTimeout %v leaves too little of Lease %v for the mark: want at most %v "+
			"(Lease less the lesser of MarkTimeout %v, at least 1s, and half the lease), so the batch is marked while its claim holds",
			cfg.PublishTimeout, cfg.Lease, most, cfg.MarkTimeout)
	}
	r := &Relay{pool: pool, pub: pub, cfg: cfg, log: cfg.Logger}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(otelScope)
	var err error
	if r.published, err = m.Int64Counter("outbox_published_total", metric.WithDescription("Outbox rows published and marked (or deleted, with DeleteOnPublish).")); err != nil {
		return nil, err
	}
	if r.failures, err = m.Int64Counter("outbox_publish_failures_total", metric.WithDescription("Outbox rows whose publish failed and was rescheduled.")); err != nil {
		return nil, err
	}
	// Zero from the start, so rate() and alerts work before the first event.
	r.published.Add(context.Background(), 0)
	r.failures.Add(context.Background(), 0)
	oldest, err := m.Float64ObservableGauge("outbox_oldest_unpublished_age_seconds",
		metric.WithDescription("Age of the oldest unpublished outbox row; alert when it grows."))
	if err != nil {
		return nil, err
	}
	unpublished, err := m.Int64ObservableGauge("outbox_unpublished",
		metric.WithDescription("Outbox rows committed and not yet published, up to 10000; alert when it keeps growing."))
	if err != nil {
		return nil, err
	}
	r.backlog = snapshot.New(cfg.MetricsCacheTTL, gaugeQueryTimeout, r.readBacklog)
	if r.gauges, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		b, err := r.backlog.Get(ctx)
		if err != nil {
			return nil // no observation rather than a wrong one
		}
		o.ObserveInt64(unpublished, b.unpublished)
		o.ObserveFloat64(oldest, b.oldest)
		return nil
	}, oldest, unpublished); err != nil {
		return nil, err
	}
	return r, nil
}

// readBacklog reads the gauges' values over at most gaugeCap unpublished
// rows, walked in the order of the outbox_due index.
func (r *Relay) readBacklog(ctx context.Context) (backlog, error) {
	var b backlog
	err := r.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM (SELECT created_at FROM outbox WHERE published_at IS NULL ORDER BY next_attempt_at LIMIT $1) s`,
		gaugeCap).Scan(&b.unpublished, &b.oldest)
	return b, err
}

// Close unregisters the relay's gauges; Run does it when it returns.
func (r *Relay) Close() error {
	var err error
	r.closeOnce.Do(func() { err = r.gauges.Unregister() })
	return err
}

// Unpublished counts the rows waiting to be published.
func (r *Relay) Unpublished(ctx context.Context) (int64, error) {
	var n int64
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n)
	return n, err
}

// Run relays until ctx is cancelled. A batch on the wire when ctx ends is
// still marked (with a short grace period), so a clean shutdown causes no
// duplicate sends. Run returns nil on cancellation, and ErrRelayUsed,
// at once, if the Relay has run before.
//
// Its Workers loops are pkg/worker loops named "outbox-relay": a full batch
// is followed at once by the next claim; otherwise a loop sleeps until a
// NOTIFY on the 'outbox' channel or PollInterval. While the database or the
// queue is unreachable the sleep doubles from PollInterval up to 30 s, so
// an outage is not flooded with claims (or, for the queue, with rows
// claimed only to fail); a NOTIFY ends such a sleep only after its first
// second (or PollInterval, if longer), so a producer's commits do not
// undo the back-off, yet the first commit after a database outage ends a
// long one within a second. While the queue refuses every batch as a whole
// for another cause (a queue deleted, a wrong URL, a denied permission,
// expired credentials, throttling) it doubles the same way, up to the
// lesser of 30 s and RetryMax, and each such batch is logged once, not
// once per row. A pass that succeeds ends the back-off.
func (r *Relay) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return ErrRelayUsed
	}
	var wake worker.Signal
	var wg sync.WaitGroup
	if !r.cfg.DisableListen {
		wg.Go(func() { r.listen(ctx, &wake) })
	}
	wg.Go(func() { r.cleanupLoop(ctx) })
	err := worker.Run(ctx, worker.Config{
		Name: "outbox-relay", Workers: r.cfg.Workers, PollInterval: r.cfg.PollInterval, Wake: &wake,
		Backoff: r.backoff, Logger: r.log, MeterProvider: r.cfg.MeterProvider,
	}, r.pass)
	wg.Wait()
	return errors.Join(err, r.Close())
}

// pass is one claim-publish-mark round for worker.Run.
func (r *Relay) pass(ctx context.Context, _ int) (int, bool, error) {
	n, pubErr, err := r.relayOnce(ctx)
	if err == nil && pubErr != nil {
		// Not a failure of the relay's (the rows are rescheduled), but the
		// loop must back off as for one: the next batch would most likely
		// fail the same way.
		what := "queue refused the whole batch"
		if outage.Unavailable(pubErr) {
			what = "queue unreachable"
		}
		err = &batchError{fmt.Errorf("outbox: %s, batch of %d rescheduled: %w", what, n, pubErr)}
	}
	return n, err == nil && n == r.cfg.BatchSize, err
}

// batchError is a pass whose publish failed for the whole batch.
type batchError struct{ error }

func (e *batchError) Unwrap() error { return e.error }

// maxBackoff is the longest sleep after failed passes.
const maxBackoff = 30 * time.Second

// backoff is the sleep after a failed pass: PollInterval, doubling from it
// (at least 100ms) while the failures go on, up to 30 s while they are
// outages (the database or the queue unreachable), and up to the lesser of
// 30 s and RetryMax while the queue refuses whole batches for another
// cause (a queue deleted, a wrong URL, a denied permission, expired
// credentials, throttling): a row it refused is retried no later than
// RetryMax either. Any other failure sleeps PollInterval.
func (r *Relay) backoff(failures int, err error) time.Duration {
	limit := maxBackoff
	switch {
	case outage.Unavailable(err):
	case errors.As(err, new(*batchError)):
		limit = min(limit, r.cfg.RetryMax)
	default:
		return r.cfg.PollInterval
	}
	return max(min(max(r.cfg.PollInterval, 100*time.Millisecond)<<min(failures, 10), limit), r.cfg.PollInterval)
}

// gaugeCap bounds the rows the backlog gauges read: outbox_unpublished
// reads gaugeCap when at least that many rows wait, and the oldest age is
// taken over those rows (the earliest due first), so a scrape costs the
// same for a backlog of millions.
var gaugeCap int64 = 10000

// gaugeQueryTimeout bounds one read of the gauges' values.
const gaugeQueryTimeout = 2 * time.Second

// errCrashed stands for a process killed at a failpoint (in-process tests).
var errCrashed = errors.New("outbox: crashed at failpoint")

// RelayOnce claims, publishes and marks at most one batch and returns how
// many rows it claimed. Run calls it in a loop; tests and tools may call it
// directly.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	n, _, err := r.relayOnce(ctx)
	return n, err
}

// relayOnce is RelayOnce that also returns the publisher's error when the
// whole batch failed (the rows are rescheduled, so it is not an error of
// the relay's), for Run to back off on an unreachable queue.
//
// One transaction per batch, on one connection: the claim's row locks are
// the claim, held across the publish, and the outcome (published or
// rescheduled) is the only write to each row, made just before COMMIT.
func (r *Relay) relayOnce(ctx context.Context) (n int, pubErr, err error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	// A connection released inside a transaction is closed by the pool, and
	// the server then drops the transaction and its locks: whatever path
	// leaves this function, no row stays claimed by it.
	defer conn.Release()
	msgs, bad, err := r.claim(ctx, conn.Conn())
	if err != nil || len(msgs)+len(bad) == 0 {
		rollback(ctx, conn.Conn())
		return 0, nil, err
	}
	n = len(msgs) + len(bad)
	var failed map[uuid.UUID]error
	if len(msgs) > 0 {
		failed, pubErr = r.publish(ctx, msgs)
	}
	r.logFailures(len(msgs), failed, bad, pubErr)
	// The rows that do not encode fail as a refused send does: rescheduled
	// with backoff and last_error, while the rest of the batch is marked.
	// They say nothing of the queue, so they leave pubErr alone.
	if len(bad) > 0 {
		all := make(map[uuid.UUID]error, len(failed)+len(bad))
		maps.Copy(all, failed) // not into the publisher's own map
		maps.Copy(all, bad)
		failed = all
	}
	if failpoint.Hit(failpoint.AfterPublishBeforeMark) {
		// A crash: the session ends without COMMIT, as a killed process's does.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		return n, pubErr, errCrashed
	}
	ok := make([][16]byte, 0, len(msgs))
	for _, m := range msgs {
		if _, bad := failed[m.EventID]; !bad {
			ok = append(ok, m.EventID)
		}
	}
	// A fresh context: the publish may have used up its own.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	if err := r.finish(mctx, conn.Conn(), ok, failed); err != nil {
		return n, pubErr, err
	}
	return n, pubErr, nil
}

// logFailures logs a batch's failed rows: a publish that failed for all
// sent rows (pubErr) once, with their number, as they failed the same
// way, each row's own error in its last_error; otherwise each row the
// queue refused; and each row that could not be read or encoded.
func (r *Relay) logFailures(sent int, failed, bad map[uuid.UUID]error, pubErr error) {
	if pubErr != nil {
		r.log.Warn("outbox batch publish failed: rescheduled", "rows", sent, "error", pubErr)
	} else {
		for id, err := range failed {
			r.log.Warn("outbox publish failed: rescheduled", "event_id", id, "error", err)
		}
	}
	for id, err := range bad {
		r.log.Warn("outbox row cannot be sent: rescheduled", "event_id", id, "error", err)
	}
}

// publish sends a batch's messages and returns those the queue did not
// accept, each with its error, and pubErr when none was accepted (the
// queue, not the messages, is then the likely cause).
func (r *Relay) publish(ctx context.Context, msgs []Message) (failed map[uuid.UUID]error, pubErr error) {
	// Once claimed, finish the batch even if ctx is cancelled meanwhile:
	// marking what was sent avoids re-sending it after a clean shutdown.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	failed, pubErr = r.pub.PublishBatch(pctx, msgs)
	cancel()
	if pubErr != nil {
		failed = make(map[uuid.UUID]error, len(msgs))
		for _, m := range msgs {
			failed[m.EventID] = pubErr
		}
	}
	if pubErr == nil && len(failed) == len(msgs) {
		for _, e := range failed {
			pubErr = e
			break
		}
	}
	return failed, pubErr
}

// claimSQL locks up to $1 due rows, oldest due first, skipping rows another
// relay holds. claimed_until is the lease that relays set before the claim
// was a row lock; it is still honoured so that a rolling upgrade never
// takes a row an older replica is publishing. Of the headers only the
// traceparent travels, so only it is read.
const claimSQL = `
		SELECT id, aggregate_id, aggregate_version, event_type, payload, coalesce(headers->>'traceparent', ''), occurred_at FROM outbox
		WHERE published_at IS NULL AND next_attempt_at <= now()
		  AND (claimed_until IS NULL OR claimed_until < now())
		ORDER BY next_attempt_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED`

// claim opens the batch's transaction on conn and locks up to BatchSize due
// rows in it, in one round trip. The transaction's
// idle_in_transaction_session_timeout is the Lease: a relay that stops
// talking to the server mid-batch (frozen, partitioned) has its session
// ended by the server after Lease, which releases the rows.
//
// A row it cannot read or encode is claimed too, and returned in bad with
// the reason, for finish to reschedule as a failed send: left out of the
// claim, or failing it, it would be the first row of every later claim.
func (r *Relay) claim(ctx context.Context, conn *pgx.Conn) (msgs []Message, bad map[uuid.UUID]error, err error) {
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, fmt.Sprint(r.cfg.Lease.Milliseconds()))
	b.Queue(claimSQL, r.cfg.BatchSize)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			msgs, bad, err = messages(conn.TypeMap(), rows, make([]Message, 0, r.cfg.BatchSize))
		}
	}
	if err = errors.Join(err, br.Close()); err != nil {
		return nil, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return msgs, bad, nil
}

// messages appends to msgs a Message for each row of claimSQL, the body
// encoded as events.Envelope.Marshal encodes it (the payload as jsonb
// prints it, compacted), with the characters a queue may refuse escaped
// (events.EscapeForSQS). A row that does not scan or does not encode is
// put in bad with its error instead, and the rest are read on: an
// occurred_at no time.Time holds ('infinity', which a producer writing the
// table in SQL can store), one that JSON cannot carry (stored before
// events.Validate refused it), a payload that jsonb made too large for one
// message, any column that fails to scan. Only a row whose id cannot be
// read fails the claim, as there is nothing to reschedule it by.
//
// The columns are scanned one by one, with plans made at the first row as
// rows.Scan makes them, because rows.Scan closes the rows at its first
// error, and the rest of the batch would be lost with it.
func messages(m *pgtype.Map, rows pgx.Rows, msgs []Message) (_ []Message, bad map[uuid.UUID]error, _ error) {
	defer rows.Close()
	var (
		e           events.Envelope
		payload     []byte
		traceparent string
		occurredAt  pgtype.Timestamptz
	)
	dest := [...]any{pgid.Scan(&e.EventID), &e.AggregateID, &e.AggregateVersion, &e.EventType, &payload, &traceparent, &occurredAt}
	var plans [len(dest)]pgtype.ScanPlan
	fail := func(err error) {
		if bad == nil {
			bad = map[uuid.UUID]error{}
		}
		bad[e.EventID] = err
	}
	for first := true; rows.Next(); first = false {
		fields, raw := rows.FieldDescriptions(), rows.RawValues()
		if len(fields) != len(dest) || len(raw) != len(dest) {
			return nil, nil, fmt.Errorf("the claim returned %d columns, want %d", len(raw), len(dest))
		}
		if first {
			for i, f := range fields {
				plans[i] = m.PlanScan(f.DataTypeOID, f.Format, dest[i])
			}
		}
		if err := plans[0].Scan(raw[0], dest[0]); err != nil {
			return nil, nil, fmt.Errorf("cannot read the id of a claimed row: %w", err)
		}
		var err error
		for i := 1; i < len(dest) && err == nil; i++ {
			if err = plans[i].Scan(raw[i], dest[i]); err != nil {
				err = fmt.Errorf("cannot read the row: column %s: %w", fields[i].Name, err)
			}
		}
		if err == nil && (!occurredAt.Valid || occurredAt.InfinityModifier != pgtype.Finite) {
			err = fmt.Errorf("cannot read the row: occurred_at is %s, not a time", occurredAt.InfinityModifier)
		}
		if err != nil {
			fail(err)
			continue
		}
		e.OccurredAt, e.Payload = occurredAt.Time.UTC(), payload
		attrs := attributes(e.EventID.String(), e.EventType, traceparent)
		body, err := e.AppendJSON(make([]byte, 0, envelopeOverhead+len(payload)))
		if err != nil {
			err = fmt.Errorf("cannot encode the envelope (occurred_at %s): %w", e.OccurredAt.Format(time.RFC3339Nano), err)
		} else {
			body = events.EscapeForSQS(body)
			err = tooLarge(e, len(body)+attributesBytes(e.EventType, traceparent))
		}
		if err != nil {
			fail(err)
			continue
		}
		msgs = append(msgs, Message{EventID: e.EventID, Body: body, Attributes: attrs})
	}
	return msgs, bad, rows.Err()
}

// envelopeOverhead is room for an envelope's fields besides its payload,
// so that a body is built in one allocation.
const envelopeOverhead = 256

// rollback ends conn's transaction, if any; if it cannot, the pool closes
// the connection on release, which ends it too.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
}

// markSQL records the published rows of a batch, still locked by its claim.
const markSQL = `UPDATE outbox SET published_at = now(), attempts = attempts + 1, claimed_until = NULL, last_error = NULL
		WHERE id = ANY($1) AND published_at IS NULL`

// deleteSQL is markSQL under DeleteOnPublish: the rows leave the table
// instead. published_at IS NULL keeps a row marked before the switch for
// the cleanup, as markSQL leaves it alone.
const deleteSQL = `DELETE FROM outbox WHERE id = ANY($1) AND published_at IS NULL`

// rescheduleSQL is assembled once, from constants: the retry policy's
// schedule as SQL over the row's attempts, this failure included, every
// value a parameter. The backoff runs from clock_timestamp(), the end of
// the publish: it runs in the claim's transaction, whose now() is when the
// claim began, and a publish slower than the backoff would leave the row
// due at once.
var rescheduleSQL = `
		UPDATE outbox o SET attempts = o.attempts + 1, claimed_until = NULL, last_error = f.reason,
		       next_attempt_at = clock_timestamp() + make_interval(secs => ` + retry.SQL("o.attempts + 1", "$4", "$3", "$5") + `)
		FROM unnest($1::uuid[], $2::text[]) AS f(id, reason)
		WHERE o.id = f.id AND o.published_at IS NULL`

// maxReason bounds a stored last_error, in bytes.
const maxReason = 2048

// reason is err's text as last_error stores it: valid UTF-8 (each invalid
// sequence a U+FFFD), without NUL (PostgreSQL's text holds neither, and
// a refused one would fail the whole batch's mark), and at most maxReason
// bytes, cut at a character. Any Publisher's error, and any row's own,
// is stored through it.
func reason(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if len(s) <= maxReason {
		return s
	}
	cut := maxReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// finish records the outcome of a batch and commits its transaction, in one
// round trip (each failure's reason cleaned by reason, so that no error
// text can fail it): one UPDATE for all the published rows, one for all the failed
// ones (each failure gets its own backoff from its attempt count). If that
// fails, the transaction is gone with its locks, and the failed rows are
// rescheduled once more on their own: left as they were, they would be
// claimed again at once, with no backoff. The published rows are then
// sent again by a later claim (at least once; consumers deduplicate).
// The ids are [16]byte, which pgx encodes as they are (see pgid).
func (r *Relay) finish(ctx context.Context, conn *pgx.Conn, ok [][16]byte, failed map[uuid.UUID]error) error {
	ids := make([][16]byte, 0, len(failed))
	reasons := make([]string, 0, len(failed))
	for id, err := range failed {
		ids = append(ids, id)
		reasons = append(reasons, reason(err))
	}
	b := &pgx.Batch{}
	var published int64
	if len(ok) > 0 {
		sql := markSQL
		if r.cfg.DeleteOnPublish {
			sql = deleteSQL
		}
		b.Queue(sql, ok).Exec(func(tag pgconn.CommandTag) error {
			published = tag.RowsAffected()
			return nil
		})
	}
	reschedule := []any{ids, reasons, r.cfg.RetryMax.Seconds(), r.cfg.RetryBase.Seconds(), retry.JitterDefault}
	if len(ids) > 0 {
		b.Queue(rescheduleSQL, reschedule...)
	}
	b.Queue(`COMMIT`)
	err := conn.SendBatch(ctx, b).Close()
	if err == nil && conn.PgConn().TxStatus() != 'I' {
		err = errors.New("the transaction did not commit")
	}
	if err == nil {
		r.published.Add(ctx, published)
		r.failures.Add(ctx, int64(len(ids)))
		return nil
	}
	rollback(ctx, conn)
	what := "mark published"
	if len(ok) == 0 {
		what = "reschedule failed rows"
	}
	err = fmt.Errorf("outbox: %s: %w", what, err)
	if len(ids) == 0 {
		return err
	}
	// On a context of its own: when the mark ran out of MarkTimeout, ctx
	// has too, and the failed rows would stay due at once.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	if _, rerr := r.pool.Exec(rctx, rescheduleSQL, reschedule...); rerr != nil {
		return errors.Join(err, fmt.Errorf("outbox: reschedule failed rows: %w", rerr))
	}
	r.failures.Add(ctx, int64(len(ids)))
	return err
}

// OldestUnpublishedAge is how long the oldest unpublished row has waited
// (0 when none waits).
func (r *Relay) OldestUnpublishedAge(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := r.pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM outbox WHERE published_at IS NULL`).Scan(&secs)
	return time.Duration(secs * float64(time.Second)), err
}

// listen turns notifications on the 'outbox' channel into wake-ups. It
// holds one dedicated connection (LISTEN is per session, so a pooled
// connection would lose it) and reconnects with backoff when it breaks.
func (r *Relay) listen(ctx context.Context, wake *worker.Signal) {
	const minDelay = 100 * time.Millisecond
	delay := minDelay
	for ctx.Err() == nil {
		listening, err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if listening {
			delay = minDelay // it worked for a while: a fresh failure, not a run of them
		}
		r.log.Warn("outbox LISTEN connection lost; polling continues, reconnecting", "error", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, 10*time.Second)
	}
}

// listenOnce holds one LISTEN session until it breaks; listening reports
// whether LISTEN was established at all.
func (r *Relay) listenOnce(ctx context.Context, wake *worker.Signal) (listening bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN outbox"); err != nil {
		return false, err
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		wake.Notify()
	}
}

func (r *Relay) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := r.Cleanup(ctx); err != nil {
				r.log.Error("outbox cleanup failed", "error", err)
			} else if n > 0 {
				r.log.Info("outbox cleanup", "deleted", n)
			}
		}
	}
}

// Cleanup deletes rows published more than KeepPublished ago, in chunks so
// that no single statement holds many locks, and returns how many it deleted.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, `DELETE FROM outbox WHERE id IN (
			SELECT id FROM outbox WHERE published_at < now() - $1::interval LIMIT 1000)`, r.cfg.KeepPublished)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Relay]().PkgPath()
