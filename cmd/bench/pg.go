package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/services/contract"
)

var quiet = slog.New(slog.DiscardHandler)

// pgEnv creates and drops the bench's databases on the server of DATABASE_URL.
type pgEnv struct {
	admin *pgxpool.Pool
	cfg   *pgxpool.Config // DATABASE_URL's; copied with another database name
	url   string
	run   string

	mu      sync.Mutex
	created []string // dropped by close, in case a measurement failed half-way
}

func newPGEnv(ctx context.Context, dsn, run string) (*pgEnv, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	acfg := cfg.Copy()
	acfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, acfg)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	return &pgEnv{admin: admin, cfg: cfg, url: dsn, run: run}, nil
}

// freshDB creates database bench_<run>_<name> and returns a pool of up to
// maxConns connections on it, and a function that closes the pool and drops
// the database.
func (e *pgEnv) freshDB(ctx context.Context, name string, maxConns int) (*pgxpool.Pool, func(), error) {
	db := "bench_" + e.run + "_" + name
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("create database %s: %w", db, err)
	}
	e.mu.Lock()
	e.created = append(e.created, db)
	e.mu.Unlock()
	cfg := e.cfg.Copy()
	cfg.ConnConfig.Database = db
	cfg.MaxConns = int32(maxConns)
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		e.drop(db)
		return nil, nil, err
	}
	return pool, func() { pool.Close(); e.drop(db) }, nil
}

// connString returns DATABASE_URL with the database name replaced, for a
// service process.
func (e *pgEnv) connString(db string) string {
	if u, err := url.Parse(e.url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		u.RawPath = ""
		return u.String()
	}
	c := e.cfg.ConnConfig
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", c.Host, c.Port, c.User, c.Password, db)
}

func (e *pgEnv) createDB(ctx context.Context, db string) error {
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	e.mu.Lock()
	e.created = append(e.created, db)
	e.mu.Unlock()
	return nil
}

func (e *pgEnv) drop(db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		progress("warning: drop database %s: %v", db, err)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, d := range e.created {
		if d == db {
			e.created = append(e.created[:i], e.created[i+1:]...)
			break
		}
	}
}

func (e *pgEnv) close() {
	e.mu.Lock()
	left := append([]string(nil), e.created...)
	e.mu.Unlock()
	for _, db := range left {
		e.drop(db)
	}
	e.admin.Close()
}

// measure runs op on workers goroutines for warm-up plus d and returns how
// many messages the calls after the warm-up handled, per second. op returns
// how many messages one call handled. The first error stops everything.
func measure(ctx context.Context, d time.Duration, workers int, op func(ctx context.Context, worker int) (int, error)) (count int64, elapsed time.Duration, err error) {
	warm := min(d/10, 500*time.Millisecond)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		counting atomic.Bool
		n        atomic.Int64
		errOnce  sync.Once
		first    error
		wg       sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				k, err := op(ctx, w)
				if err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { first = err; cancel() })
					}
					return
				}
				if counting.Load() {
					n.Add(int64(k))
				}
			}
		})
	}
	select {
	case <-time.After(warm):
	case <-ctx.Done():
	}
	counting.Store(true)
	start := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	counting.Store(false)
	elapsed = time.Since(start)
	cancel()
	wg.Wait()
	if first != nil {
		return 0, 0, first
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	if elapsed <= 0 {
		return 0, 0, errors.New("no time measured")
	}
	return n.Load(), elapsed, nil
}

const consumerName = "bench"

// The effect shared by the bare rewards transaction and Handle: the credit
// and the wallet move of services/rewards, without the rate lookup and
// payment versioning that are the service's own business.
const benchSchema = `
CREATE TABLE bench_credits (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id   text   NOT NULL UNIQUE,
    user_id      text   NOT NULL,
    amount_paise bigint NOT NULL,
    event_id     uuid   NOT NULL,
    credited_at  timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_wallets (
    user_id       text   PRIMARY KEY,
    balance_paise bigint NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now());
INSERT INTO bench_wallets (user_id) SELECT 'u_' || g FROM generate_series(0, 9999) g;
-- The single-row INSERT baseline: a key and a JSON payload, like an inbox row.
CREATE TABLE bench_rows (
    consumer   text  NOT NULL,
    message_id uuid  NOT NULL,
    payload    jsonb NOT NULL,
    PRIMARY KEY (consumer, message_id));
ANALYZE;`

// credit is one message's data.
type credit struct {
	env     events.Envelope
	msg     idempotent.Message
	payment string
	user    string
	amount  int64
}

func newCredit() (credit, error) {
	pay := "pay_" + uuid.NewString()[:18]
	user := fmt.Sprintf("u_%d", rand.IntN(10000))
	e, err := events.New(contract.PaymentSucceeded, pay, 1,
		map[string]any{"payment_id": pay, "user_id": user, "amount_paise": 120000, "currency": "INR"})
	if err != nil {
		return credit{}, err
	}
	return credit{env: e, msg: idempotent.MessageOf(e), payment: pay, user: user, amount: 2400}, nil
}

func (c credit) apply(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `INSERT INTO bench_credits (payment_id, user_id, amount_paise, event_id) VALUES ($1, $2, $3, $4)`,
		c.payment, c.user, c.amount, c.env.EventID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE bench_wallets SET balance_paise = balance_paise + $2, updated_at = now() WHERE user_id = $1`,
		c.user, c.amount)
	return err
}

// batch10 is a bench op: HandleBatch of 10 fresh credits through cons,
// each applied with effect, all of which must come back Applied.
func batch10(cons *idempotent.Consumer, effect func(credit, context.Context, pgx.Tx) error) func(context.Context, int) (int, error) {
	return func(ctx context.Context, _ int) (int, error) {
		items := make([]idempotent.Item, 10)
		for i := range items {
			cr, err := newCredit()
			if err != nil {
				return 0, err
			}
			items[i] = idempotent.Item{Msg: cr.msg, Effect: func(ctx context.Context, tx pgx.Tx) error { return effect(cr, ctx, tx) }}
		}
		outs, errs := cons.HandleBatch(ctx, items)
		for i := range outs {
			if errs[i] != nil {
				return 0, errs[i]
			}
			if outs[i] != idempotent.Applied {
				return 0, fmt.Errorf("batch item %d: %s", i, outs[i])
			}
		}
		return len(items), nil
	}
}

// applyPipelined is apply with both statements sent in one round trip
// (a pgx.Batch): the same SQL, the way an effect that does not need one
// statement's result for the next can be written.
func (c credit) applyPipelined(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO bench_credits (payment_id, user_id, amount_paise, event_id) VALUES ($1, $2, $3, $4)`,
		c.payment, c.user, c.amount, c.env.EventID)
	b.Queue(`UPDATE bench_wallets SET balance_paise = balance_paise + $2, updated_at = now() WHERE user_id = $1`, c.user, c.amount)
	return tx.SendBatch(ctx, b).Close()
}

// setupRewardsDB makes a fresh database with the library's schema
// (processed_messages with its partitions, inbox) and the bench tables.
func setupRewardsDB(ctx context.Context, pg *pgEnv, name string, conns int) (*pgxpool.Pool, func(), error) {
	pool, drop, err := pg.freshDB(ctx, name, conns)
	if err != nil {
		return nil, nil, err
	}
	if err := idempotent.Migrate(ctx, pool); err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := pool.Exec(ctx, benchSchema); err != nil {
		drop()
		return nil, nil, err
	}
	return pool, drop, nil
}

// bcase is one throughput measurement of an interleaved group.
type bcase struct {
	key, name, unit string
	base            string // key of the baseline row, if any
	target          *Target
	op              func(ctx context.Context, worker int) (int, error)

	count   int64
	elapsed time.Duration
	rates   []float64 // per round
	cpu     cpuUse
}

// interleave runs the cases' measurements in rounds (A B C A B C ...), each
// segment d/rounds long, so that a burst of load from elsewhere on the
// machine hits every case alike rather than whichever ran at the time; each
// case's rate is the median of its rounds' rates, which a burst that hit one
// segment does not move.
func interleave(ctx context.Context, d time.Duration, rounds, workers int, cases []*bcase) error {
	seg := d / time.Duration(rounds)
	for range rounds {
		for _, c := range cases {
			s0 := cpu.sample()
			var n int64
			var el time.Duration
			var err error
			measuring(ctx, c.key, func(ctx context.Context) { n, el, err = measure(ctx, seg, workers, c.op) })
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			c.cpu = c.cpu.add(s0.until(cpu.sample()), c.elapsed, el)
			c.rates = append(c.rates, float64(n)/el.Seconds())
			c.count += n
			c.elapsed += el
		}
	}
	return nil
}

func (c *bcase) row(rep *report, sec string, workers int) {
	rates := slices.Clone(c.rates)
	slices.Sort(rates)
	row := &Row{Key: c.key, Section: sec, Name: c.name, Value: median(rates), Unit: c.unit, Rounds: c.rates,
		Target: c.target, Details: map[string]any{"count": c.count, "measured_s": c.elapsed.Seconds(), "connections": workers,
			"mean_rate": float64(c.count) / c.elapsed.Seconds(), "round_rates": c.rates, "cpu_cores": c.cpu.rounded()}}
	if c.base != "" {
		row.Baseline = rep.ref(c.base)
	}
	rep.add(row)
}

func benchPostgres(ctx context.Context, pg *pgEnv, o options, rep *report) error {
	const sec = "PostgreSQL: baselines and the idempotent consumer"
	for _, conns := range o.conns {
		if err := benchPostgresConns(ctx, pg, o, conns, sec, rep); err != nil {
			return err
		}
	}
	return nil
}

func benchPostgresConns(ctx context.Context, pg *pgEnv, o options, conns int, sec string, rep *report) error {
	c := fmt.Sprint(conns)
	progress("postgres, %d connection(s), %d interleaved rounds", conns, o.rounds)
	var dropAfter []func()
	db := func(name string) (*pgxpool.Pool, error) {
		pool, drop, err := setupRewardsDB(ctx, pg, name+"_c"+c, conns)
		if err != nil {
			return nil, err
		}
		dropAfter = append(dropAfter, drop)
		return pool, nil
	}
	defer func() {
		for _, drop := range dropAfter {
			drop()
		}
	}()

	// 1. bare single-row INSERT (autocommit) vs the inbox receiver: one
	// autocommitted INSERT ... ON CONFLICT DO NOTHING per message, then ack.
	insertDB, err := db("insert")
	if err != nil {
		return err
	}
	inboxDB, err := db("inbox")
	if err != nil {
		return err
	}
	payload := []byte(`{"payment_id":"pay_x","user_id":"u_17","amount_paise":120000,"currency":"INR"}`)
	in, err := idempotent.NewInbox(inboxDB, consumerName, idempotent.InboxConfig{Logger: quiet, MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		return err
	}
	defer in.Close()

	// 2. the bare rewards transaction vs Handle (new, then duplicates), and
	// 3. HandleBatch, 10 messages per call.
	bareDB, err := db("baretx")
	if err != nil {
		return err
	}
	handleDB, err := db("handle")
	if err != nil {
		return err
	}
	batchDB, err := db("batch")
	if err != nil {
		return err
	}
	pipeDB, err := db("pipe")
	if err != nil {
		return err
	}
	pcons, err := idempotent.NewConsumer(pipeDB, consumerName, idempotent.WithLogger(quiet))
	if err != nil {
		return err
	}
	cons, err := idempotent.NewConsumer(handleDB, consumerName, idempotent.WithLogger(quiet))
	if err != nil {
		return err
	}
	bcons, err := idempotent.NewConsumer(batchDB, consumerName, idempotent.WithLogger(quiet))
	if err != nil {
		return err
	}
	hash := sha256.Sum256([]byte("bench"))
	var mu sync.Mutex
	var applied []credit
	var next atomic.Int64

	cases := []*bcase{
		{key: "bare_insert_c" + c, name: fmt.Sprintf("bare single-row INSERT, %d conn", conns), unit: "tx/s",
			op: func(ctx context.Context, _ int) (int, error) {
				id, _ := uuid.NewV7()
				_, err := insertDB.Exec(ctx, `INSERT INTO bench_rows (consumer, message_id, payload) VALUES ($1, $2, $3)`, consumerName, id, payload)
				return 1, err
			}},
		{key: "inbox_receive_c" + c, name: fmt.Sprintf("Inbox.Receive (store, then ack), %d conn", conns), unit: "acks/s",
			base: "bare_insert_c" + c,
			op: func(ctx context.Context, _ int) (int, error) {
				cr, err := newCredit()
				if err != nil {
					return 0, err
				}
				stored, err := in.Receive(ctx, cr.env, cr.env.AggregateID)
				if err == nil && !stored {
					err = fmt.Errorf("fresh event %s not stored", cr.env.EventID)
				}
				return 1, err
			}},
		{key: "bare_tx_c" + c, name: fmt.Sprintf("bare rewards tx (dedupe+credit+wallet), %d conn", conns), unit: "tx/s",
			op: func(ctx context.Context, _ int) (int, error) {
				cr, err := newCredit()
				if err != nil {
					return 0, err
				}
				return 1, pgx.BeginFunc(ctx, bareDB, func(tx pgx.Tx) error {
					tag, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash)
						VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, consumerName, cr.msg.EventID, hash[:])
					if err != nil {
						return err
					}
					if tag.RowsAffected() != 1 {
						return fmt.Errorf("fresh id %s already there", cr.msg.EventID)
					}
					return cr.apply(ctx, tx)
				})
			}},
		{key: "handle_new_c" + c, name: fmt.Sprintf("Handle, new messages, %d conn", conns), unit: "msgs/s",
			base: "bare_tx_c" + c, target: minRatio(0.9),
			op: func(ctx context.Context, _ int) (int, error) {
				cr, err := newCredit()
				if err != nil {
					return 0, err
				}
				out, err := cons.Handle(ctx, cr.msg, cr.apply)
				if err == nil && out != idempotent.Applied {
					err = fmt.Errorf("fresh message %s: %s", cr.msg.EventID, out)
				}
				if err == nil {
					mu.Lock()
					applied = append(applied, cr)
					mu.Unlock()
				}
				return 1, err
			}},
		// Duplicates: replay what Handle applied, cycling through it.
		{key: "handle_dup_c" + c, name: fmt.Sprintf("Handle, duplicates (replayed ids), %d conn", conns), unit: "msgs/s",
			base: "handle_new_c" + c, target: minRatio(3),
			op: func(ctx context.Context, _ int) (int, error) {
				mu.Lock()
				if len(applied) == 0 {
					mu.Unlock()
					return 0, errors.New("no message applied to replay")
				}
				cr := applied[int(next.Add(1)-1)%len(applied)]
				mu.Unlock()
				out, err := cons.Handle(ctx, cr.msg, func(context.Context, pgx.Tx) error {
					return errors.New("a duplicate's effect ran")
				})
				if err == nil && out != idempotent.Duplicate {
					err = fmt.Errorf("replayed message %s: %s", cr.msg.EventID, out)
				}
				return 1, err
			}},
		{key: "batch10_c" + c, name: fmt.Sprintf("HandleBatch (10 per tx), new messages, %d conn", conns), unit: "msgs/s",
			base: "handle_new_c" + c, target: minRatio(3),
			op: batch10(bcons, credit.apply)},
	}
	// The same two, with the effect's statements pipelined: what HandleBatch
	// saves is the per-message BEGIN, dedupe INSERT and COMMIT; the effect's
	// own round trips remain, so this shows how much of the batch's cost
	// they are.
	cases = append(cases,
		&bcase{key: "handle_new_pipe_c" + c, name: fmt.Sprintf("Handle, effect pipelined (1 round trip), %d conn", conns), unit: "msgs/s",
			base: "handle_new_c" + c,
			op: func(ctx context.Context, _ int) (int, error) {
				cr, err := newCredit()
				if err != nil {
					return 0, err
				}
				out, err := pcons.Handle(ctx, cr.msg, cr.applyPipelined)
				if err == nil && out != idempotent.Applied {
					err = fmt.Errorf("fresh message %s: %s", cr.msg.EventID, out)
				}
				return 1, err
			}},
		&bcase{key: "batch10_pipe_c" + c, name: fmt.Sprintf("HandleBatch (10 per tx), effect pipelined, %d conn", conns), unit: "msgs/s",
			base: "handle_new_pipe_c" + c,
			op:   batch10(pcons, credit.applyPipelined)},
	)
	if err := interleave(ctx, o.duration, o.rounds, conns, cases); err != nil {
		return err
	}
	for _, k := range cases {
		k.row(rep, sec, conns)
	}
	return nil
}
