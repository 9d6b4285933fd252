package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
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
// assumed accepted. pkg/sqstransport.Publisher implements it with
// SendMessageBatch.
type Publisher interface {
	PublishBatch(ctx context.Context, msgs []Message) (failed map[uuid.UUID]error, err error)
}

// RelayConfig tunes a Relay. Zero values take the defaults in brackets.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes [100]. The publisher splits
	// them into SQS batches of 10 and sends those concurrently.
	BatchSize int
	// Workers is how many claim-publish-mark loops run in this process [2],
	// so one batch is being claimed while another is on the wire.
	Workers int
	// PollInterval is the fallback when no notification arrives [500ms].
	PollInterval time.Duration
	// Lease is how long a claim is held before another relay may take the
	// row over [30s]. Keep it well above the slowest publish: a lease that
	// runs out mid-publish only causes a duplicate send, never a loss.
	Lease time.Duration
	// PublishTimeout bounds one batch's publish [Lease/2]; it must be less
	// than Lease. A message still unsent when it runs out counts as failed
	// and is rescheduled by backoff, and the rest of the batch is marked,
	// while the claim still holds: a publish allowed the whole lease would
	// leave nothing to mark in, and the batch would be claimed and sent
	// again at every lease expiry.
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

// Relay publishes committed outbox rows. Any number of relays, in one
// process or many, may run against the same table: each claim is a single
// short READ COMMITTED statement that leases rows with FOR UPDATE SKIP
// LOCKED, so replicas never wait on each other nor fail to serialise. A row
// is marked published only after the publisher accepted it; a relay that
// dies in between leaves the lease to expire and the row is sent again.
type Relay struct {
	pool *pgxpool.Pool
	pub  Publisher
	cfg  RelayConfig
	log  *slog.Logger

	published, failures metric.Int64Counter
	backlog             *snapshot.Cache[backlog]
	gauges              metric.Registration
	closeOnce           sync.Once
}

// backlog is what the gauges export.
type backlog struct {
	unpublished int64
	oldest      float64 // seconds
}

// NewRelay returns a relay that publishes the outbox of pool through pub.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg RelayConfig) (*Relay, error) {
	cfg.defaults()
	if cfg.PublishTimeout >= cfg.Lease {
		return nil, fmt.Errorf("outbox: PublishTimeout %v must be less than Lease %v: the batch must be marked while its claim holds",
			cfg.PublishTimeout, cfg.Lease)
	}
	r := &Relay{pool: pool, pub: pub, cfg: cfg, log: cfg.Logger}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter("github.com/effectively-once/payments-cashback/pkg/outbox")
	var err error
	if r.published, err = m.Int64Counter("outbox_published_total", metric.WithDescription("Outbox rows published and marked.")); err != nil {
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
// rows, walked in the order of the outbox_unpublished index.
func (r *Relay) readBacklog(ctx context.Context) (backlog, error) {
	var b backlog
	err := r.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM (SELECT created_at FROM outbox WHERE published_at IS NULL ORDER BY next_attempt_at, id LIMIT $1) s`,
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
// duplicate sends. Run returns nil on cancellation.
//
// Its Workers loops are pkg/worker loops named "outbox-relay": a full batch
// is followed at once by the next claim; otherwise a loop sleeps until a
// NOTIFY on the 'outbox' channel or PollInterval. While the database or the
// queue is unreachable the sleep doubles from PollInterval up to 30 s, so
// an outage is not flooded with claims (or, for the queue, with rows
// claimed only to fail).
func (r *Relay) Run(ctx context.Context) error {
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
	if err == nil && outage.Unavailable(pubErr) {
		// Not a failure of the relay's (the rows are rescheduled), but the
		// loop must back off as for one.
		err = fmt.Errorf("outbox: queue unreachable, batch of %d rescheduled: %w", n, pubErr)
	}
	return n, err == nil && n == r.cfg.BatchSize, err
}

// backoff is the sleep after a failed pass: PollInterval, doubling from it
// (at least 100ms) up to 30 s while the failures are outages.
func (r *Relay) backoff(failures int, err error) time.Duration {
	if !outage.Unavailable(err) {
		return r.cfg.PollInterval
	}
	return min(max(r.cfg.PollInterval, 100*time.Millisecond)<<min(failures, 10), 30*time.Second)
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
func (r *Relay) relayOnce(ctx context.Context) (n int, pubErr, err error) {
	msgs, err := r.claim(ctx)
	if err != nil || len(msgs) == 0 {
		return 0, nil, err
	}
	// Once claimed, finish the batch even if ctx is cancelled meanwhile:
	// marking what was sent avoids re-sending it after a clean shutdown.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	failed, pubErr := r.pub.PublishBatch(pctx, msgs)
	cancel()
	if pubErr != nil {
		failed = make(map[uuid.UUID]error, len(msgs))
		for _, m := range msgs {
			failed[m.EventID] = pubErr
		}
	}
	if pubErr == nil && len(failed) == len(msgs) {
		for _, e := range failed { // every message failed: the queue, not the messages, is the likely cause
			pubErr = e
			break
		}
	}
	if failpoint.Hit(failpoint.AfterPublishBeforeMark) {
		return len(msgs), pubErr, errCrashed
	}
	ok := make([]uuid.UUID, 0, len(msgs))
	for _, m := range msgs {
		if _, bad := failed[m.EventID]; !bad {
			ok = append(ok, m.EventID)
		}
	}
	// A fresh context: the publish may have used up its own.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	if err := r.mark(mctx, ok, failed); err != nil {
		return len(msgs), pubErr, err
	}
	return len(msgs), pubErr, nil
}

type row struct {
	ID               uuid.UUID
	AggregateID      string
	AggregateVersion int64
	EventType        string
	Payload          []byte
	Headers          map[string]string
	OccurredAt       time.Time
}

// claim leases up to BatchSize due rows in one autocommitted statement.
func (r *Relay) claim(ctx context.Context) ([]Message, error) {
	rows, err := r.pool.Query(ctx, `
		UPDATE outbox SET claimed_until = now() + $2::interval, attempts = attempts + 1
		WHERE id IN (
			SELECT id FROM outbox
			WHERE published_at IS NULL AND next_attempt_at <= now()
			  AND (claimed_until IS NULL OR claimed_until < now())
			ORDER BY next_attempt_at, id
			LIMIT $1
			FOR UPDATE SKIP LOCKED)
		RETURNING id, aggregate_id, aggregate_version, event_type, payload, headers, occurred_at`,
		r.cfg.BatchSize, r.cfg.Lease)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	msgs := make([]Message, 0, len(claimed))
	for _, c := range claimed {
		env := events.Envelope{EventID: c.ID, EventType: c.EventType, AggregateID: c.AggregateID,
			AggregateVersion: c.AggregateVersion, OccurredAt: c.OccurredAt.UTC(), Payload: json.RawMessage(c.Payload)}
		body, err := json.Marshal(env)
		if err != nil {
			return nil, err
		}
		attrs := map[string]string{"event_id": c.ID.String(), "event_type": c.EventType}
		if tp := c.Headers["traceparent"]; tp != "" {
			attrs["traceparent"] = tp
		}
		msgs = append(msgs, Message{EventID: c.ID, Body: body, Attributes: attrs})
	}
	return msgs, nil
}

// mark records the outcome of a batch: one UPDATE for all the published
// rows, one for all the failed ones (each failure gets its own backoff from
// its attempt count). Each runs whatever became of the other: failed rows
// left unscheduled would come back at the end of the lease with no backoff.
func (r *Relay) mark(ctx context.Context, ok []uuid.UUID, failed map[uuid.UUID]error) error {
	var errPublished error
	if len(ok) > 0 {
		tag, err := r.pool.Exec(ctx, `UPDATE outbox SET published_at = now(), claimed_until = NULL, last_error = NULL
			WHERE id = ANY($1) AND published_at IS NULL`, ok)
		if err != nil {
			errPublished = fmt.Errorf("outbox: mark published: %w", err)
		} else {
			r.published.Add(ctx, tag.RowsAffected())
		}
	}
	return errors.Join(errPublished, r.reschedule(ctx, failed))
}

// rescheduleSQL is assembled once, from constants: the retry policy's
// schedule as SQL over the row's attempts, every value a parameter.
var rescheduleSQL = `
		UPDATE outbox o SET claimed_until = NULL, last_error = f.reason,
		       next_attempt_at = now() + make_interval(secs => ` + retry.SQL("o.attempts", "$4", "$3", "$5") + `)
		FROM unnest($1::uuid[], $2::text[]) AS f(id, reason)
		WHERE o.id = f.id AND o.published_at IS NULL`

// reschedule sets the failed rows' next attempt by backoff and releases
// their claim.
func (r *Relay) reschedule(ctx context.Context, failed map[uuid.UUID]error) error {
	if len(failed) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, 0, len(failed))
	reasons := make([]string, 0, len(failed))
	for id, err := range failed {
		ids = append(ids, id)
		reasons = append(reasons, err.Error())
		r.log.Warn("outbox publish failed: rescheduled", "event_id", id, "error", err)
	}
	_, err := r.pool.Exec(ctx, rescheduleSQL, ids, reasons, r.cfg.RetryMax.Seconds(), r.cfg.RetryBase.Seconds(), retry.JitterDefault)
	if err != nil {
		return fmt.Errorf("outbox: reschedule failed rows: %w", err)
	}
	r.failures.Add(ctx, int64(len(ids)))
	return nil
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
