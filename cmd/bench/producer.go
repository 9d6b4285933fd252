package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/services/contract"
	paymigrations "github.com/effectively-once/payments-cashback/services/payments/migrations"
	"github.com/effectively-once/payments-cashback/services/payments/store"
)

// benchProducer measures what the outbox costs the producer's commit: the
// payments transaction (INSERT payments, as services/payments does) and a
// bare single-row INSERT, each with and without an outbox row in the same
// transaction, interleaved, at each -conns. The "with" cases do everything
// the producer does for its event, the wake-up of the relay included.
func benchProducer(ctx context.Context, pg *pgEnv, o options, rep *report) error {
	const sec = "Producer: the commit with an outbox row vs without"
	for _, conns := range o.conns {
		c := fmt.Sprint(conns)
		progress("producer, %d connection(s), %d interleaved rounds", conns, o.rounds)
		var drops []func()
		db := func(name string) (*pgxpool.Pool, error) {
			pool, drop, err := pg.freshDB(ctx, name+"_c"+c, conns+2)
			if err != nil {
				return nil, err
			}
			drops = append(drops, drop)
			if err := paymigrations.Up(ctx, pool); err != nil {
				return nil, err
			}
			_, err = pool.Exec(ctx, `CREATE TABLE bench_rows (id uuid PRIMARY KEY, payload jsonb NOT NULL)`)
			return pool, err
		}
		err := func() error {
			defer func() {
				for _, d := range drops {
					d()
				}
			}()
			pools := map[string]*pgxpool.Pool{}
			for _, name := range []string{"prod_ins", "prod_ins_ob", "prod_pay", "prod_pay_ob", "prod_pay_ob_poll", "prod_req", "prod_req_ob"} {
				p, err := db(name)
				if err != nil {
					return err
				}
				pools[name] = p
			}
			wakes := map[string]*outbox.Notifier{}
			for _, name := range []string{"prod_ins_ob", "prod_pay_ob", "prod_req_ob"} {
				n, stop, err := startNotifier(ctx, pools[name])
				if err != nil {
					return err
				}
				defer stop()
				wakes[name] = n
			}
			payload := []byte(`{"payment_id":"pay_x","user_id":"u_17","amount_paise":120000,"currency":"INR"}`)
			insert := func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertRowSQL, uuid.Must(uuid.NewV7()), payload)
				return err
			}
			// The row and its event in one round trip (outbox.QueueAdd), as
			// store.InsertSucceeded sends a payment with its event.
			insertWithEvent := func(ctx context.Context, tx pgx.Tx) error {
				pay := store.NewID()
				e, err := events.New(contract.PaymentSucceeded, pay, 1, map[string]any{"payment_id": pay, "user_id": "u_17", "amount_paise": 120000, "currency": "INR", "status": "SUCCEEDED"})
				if err != nil {
					return err
				}
				b := &pgx.Batch{}
				b.Queue(insertRowSQL, uuid.Must(uuid.NewV7()), payload)
				if err := outbox.QueueAdd(ctx, b, e); err != nil {
					return err
				}
				return tx.SendBatch(ctx, b).Close()
			}
			newPayment := func() store.Payment {
				return store.Payment{ID: store.NewID(), Client: "bench", UserID: fmt.Sprintf("u_%d", rand.IntN(10000)), AmountPaise: 120000,
					Currency: "INR", Method: "upi", ProviderRef: "pi_" + uuid.NewString()[:12]}
			}
			tx := func(pool *pgxpool.Pool, wake *outbox.Notifier, body func(ctx context.Context, tx pgx.Tx) error) func(context.Context, int) (int, error) {
				return func(ctx context.Context, _ int) (int, error) {
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return body(ctx, tx) }); err != nil {
						return 0, err
					}
					wake.Notify()
					return 1, nil
				}
			}
			cases := []*bcase{
				{key: "prod_insert_c" + c, name: fmt.Sprintf("bare single-row INSERT tx, %d conn", conns), unit: "tx/s",
					op: tx(pools["prod_ins"], nil, insert)},
				{key: "prod_insert_outbox_c" + c, name: fmt.Sprintf("the same + an outbox row, %d conn", conns), unit: "tx/s",
					base: "prod_insert_c" + c,
					op:   tx(pools["prod_ins_ob"], wakes["prod_ins_ob"], insertWithEvent)},
				{key: "prod_payment_c" + c, name: fmt.Sprintf("payments tx (INSERT payments), no outbox row, %d conn", conns), unit: "tx/s",
					op: tx(pools["prod_pay"], nil, func(ctx context.Context, t pgx.Tx) error {
						_, err := insertPayment(ctx, t, newPayment())
						return err
					})},
				{key: "prod_payment_outbox_c" + c, name: fmt.Sprintf("payments tx with its PaymentSucceeded outbox row (store.InsertSucceeded), %d conn", conns), unit: "tx/s",
					base: "prod_payment_c" + c, target: producerTarget(conns),
					op: tx(pools["prod_pay_ob"], wakes["prod_pay_ob"], func(ctx context.Context, t pgx.Tx) error {
						_, err := store.InsertSucceeded(ctx, t, newPayment())
						return err
					})},
				{key: "prod_payment_outbox_nowake_c" + c, name: fmt.Sprintf("the same without the wake-up after commit (relays poll), %d conn", conns), unit: "tx/s",
					base: "prod_payment_c" + c,
					op: tx(pools["prod_pay_ob_poll"], nil, func(ctx context.Context, t pgx.Tx) error {
						_, err := store.InsertSucceeded(ctx, t, newPayment())
						return err
					})},
			}
			for _, ob := range []bool{false, true} {
				k := &bcase{key: "prod_request_c" + c, name: fmt.Sprintf("payments request's database work (key claim, then payment + saved response), no outbox row, %d conn", conns),
					unit: "req/s"}
				pool, wake := pools["prod_req"], (*outbox.Notifier)(nil)
				if ob {
					k = &bcase{key: "prod_request_outbox_c" + c, name: fmt.Sprintf("the same with its outbox row and wake-up, as services/payments, %d conn", conns),
						unit: "req/s", base: "prod_request_c" + c}
					pool, wake = pools["prod_req_ob"], wakes["prod_req_ob"]
				}
				var err error
				if k.op, err = paymentRequest(pool, wake, newPayment); err != nil {
					return err
				}
				cases = append(cases, k)
			}
			if err := interleave(ctx, o.duration, o.rounds, conns, cases); err != nil {
				return err
			}
			for _, k := range cases {
				k.row(rep, sec, conns)
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// insertPayment is store.InsertSucceeded's payment statement, returning
// and scanning the same row, without the outbox row.
func insertPayment(ctx context.Context, t pgx.Tx, p store.Payment) (store.Payment, error) {
	err := t.QueryRow(ctx, `INSERT INTO payments (id, client, user_id, amount_paise, currency, method, status, version, provider_ref)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8)
		RETURNING id, client, user_id, amount_paise, currency, method, status, version, provider_ref,
			coalesce(provider_refund_ref, ''), created_at, updated_at`,
		p.ID, p.Client, p.UserID, p.AmountPaise, p.Currency, p.Method, store.StatusSucceeded, p.ProviderRef).
		Scan(&p.ID, &p.Client, &p.UserID, &p.AmountPaise, &p.Currency, &p.Method, &p.Status, &p.Version,
			&p.ProviderRef, &p.ProviderRefundRef, &p.CreatedAt, &p.UpdatedAt)
	return p, err
}

// paymentRequest is the database work of one POST /v1/payments as
// services/payments does it, less the Stripe call: the Idempotency-Key
// claimed in its own statement (httpidem), then one transaction with the
// payment and the saved response, and, with wake set, the payment's outbox
// row (store.InsertSucceeded) and the wake-up after the commit. It answers
// what the outbox costs a payments request rather than a bare transaction.
func paymentRequest(pool *pgxpool.Pool, wake *outbox.Notifier, newPayment func() store.Payment) (func(context.Context, int) (int, error), error) {
	keys, err := httpidem.New(pool, httpidem.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	insert := insertPayment
	if wake != nil {
		insert = store.InsertSucceeded
	}
	return func(ctx context.Context, _ int) (int, error) {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", nil)
		r.Header.Set(httpidem.HeaderKey, uuid.NewString())
		w := httptest.NewRecorder()
		p := newPayment()
		keys.Handle(w, r, httpidem.Request{Scope: "bench POST /v1/payments", Fingerprint: p, NewResourceID: store.NewID},
			func(ctx context.Context, a *httpidem.Attempt) error {
				p.ID = a.ResourceID
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					stored, err := insert(ctx, tx, p)
					if err != nil {
						return err
					}
					return a.Save(ctx, tx, http.StatusCreated, stored)
				})
				if err == nil {
					wake.Notify()
				}
				return err
			})
		if w.Code != http.StatusCreated {
			return 0, fmt.Errorf("payments request: %d %s", w.Code, w.Body)
		}
		return 1, nil
	}, nil
}

// insertRowSQL is the bare single-row INSERT of the producer's baseline.
const insertRowSQL = `INSERT INTO bench_rows (id, payload) VALUES ($1, $2)`

// producerTarget: the outbox row may cost the producer's commit at most
// 10% at 8 connections, where commits that serialise would show.
func producerTarget(conns int) *Target {
	if conns >= 8 {
		return minRatio(0.9)
	}
	return nil
}

// startNotifier runs the wake-up a producer sends after its commit.
func startNotifier(ctx context.Context, pool *pgxpool.Pool) (*outbox.Notifier, func(), error) {
	n := outbox.NewNotifier(pool, outbox.NotifierConfig{Logger: quiet})
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	return n, func() { cancel(); <-done }, nil
}
