package idempotent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
	"github.com/effectively-once/payments-cashback/pkg/retry"
	"github.com/effectively-once/payments-cashback/pkg/worker"
)

// ProcessFunc applies one stored event. Like an Effect it must do its work
// through tx only: tx belongs to the transaction that also marks the row
// DONE, so the effect and the DONE mark commit together or not at all. It
// may run more than once for the same event (after an error, a crash, or a
// lost connection), but never twice at the same time and never again once
// the row is DONE. It must not Commit or Rollback tx (those return an
// error); return an error to undo its writes.
//
// A returned error counts the attempt and schedules the next one by
// backoff; an error marked permanent (Permanent, or any Permanent() bool
// method returning true) fails the row at once. A panic counts as an error.
type ProcessFunc func(ctx context.Context, tx pgx.Tx, e events.Envelope) error

// ProcessorConfig tunes a Processor. Zero values take the defaults in brackets.
type ProcessorConfig struct {
	// Workers is how many claim-apply loops run in this process [1].
	// Replicas add their own; rows never run twice at once whatever the total.
	Workers int
	// BatchSize is how many rows (heads of distinct keys) one claim takes
	// [10]. They are applied in one transaction, one savepoint each, so one
	// COMMIT covers the batch; a slow handler delays its batch-mates' commit,
	// so use a small BatchSize when handlers are slow.
	BatchSize int
	// PollInterval is how long an idle worker sleeps before looking again
	// [500ms]. Rows stored through this process's Inbox wake a worker at once.
	PollInterval time.Duration
	// MaxAttempts is how many attempts a row gets before it is FAILED [10].
	MaxAttempts int
	// RetryBase and RetryMax shape the backoff [retry.BaseDefault, 10m]:
	// after attempt n the row waits the retry package's schedule,
	// min(RetryMax, RetryBase*2^(n-1)) jittered by ±25%.
	RetryBase, RetryMax time.Duration
	// ClaimHold is the least time a claimed row stays out of other claims
	// [5s]: the claim pushes next_attempt_at forward by the larger of
	// ClaimHold and the attempt's backoff, which covers the moment between
	// the claim's commit and the apply transaction's row lock, and is how
	// long a row whose processor died waits before it runs again. It does
	// not limit how long a handler may run: the row lock does that.
	ClaimHold time.Duration
	// ReorderWindow holds a key's head back until it has been in the inbox
	// this long [0]: two events of a key that arrive out of order less than
	// ReorderWindow apart are still applied in order, at the price of that
	// much latency.
	ReorderWindow time.Duration
	// ShutdownGrace bounds how long a batch in progress may run on after
	// Run's context is cancelled [30s]; past it the batch is rolled back and
	// its rows retried later.
	ShutdownGrace time.Duration
	// HandlerTimeout is each row's handler deadline [30s]. Past it the
	// handler's context is cancelled: its writes roll back to the row's
	// savepoint, the row is retried by backoff like any failure, and the
	// timeout is counted (inbox_handler_timeouts_total). A cancel in the
	// middle of a statement (a lock wait, a slow query) closes the
	// connection, and the batch's transaction is lost with it: then only
	// the row that hung is charged the attempt, and the others run again
	// at once. Without it a hung
	// handler would hold its worker, its connection and its key for good.
	HandlerTimeout time.Duration
	// Pool is where the apply transactions run [the Inbox's pool]. Each
	// worker holds one connection for as long as its handlers run, so on a
	// shared pool slow handlers take connections Receive needs to ack within
	// milliseconds: NewProcessor refuses a shared pool whose MaxConns the
	// workers would use up. Give the processor a pool of its own (Workers
	// connections and one for the claim) to keep the two apart.
	Pool *pgxpool.Pool
	// AfterCommit, when set, is called after each batch that applied rows
	// commits, with the ids of those rows (their handlers returned nil), on
	// the worker's goroutine: keep it short. For what must follow the
	// commit, never precede it: waking a worker that acts on what the
	// handlers wrote (notifications' SMS sender, through a worker.Signal)
	// rather than leaving it to its next poll, or a latency measured to the
	// effect's commit. A crash between the commit and the call loses the
	// call, not the effects.
	AfterCommit func(applied []uuid.UUID)
	// Logger [the Inbox's].
	Logger *slog.Logger
}

func (c *ProcessorConfig) defaults(in *Inbox) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Workers <= 0 {
		c.Workers = 1
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 10
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 10
	}
	def(&c.PollInterval, 500*time.Millisecond)
	def(&c.RetryBase, retry.BaseDefault)
	def(&c.RetryMax, 10*time.Minute)
	def(&c.ShutdownGrace, 30*time.Second)
	def(&c.ClaimHold, 5*time.Second)
	def(&c.HandlerTimeout, 30*time.Second)
	if c.ReorderWindow < 0 {
		c.ReorderWindow = 0
	}
	if c.Logger == nil {
		c.Logger = in.log
	}
	if c.Pool == nil {
		c.Pool = in.pool
	}
}

// Processor applies an Inbox's stored rows.
//
// # Order
//
// Rows that share an ordering key are applied one at a time in the order
// (aggregate_version, occurred_at, event_id), not in arrival order: only a
// key's head, its first row that is not DONE, may run, and the next row of
// the key becomes the head only when the head's DONE commits. Different keys
// run in parallel, across workers and replicas.
//
// "One at a time" holds even when a lower version arrives while a higher
// one runs (v2 in its handler, then v1 is stored and becomes the head): a
// key is busy while any attempt of it runs, and busy keys are not claimed.
// Busy is a transaction-level advisory lock on the key's hash, taken by the
// apply transaction before it locks its rows and released by its commit or
// rollback (or the death of its session), and tested by the claim with
// pg_try_advisory_xact_lock, the key-level analogue of SKIP LOCKED. Row
// locks cannot say it: v1's row is not locked, v2's is. A lock table would
// need a row per key and its cleanup; the advisory lock needs neither, and
// works through PgBouncer in transaction mode. Consequences, by design:
//   - a FAILED row blocks the rest of its key (applying them would break the
//     order) until an operator replays it; inbox_failed and `inboxctl failed`
//     (with its BLOCKED column) show it;
//   - a PENDING head waiting for its backoff holds back its key too;
//   - order is among the rows present: a row that arrives after a later row
//     of its key was already applied (a v1 stored after v2 is DONE) is still
//     applied, late. The inbox cannot un-apply v2, so the handler's version
//     check (a versioned write, rule 5 of docs/design.md) must make the stale v1 a no-op.
//     ReorderWindow narrows that case for events that arrive close together.
//
// # Claims
//
// An attempt is two transactions:
//
//	claim  (one autocommitted statement): pick due heads FOR UPDATE SKIP LOCKED,
//	       attempts+1, next_attempt_at = now + max(ClaimHold, backoff);
//	       COMMIT, not waiting for its WAL flush (claimAsyncCommitSQL)
//	apply  BEGIN; lock the batch's keys (advisory); lock the claimed rows
//	       (only if attempts still matches);
//	       per row: SAVEPOINT, handler, RELEASE or ROLLBACK TO;
//	       one UPDATE: DONE | PENDING with the next backoff | FAILED; COMMIT
//
// The claim is held by the apply transaction's row locks, and the
// pushed-forward next_attempt_at is the lease of a claim whose processor
// has died. Hence:
//   - a crash or lost connection at any point rolls back the effect (the
//     apply transaction dies with its session) but keeps the counted
//     attempt. The row is retried once next_attempt_at passes, with no
//     rescuer process: the lease expires by itself. A row that keeps
//     killing its processor ends FAILED after MaxAttempts instead of
//     looping forever;
//   - running work is never replayed, however slow the handler: while it
//     runs, its apply transaction holds the row lock, so a claim that finds
//     the row due again (its lease ran out) skips it, and an apply that
//     finds attempts changed (someone claimed the row before it was locked)
//     drops it. The classic lease trade-off, "a lease shorter than the
//     slowest handler replays running work", does not arise;
//   - attempts counts every attempt that started, the successful one too: a
//     handler that fails 3 times and then succeeds leaves attempts = 4.
//
// Why this and not the alternatives: row locks alone (claim and apply in one
// transaction) would roll the attempt count back with a crash, so a message
// that kills its processor would loop uncounted forever; an IN_PROGRESS
// status with a lease needs a rescuer and a lease longer than the slowest
// handler, or it runs work twice. The price here is one more commit per
// batch (the claim's), and that a worker holds one connection and an open
// transaction while its handlers run, which the effect's own transaction
// needs anyway. Keep the handlers' external calls short, or give the
// processor its own pool (ProcessorConfig.Pool).
//
// A claim costs one index probe per key it walks past (see walkSQL): cheap
// while heads are due, but when every head is backing off (an outage) each
// idle poll walks every key with a backlog. PollInterval bounds that cost.
type Processor struct {
	in      *Inbox
	handler ProcessFunc
	cfg     ProcessorConfig
	log     *slog.Logger
	tracer  trace.Tracer

	onceMu     sync.Mutex
	onceCursor string // ProcessOnce's place in the key walk
}

// NewProcessor returns a Processor that applies this inbox's rows with h.
func (in *Inbox) NewProcessor(h ProcessFunc, cfg ProcessorConfig) (*Processor, error) {
	if h == nil {
		return nil, errors.New("idempotent: inbox processor needs a handler")
	}
	cfg.defaults(in)
	if cfg.Pool == in.pool {
		in.mu.Lock()
		defer in.mu.Unlock()
		if conns := int(in.pool.Config().MaxConns); in.sharedWorkers+cfg.Workers >= conns {
			return nil, fmt.Errorf("idempotent: inbox %s: %d processor workers on the receiving pool of %d connections "+
				"would leave Receive none while handlers run: set ProcessorConfig.Pool or a larger MaxConns",
				in.consumer, in.sharedWorkers+cfg.Workers, conns)
		}
		in.sharedWorkers += cfg.Workers
	}
	return &Processor{in: in, handler: h, cfg: cfg, log: cfg.Logger, tracer: otel.Tracer(meterName)}, nil
}

// Run applies rows until ctx is cancelled, then lets the batches in progress
// finish (up to ShutdownGrace; after it they are rolled back and retried)
// and returns nil. Its Workers loops are pkg/worker loops named
// "inbox-processor:<consumer>", woken by every row this process's Inbox
// stores and polling every PollInterval for the rest.
func (p *Processor) Run(ctx context.Context) error {
	cursors := make([]string, p.cfg.Workers) // one claim cursor per loop
	return worker.Run(ctx, worker.Config{
		Name: "inbox-processor:" + p.in.consumer, Workers: p.cfg.Workers, PollInterval: p.cfg.PollInterval,
		Wake: &p.in.stored, Grace: p.cfg.ShutdownGrace, Logger: p.log, MeterProvider: p.in.cfg.MeterProvider,
	}, func(ctx context.Context, i int) (int, bool, error) {
		n, err := p.once(ctx, &cursors[i])
		if err == nil && n == p.cfg.BatchSize {
			// A full batch: there is probably more, for an idle sibling too.
			p.in.stored.Notify()
		}
		// Any rows: the ones behind this batch's heads may be due now.
		return n, err == nil && n > 0, err
	})
}

// ProcessOnce claims and applies at most one batch and returns how many rows
// it claimed (0: nothing was due). Run calls it in a loop; tests and tools
// may call it directly.
func (p *Processor) ProcessOnce(ctx context.Context) (int, error) {
	p.onceMu.Lock()
	defer p.onceMu.Unlock()
	return p.once(ctx, &p.onceCursor)
}

// claimedRow is one row the claim statement returned.
type claimedRow struct {
	MessageID        uuid.UUID
	Status           string
	Attempts         int
	OrderingKey      string
	EventType        string
	AggregateID      string
	AggregateVersion int64
	OccurredAt       time.Time
	Payload          []byte
	Traceparent      *string
	LastError        *string
}

func (r *claimedRow) envelope() events.Envelope {
	return events.Envelope{EventID: r.MessageID, EventType: r.EventType, AggregateID: r.AggregateID,
		AggregateVersion: r.AggregateVersion, OccurredAt: r.OccurredAt.UTC(), Payload: json.RawMessage(r.Payload)}
}

func (p *Processor) once(ctx context.Context, cursor *string) (int, error) {
	rows, err := p.claim(ctx, *cursor)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	*cursor = nextCursor(*cursor, rows)
	live := make([]claimedRow, 0, len(rows))
	for _, r := range rows {
		if r.Status == "FAILED" {
			p.in.processed.Add(ctx, 1, metric.WithAttributes(p.in.attrConsumer, attribute.String("outcome", "failed")))
			p.log.Error("inbox row FAILED: its last attempt never finished (processor crashed or lost its connection); it blocks its key until replayed",
				"event_id", r.MessageID, "event_type", r.EventType, "ordering_key", r.OrderingKey, "attempts", r.Attempts)
			continue
		}
		live = append(live, r)
	}
	if len(live) > 0 {
		if err := p.apply(ctx, live); err != nil {
			return len(rows), err
		}
	}
	return len(rows), nil
}

// nextCursor is where the next walk starts: after the last key claimed, in
// the walk's circular order (keys after cursor first, then the wrap-around).
// Starting each claim where the last one stopped keeps the keys fair: under
// load, the keys that sort first cannot starve the others.
func nextCursor(cursor string, rows []claimedRow) string {
	var after, before string
	for _, r := range rows {
		k := r.OrderingKey
		if k > cursor {
			after = max(after, k)
		} else {
			before = max(before, k)
		}
	}
	if before != "" {
		return before
	}
	return after
}

// walkSQL is a loose index scan over inbox_unfinished: each step jumps from
// one key's head (its first unfinished row in apply order) straight to the
// next key's head, so a claim costs one index probe per key visited, however
// many rows wait behind each head. %[1]s names the walk, %[2]s bounds its
// keys.
const walkSQL = `%[1]s AS (
	(SELECT i.ordering_key, i.message_id, i.status, i.received_at, i.next_attempt_at
	   FROM inbox i
	  WHERE i.consumer = @consumer AND i.status IN ('PENDING', 'FAILED') AND %[2]s
	  ORDER BY i.ordering_key, i.aggregate_version, i.occurred_at, i.message_id
	  LIMIT 1)
	UNION ALL
	SELECT n.* FROM %[1]s h CROSS JOIN LATERAL (
	 SELECT i.ordering_key, i.message_id, i.status, i.received_at, i.next_attempt_at
	   FROM inbox i
	  WHERE i.consumer = @consumer AND i.status IN ('PENDING', 'FAILED') AND %[2]s
	    AND i.ordering_key > h.ordering_key
	  ORDER BY i.ordering_key, i.aggregate_version, i.occurred_at, i.message_id
	  LIMIT 1) n)`

// backoffSQL is now() plus the back-off after attempt %s: the retry
// package's schedule (min(RetryMax, RetryBase*2^(n-1)), jittered ±25%).
var backoffSQL = `clock_timestamp() + make_interval(secs => ` +
	retry.SQL("%s", "@retry_base", "@retry_max", strconv.FormatFloat(retry.JitterDefault, 'f', -1, 64)) + `)`

// keyLockSQL is the advisory lock key of the ordering key in the column
// ordering_key: a 64-bit hash seeded by the consumer, so that two
// consumers' keys do not share locks. A collision between two keys only
// makes them wait for each other now and then; it never lets two rows of
// one key run together.
const keyLockSQL = "hashtextextended(ordering_key, hashtext(@consumer::text))"

// lockKeysSQL takes the advisory locks of the keys @keys for the rest of
// the transaction, in hash order.
const lockKeysSQL = `SELECT pg_advisory_xact_lock(k) FROM (
	SELECT DISTINCT ` + keyLockSQL + ` AS k FROM unnest(@keys::text[]) AS ordering_key ORDER BY 1) s`

// claimSQL walks the heads from the cursor to the end (tail) and then from
// the start up to the cursor (front), keeps the due PENDING ones (a FAILED
// head, or one waiting for its backoff or its ReorderWindow, holds its key),
// locks them with SKIP LOCKED and counts the attempt. The due condition is
// repeated in "mine" so that a row another claim updated meanwhile is
// re-checked on its new version. A head whose key is busy (its advisory
// lock is held: an apply transaction of that key is running) is skipped;
// the CASE takes the lock only for heads that are otherwise due, and the
// claim's own hold on it ends with the statement. A head whose attempts are already
// exhausted was claimed by a processor that never finished: it turns FAILED
// here instead of running again.
var claimSQL = `WITH RECURSIVE ` +
	fmt.Sprintf(walkSQL, "tail", "i.ordering_key > @after") + `,
	` + fmt.Sprintf(walkSQL, "front", "i.ordering_key <= @after") + `,
due AS (
	SELECT message_id FROM (SELECT * FROM tail UNION ALL SELECT * FROM front) heads
	 WHERE CASE WHEN status = 'PENDING' AND next_attempt_at <= now() AND received_at <= now() - @reorder_window::interval
	            THEN pg_try_advisory_xact_lock(` + keyLockSQL + `)
	            ELSE false END
	 LIMIT @limit),
mine AS (
	SELECT i.message_id FROM inbox i
	 WHERE i.consumer = @consumer AND i.message_id IN (SELECT message_id FROM due)
	   AND i.status = 'PENDING' AND i.next_attempt_at <= now()
	 LIMIT @limit
	   FOR UPDATE SKIP LOCKED)
UPDATE inbox i SET
	attempts        = CASE WHEN i.attempts < @max_attempts THEN i.attempts + 1 ELSE i.attempts END,
	status          = CASE WHEN i.attempts < @max_attempts THEN 'PENDING' ELSE 'FAILED' END,
	last_attempt_at = CASE WHEN i.attempts < @max_attempts THEN now() ELSE i.last_attempt_at END,
	next_attempt_at = CASE WHEN i.attempts < @max_attempts
	                       THEN greatest(now() + @claim_hold::interval, ` + fmt.Sprintf(backoffSQL, "i.attempts + 1") + `)
	                       ELSE i.next_attempt_at END,
	last_error      = CASE WHEN i.attempts < @max_attempts THEN i.last_error
	                       ELSE format('attempt %s never finished (processor crashed or lost its connection); last error: %s',
	                                   i.attempts, coalesce(i.last_error, 'none')) END
FROM mine
WHERE i.consumer = @consumer AND i.message_id = mine.message_id
  AND ` + claimAsyncCommitSQL + `
RETURNING i.message_id, i.status, i.attempts, i.ordering_key, i.event_type, i.aggregate_id,
	i.aggregate_version, i.occurred_at, i.payload, i.traceparent, i.last_error`

// claimAsyncCommitSQL, a condition that is always true, sets
// synchronous_commit off for the rest of the claim's own transaction, for
// each row it claims: the claim's COMMIT then returns without waiting for
// its WAL flush (one fsync less between a stored row and its effect; the
// claim is what the apply transaction waits for). Nothing is lost by it:
//   - the apply transaction starts after the claim's commit, so its commit
//     record follows the claim's in the WAL, and its commit, synchronous,
//     flushes both (and waits for a synchronous standby for both). An
//     effect is never durable while its claim is not;
//   - a processor that dies leaves the claim to the server, which flushes
//     it within wal_writer_delay; only a crash of the server itself loses
//     a claim not yet flushed, and with it every apply that followed it, so
//     the row is as it was before the claim: due, its attempt uncounted.
//     The one cost: a row whose handler brings the server down within
//     that moment (about 3 × wal_writer_delay) of its claim is not counted
//     toward MaxAttempts.
//
// It is a condition of the UPDATE rather than a SET LOCAL so that the claim
// stays one autocommitted statement, one round trip.
const claimAsyncCommitSQL = `set_config('synchronous_commit', 'off', true) = 'off'`

func (p *Processor) claim(ctx context.Context, after string) ([]claimedRow, error) {
	return p.claimOn(ctx, p.cfg.Pool, after)
}

// claimOn runs the claim statement on q: the pool in production (its own
// autocommitted transaction), a transaction in tests.
func (p *Processor) claimOn(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, after string) ([]claimedRow, error) {
	rows, err := q.Query(ctx, claimSQL, pgx.NamedArgs{
		"consumer":       p.in.consumer,
		"after":          after,
		"limit":          p.cfg.BatchSize,
		"reorder_window": p.cfg.ReorderWindow,
		"claim_hold":     p.cfg.ClaimHold,
		"max_attempts":   p.cfg.MaxAttempts,
		"retry_base":     p.cfg.RetryBase.Seconds(),
		"retry_max":      p.cfg.RetryMax.Seconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("idempotent: inbox %s: claim: %w", p.in.consumer, err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimedRow])
	if err != nil {
		return nil, fmt.Errorf("idempotent: inbox %s: claim: %w", p.in.consumer, err)
	}
	return claimed, nil
}

// result is how one row's attempt ended inside the apply transaction.
type result struct {
	row *claimedRow
	err error // nil: DONE
}

// apply runs the claimed rows in one transaction and commits their outcomes
// together. An error return means the transaction did not commit: no effect
// and no outcome was recorded, and the rows are retried after the backoff the
// claim set.
func (p *Processor) apply(ctx context.Context, claimed []claimedRow) error {
	tx, err := p.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idempotent: inbox %s: begin: %w", p.in.consumer, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	// Mark the batch's keys busy for the whole attempt before touching a
	// row: claims skip a key whose lock is held. A key claimed twice (a v1
	// that arrived between another claim's commit and its apply reaching
	// this point) waits here for the other attempt to end; locking in hash
	// order keeps two such waits from deadlocking.
	//
	// Then lock the rows for the rest of the attempt, and keep only those
	// whose attempts still match the claim: a row claimed again meanwhile
	// (our claim's backoff ran out before we got here) belongs to that
	// claim. No SKIP LOCKED: a concurrent claim statement may hold a row's
	// lock for a moment even though it does not take the row (it locks the
	// newest version before re-checking that it is due), and skipping would
	// drop our own row. The rows are locked in id order, as every batch does.
	//
	// Then the first row's savepoint: one savepoint per row, so a failing
	// row undoes its own writes and nothing else. It costs one round trip
	// per row: the savepoint for the next row is set in the same message
	// that releases the last one, and ROLLBACK TO keeps the savepoint for
	// the next row too.
	//
	// The three go in one batch, one round trip: each runs only once the
	// one before it succeeded (a failure aborts the transaction, and the
	// rest with it), so the order above holds.
	keys := make([]string, len(claimed))
	ids := make([]uuid.UUID, len(claimed))
	attempts := make([]int32, len(claimed))
	for i, r := range claimed {
		keys[i], ids[i], attempts[i] = r.OrderingKey, r.MessageID, int32(r.Attempts)
	}
	b := &pgx.Batch{}
	b.Queue(lockKeysSQL, pgx.NamedArgs{"consumer": p.in.consumer, "keys": keys})
	b.Queue(`SELECT i.message_id FROM inbox i
		JOIN unnest($2::uuid[], $3::int4[]) AS c(id, attempts) ON i.message_id = c.id
		WHERE i.consumer = $1 AND i.status = 'PENDING' AND i.attempts = c.attempts
		ORDER BY i.message_id
		FOR UPDATE OF i`, p.in.consumer, pgid.All(ids), attempts)
	b.Queue("SAVEPOINT inbox_row")
	owned, err := func() (map[uuid.UUID]bool, error) {
		br := tx.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("idempotent: inbox %s: lock keys: %w", p.in.consumer, err)
		}
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("idempotent: inbox %s: lock claimed rows: %w", p.in.consumer, err)
		}
		locked, err := pgid.Collect(rows)
		if err != nil {
			return nil, fmt.Errorf("idempotent: inbox %s: lock claimed rows: %w", p.in.consumer, err)
		}
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("idempotent: inbox %s: savepoint: %w", p.in.consumer, err)
		}
		owned := make(map[uuid.UUID]bool, len(locked))
		for _, id := range locked {
			owned[id] = true
		}
		return owned, br.Close()
	}()
	if err != nil {
		return err
	}
	results := make([]result, 0, len(owned))
	for i := range claimed {
		r := &claimed[i]
		if !owned[r.MessageID] {
			// Its claim ran out before we got here and another processor
			// claimed it again: that one applies it.
			p.log.Debug("inbox row taken over by another claim", "event_id", r.MessageID)
			continue
		}
		herr, err := p.applyRow(ctx, tx, r)
		if err != nil {
			if herr != nil && ctx.Err() == nil { // not a shutdown's cancel: the handler's doing
				// Rolled back first: a transaction still open would hold
				// the rows' locks against the fresh connection.
				_ = tx.Rollback(context.WithoutCancel(ctx))
				p.chargeOnly(ctx, claimed, owned, r, herr)
			}
			return err
		}
		results = append(results, result{row: r, err: herr})
	}
	if len(results) == 0 {
		return nil
	}
	outcomes, err := p.record(ctx, tx, results)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idempotent: inbox %s: commit: %w", p.in.consumer, err)
	}
	if p.cfg.AfterCommit != nil {
		ids := make([]uuid.UUID, 0, len(results))
		for _, r := range results {
			if r.err == nil {
				ids = append(ids, r.row.MessageID)
			}
		}
		if len(ids) > 0 {
			p.cfg.AfterCommit(ids)
		}
	}
	p.report(ctx, results, outcomes)
	return nil
}

// applyRow runs the handler for r inside the savepoint inbox_row, which
// is set on entry and is set again on return. Deadlocks and serialization
// failures are retried at once, twice, without counting an attempt. herr is
// the handler's verdict; err means tx itself is broken and the batch is lost.
func (p *Processor) applyRow(ctx context.Context, tx pgx.Tx, r *claimedRow) (herr, err error) {
	for try := 0; ; try++ {
		herr = p.call(ctx, tx, r)
		if herr == nil {
			// Keep the row's writes and open the next row's savepoint. This
			// fails if the handler swallowed an error that aborted the
			// transaction: that is the handler's failure, not ours.
			if _, herr = tx.Exec(ctx, "RELEASE SAVEPOINT inbox_row; SAVEPOINT inbox_row"); herr == nil {
				return nil, nil
			}
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT inbox_row"); err != nil {
			return herr, fmt.Errorf("idempotent: inbox %s: rollback to savepoint after %v: %w", p.in.consumer, herr, err)
		}
		if !retryable(herr) || try == 2 {
			return herr, nil
		}
	}
}

// chargeOnly settles a batch whose transaction the handler of culprit
// broke (a query cut at its deadline closes the connection): nothing of
// the batch committed, and without it every row would wait out the
// claim's backoff with the attempt the claim counted. The culprit keeps
// its attempt, with herr as its last error (FAILED past MaxAttempts); its
// batch-mates, which failed for nothing of their own, get their attempt
// back and are due at once. Best effort on a fresh connection: if it
// fails too, the rows are as the claim left them. Rows claimed again
// meanwhile (their attempts moved on) are left to that claim.
func (p *Processor) chargeOnly(ctx context.Context, claimed []claimedRow, owned map[uuid.UUID]bool, culprit *claimedRow, herr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var ids []uuid.UUID
	var attempts []int32
	for _, r := range claimed {
		if owned[r.MessageID] {
			ids, attempts = append(ids, r.MessageID), append(attempts, int32(r.Attempts))
		}
	}
	_, err := p.cfg.Pool.Exec(ctx, chargeOnlySQL,
		pgx.NamedArgs{"consumer": p.in.consumer, "culprit": culprit.MessageID, "error": herr.Error(), "permanent": IsPermanent(herr),
			"ids": pgid.All(ids), "attempts": attempts, "max_attempts": p.cfg.MaxAttempts,
			"retry_base": p.cfg.RetryBase.Seconds(), "retry_max": p.cfg.RetryMax.Seconds()})
	if err != nil {
		p.log.ErrorContext(ctx, "inbox batch lost with its connection; its rows wait out the claim's backoff",
			"event_id", culprit.MessageID, "handler_error", herr, "error", err)
		return
	}
	p.log.WarnContext(ctx, "inbox handler broke its batch's transaction: the batch is retried, the attempt charged to this row alone",
		"event_id", culprit.MessageID, "attempt", culprit.Attempts, "error", herr)
}

// chargeOnlySQL settles a lost batch (chargeOnly): the culprit keeps its
// attempt and gets its backoff, the others get theirs back, due at once.
var chargeOnlySQL = `UPDATE inbox i SET
	attempts        = CASE WHEN i.message_id = @culprit THEN i.attempts ELSE i.attempts - 1 END,
	status          = CASE WHEN i.message_id = @culprit AND (@permanent OR i.attempts >= @max_attempts) THEN 'FAILED' ELSE 'PENDING' END,
	next_attempt_at = CASE WHEN i.message_id = @culprit THEN ` + fmt.Sprintf(backoffSQL, "i.attempts") + ` ELSE clock_timestamp() END,
	last_error      = CASE WHEN i.message_id = @culprit THEN @error ELSE i.last_error END
	FROM unnest(@ids::uuid[], @attempts::int4[]) AS c(id, attempts)
	WHERE i.consumer = @consumer AND i.message_id = c.id AND i.status = 'PENDING' AND i.attempts = c.attempts`

// call runs the handler with a span continuing the receive's trace, and
// turns a panic into an error.
func (p *Processor) call(ctx context.Context, tx pgx.Tx, r *claimedRow) (err error) {
	if r.Traceparent != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": *r.Traceparent})
	}
	ctx, span := p.tracer.Start(ctx, "inbox process "+r.EventType, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("event_id", r.MessageID.String()), attribute.String("consumer", p.in.consumer),
			attribute.Int("attempt", r.Attempts)))
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HandlerTimeout)
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("idempotent: inbox handler panicked: %v\n%s", v, debug.Stack())
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil {
			p.in.timeouts.Add(parent, 1, metric.WithAttributes(p.in.attrConsumer))
			err = fmt.Errorf("idempotent: inbox handler passed its %v deadline: %w", p.cfg.HandlerTimeout, err)
		}
		cancel()
		if err != nil {
			span.RecordError(err)
		}
		span.End()
	}()
	return p.handler(ctx, lentTx{tx}, r.envelope())
}

// lentTx is the transaction a handler gets: the processor decides how it
// ends, so Commit and Rollback are refused. Nested Begin (a savepoint of the
// handler's own) works as usual.
type lentTx struct{ pgx.Tx }

// ErrTxOwned is what Commit and Rollback return on the transaction an
// Effect, a BatchEffect or an inbox Handler is lent: the consumer (or the
// processor) commits it with the dedupe record, or rolls it back when the
// effect returns an error. The message fails, rolled back.
var ErrTxOwned = errors.New("idempotent: the consumer owns this transaction; return an error to roll back")

func (lentTx) Commit(context.Context) error   { return ErrTxOwned }
func (lentTx) Rollback(context.Context) error { return ErrTxOwned }

// record writes every outcome of the batch in one statement: DONE, back to
// PENDING with the next backoff, or FAILED with the error text.
func (p *Processor) record(ctx context.Context, tx pgx.Tx, results []result) (map[uuid.UUID]string, error) {
	ids := make([]uuid.UUID, len(results))
	errs := make([]*string, len(results))
	perm := make([]bool, len(results))
	for i, res := range results {
		ids[i] = res.row.MessageID
		if res.err != nil {
			msg := res.err.Error()
			errs[i], perm[i] = &msg, IsPermanent(res.err)
		}
	}
	rows, err := tx.Query(ctx, `UPDATE inbox i SET
		status          = CASE WHEN r.error IS NULL THEN 'DONE'
		                       WHEN r.permanent OR i.attempts >= @max_attempts THEN 'FAILED'
		                       ELSE 'PENDING' END,
		processed_at    = CASE WHEN r.error IS NULL THEN clock_timestamp() END,
		next_attempt_at = CASE WHEN r.error IS NULL THEN i.next_attempt_at
		                       ELSE `+fmt.Sprintf(backoffSQL, "i.attempts")+` END,
		last_error      = coalesce(r.error, i.last_error)
		FROM unnest(@ids::uuid[], @errors::text[], @permanent::bool[]) AS r(id, error, permanent)
		WHERE i.consumer = @consumer AND i.message_id = r.id
		RETURNING i.message_id, i.status`, pgx.NamedArgs{
		"consumer": p.in.consumer, "ids": pgid.All(ids), "errors": errs, "permanent": perm,
		"max_attempts": p.cfg.MaxAttempts, "retry_base": p.cfg.RetryBase.Seconds(), "retry_max": p.cfg.RetryMax.Seconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("idempotent: inbox %s: record outcomes: %w", p.in.consumer, err)
	}
	statuses := make(map[uuid.UUID]string, len(results))
	var id uuid.UUID
	var status string
	if _, err := pgx.ForEachRow(rows, []any{pgid.Scan(&id), &status}, func() error { statuses[id] = status; return nil }); err != nil {
		return nil, fmt.Errorf("idempotent: inbox %s: record outcomes: %w", p.in.consumer, err)
	}
	return statuses, nil
}

// report logs and counts a committed batch.
func (p *Processor) report(ctx context.Context, results []result, statuses map[uuid.UUID]string) {
	var done int64
	for _, res := range results {
		r := res.row
		switch statuses[r.MessageID] {
		case "DONE":
			done++
		case "FAILED":
			p.in.processed.Add(ctx, 1, metric.WithAttributes(p.in.attrConsumer, attribute.String("outcome", "failed")))
			p.log.ErrorContext(ctx, "inbox row FAILED: not applied; it blocks its key until an operator replays it",
				"event_id", r.MessageID, "event_type", r.EventType, "ordering_key", r.OrderingKey,
				"attempts", r.Attempts, "permanent", IsPermanent(res.err), "error", res.err)
		default:
			p.in.processed.Add(ctx, 1, metric.WithAttributes(p.in.attrConsumer, attribute.String("outcome", "retry")))
			p.log.WarnContext(ctx, "inbox handler failed: rolled back, will retry after backoff",
				"event_id", r.MessageID, "event_type", r.EventType, "attempts", r.Attempts, "error", res.err)
		}
	}
	if done > 0 {
		p.in.processed.Add(ctx, done, metric.WithAttributes(p.in.attrConsumer, attribute.String("outcome", "done")))
	}
}
