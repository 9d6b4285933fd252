package idempotent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MaintainerConfig tunes a Maintainer. Zero values take the defaults in brackets.
type MaintainerConfig struct {
	// Retention is the dedupe window [DefaultRetention]; use the value the
	// Consumers and Inboxes of this database use. QueueRetention is the
	// longest the queues keep a message [DefaultQueueRetention]:
	// NewMaintainer refuses a Retention that does not exceed it by a day.
	Retention, QueueRetention time.Duration
	// PartitionsAhead is how many future days of processed_messages
	// partitions to keep ready [DefaultPartitionsAhead].
	PartitionsAhead int
	// Interval is how often Run does a round [1h].
	Interval time.Duration
	// LockTimeout bounds how long creating or dropping a partition waits for
	// its lock [2s]. Both need an ACCESS EXCLUSIVE lock on processed_messages,
	// which queues behind every open transaction that touched the table, and
	// while it waits every new insert queues behind it. Failing fast and
	// trying again next round costs nothing (partitions exist days ahead); a
	// long wait would stall the consumers.
	LockTimeout time.Duration
	// DeleteBatch is how many DONE inbox rows one DELETE removes [5000].
	DeleteBatch int
	// Logger [slog.Default()]; MeterProvider [otel.GetMeterProvider()].
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	// Now is the clock [time.Now]; tests inject one to age the data.
	Now func() time.Time
}

func (c *MaintainerConfig) defaults() {
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.QueueRetention <= 0 {
		c.QueueRetention = DefaultQueueRetention
	}
	if c.PartitionsAhead <= 0 {
		c.PartitionsAhead = DefaultPartitionsAhead
	}
	if c.Interval <= 0 {
		c.Interval = time.Hour
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 2 * time.Second
	}
	if c.DeleteBatch <= 0 {
		c.DeleteBatch = 5000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Maintainer keeps the dedupe state of one database inside its retention
// window, so that it is remembered exactly as long as a copy can come back:
//   - it creates the daily partitions of processed_messages ahead of time;
//   - it drops the partitions whose whole day is older than the window by
//     more than ClockSkewMargin (DROP TABLE: instant, no dead rows; never a
//     DELETE);
//   - it deletes DONE inbox rows whose event id (UUIDv7) was minted more
//     than ClockSkewMargin before the window, in batches. A copy of such an
//     event is refused by the same rule at receive time (ErrExpired), on a
//     clock that may lag this host's by anything under the margin, so
//     forgetting the row cannot let it be applied twice. PENDING and
//     FAILED rows are never deleted: a FAILED row waits for an operator
//     however old it is.
//
// Every replica may run one: the steps are idempotent and tolerate racing.
// It uses its own single connection (with LockTimeout set), apart from the
// application's pool.
type Maintainer struct {
	pool *pgxpool.Pool
	cfg  MaintainerConfig
	log  *slog.Logger

	errorsTotal, droppedTotal, deletedTotal metric.Int64Counter
}

// MaintenanceReport is what one round did.
type MaintenanceReport struct {
	Created      []string // partitions created
	Dropped      []string // partitions dropped
	InboxDeleted int64    // DONE inbox rows deleted
}

// NewMaintainer returns a Maintainer for the database pool connects to. It
// validates the retention against the queue retention. Close it when done.
func NewMaintainer(pool *pgxpool.Pool, cfg MaintainerConfig) (*Maintainer, error) {
	if pool == nil {
		return nil, errors.New("idempotent: NewMaintainer needs a pool")
	}
	cfg.defaults()
	if err := ValidateRetention(cfg.Retention, cfg.QueueRetention); err != nil {
		return nil, err
	}
	pc := pool.Config()
	pc.MinConns, pc.MinIdleConns, pc.MaxConns = 0, 0, 1
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	pc.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)
	own, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("idempotent: maintainer pool: %w", err)
	}
	m := &Maintainer{pool: own, cfg: cfg, log: cfg.Logger}
	meter := cfg.MeterProvider.Meter(meterName)
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&m.errorsTotal, "idempotent_maintenance_errors_total", "Failed retention maintenance steps, by step; alert when it keeps rising (partitions run out after PartitionsAhead days)."},
		{&m.droppedTotal, "idempotent_partitions_dropped_total", "processed_messages partitions dropped for being older than the retention."},
		{&m.deletedTotal, "inbox_cleaned_total", "DONE inbox rows deleted for being older than the retention."},
	} {
		if *c.dst, err = meter.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			own.Close()
			return nil, err
		}
	}
	return m, nil
}

// Close releases the Maintainer's connection.
func (m *Maintainer) Close() { m.pool.Close() }

// Run does a round at once and then every Interval until ctx is cancelled;
// it returns nil then. A failed step is logged and counted and tried again
// next round.
func (m *Maintainer) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		_, _ = m.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RunOnce does one round: create partitions ahead, drop expired partitions,
// delete expired DONE inbox rows. Each step runs even if an earlier one
// failed; the error joins the steps' errors.
func (m *Maintainer) RunOnce(ctx context.Context) (MaintenanceReport, error) {
	now := m.cfg.Now()
	var rep MaintenanceReport
	var errs []error
	step := func(name string, err error) {
		if err == nil {
			return
		}
		errs = append(errs, err)
		m.errorsTotal.Add(ctx, 1, metric.WithAttributes(attribute.String("step", name)))
		if lockTimedOut(err) {
			m.log.WarnContext(ctx, "idempotent maintenance: lock not granted within LockTimeout; trying again next round",
				"step", name, "error", err)
			return
		}
		m.log.ErrorContext(ctx, "idempotent maintenance step failed", "step", name, "error", err)
	}
	// ensurePartitionsAt lists every name in the range, existing or not
	// (CREATE TABLE IF NOT EXISTS succeeds either way), so report only the
	// names that were not there before.
	existing, err := m.partitionSet(ctx)
	step("list_partitions", err)
	names, err := ensurePartitionsAt(ctx, m.pool, now, m.cfg.Retention, m.cfg.PartitionsAhead)
	for _, n := range names {
		if existing != nil && !existing[n] {
			rep.Created = append(rep.Created, n)
		}
	}
	step("create_partitions", err)
	rep.Dropped, err = dropExpiredAt(ctx, m.pool, now, m.cfg.Retention)
	m.droppedTotal.Add(ctx, int64(len(rep.Dropped)))
	step("drop_partitions", err)
	rep.InboxDeleted, err = m.cleanInbox(ctx, now)
	m.deletedTotal.Add(ctx, rep.InboxDeleted)
	step("clean_inbox", err)
	if len(rep.Created)+len(rep.Dropped) > 0 || rep.InboxDeleted > 0 {
		m.log.InfoContext(ctx, "idempotent maintenance",
			"partitions_created", rep.Created, "partitions_dropped", rep.Dropped,
			"inbox_done_deleted", rep.InboxDeleted, "retention", m.cfg.Retention)
	}
	return rep, errors.Join(errs...)
}

func (m *Maintainer) partitionSet(ctx context.Context) (map[string]bool, error) {
	rows, err := m.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'processed_messages'`)
	if err != nil {
		return nil, fmt.Errorf("idempotent: list partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("idempotent: list partitions: %w", err)
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set, nil
}

// cleanInbox deletes the DONE rows whose event id predates the window by
// ClockSkewMargin, one consumer and one batch at a time, walking the
// primary key range (consumer, message_id < horizon): no extra index, no
// long statement.
func (m *Maintainer) cleanInbox(ctx context.Context, now time.Time) (int64, error) {
	horizon := uuidAt(now.Add(-m.cfg.Retention - ClockSkewMargin))
	rows, err := m.pool.Query(ctx, `WITH RECURSIVE c AS (
			(SELECT consumer FROM inbox ORDER BY consumer LIMIT 1)
			UNION ALL
			SELECT (SELECT consumer FROM inbox WHERE consumer > c.consumer ORDER BY consumer LIMIT 1)
			  FROM c WHERE c.consumer IS NOT NULL)
		SELECT consumer FROM c WHERE consumer IS NOT NULL`)
	if err != nil {
		return 0, fmt.Errorf("idempotent: clean inbox: list consumers: %w", err)
	}
	consumers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("idempotent: clean inbox: list consumers: %w", err)
	}
	var total int64
	for _, consumer := range consumers {
		for {
			tag, err := m.pool.Exec(ctx, `DELETE FROM inbox WHERE ctid = ANY(ARRAY(
					SELECT ctid FROM inbox
					 WHERE consumer = $1 AND message_id < $2 AND status = 'DONE'
					 LIMIT $3))
				AND status = 'DONE'`, consumer, horizon, m.cfg.DeleteBatch)
			if err != nil {
				return total, fmt.Errorf("idempotent: clean inbox of %s: %w", consumer, err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(m.cfg.DeleteBatch) {
				break
			}
		}
	}
	return total, nil
}

func lockTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
}
