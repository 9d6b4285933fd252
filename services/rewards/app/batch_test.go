package app_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// The batch path writes what one event at a time writes. The same receives
// (fresh payments sharing wallets; a refund of a credited payment; a
// payment's success and refund in one receive, in either order; the same
// payment under a second event id; a newer version of a credited payment;
// a copy of an event already applied; a success after its refund) are
// applied by HandleBatchDeliveries, ten per transaction, on one database,
// and event by event through Handle on another: credits, wallets, payment
// states and the CashbackCredited/CashbackReversed events come out the
// same, and each receive of the batch database committed in one
// transaction.
func TestBatchPathWritesWhatOneEventAtATimeWrites(t *testing.T) {
	t.Parallel()
	batch := start(t, options{noWorkers: true})
	single := start(t, options{noWorkers: true})
	ctx := context.Background()
	u := func(i int) string { return fmt.Sprintf("u_w%d", i%3) }
	var r1 []events.Envelope
	for i := range 10 {
		r1 = append(r1, paid(t, fmt.Sprintf("pay_%d", i), u(i), int64(100000+i*1000), 1))
	}
	r2 := []events.Envelope{
		refunded(t, "pay_0", u(0), 100000, 2),
		paid(t, "pay_x", u(1), 50000, 1), refunded(t, "pay_x", u(1), 50000, 2),
		refunded(t, "pay_y", u(2), 70000, 2), paid(t, "pay_y", u(2), 70000, 1),
		paid(t, "pay_1", u(1), 101000, 1), // pay_1 again, under a second event id
		paid(t, "pay_2", u(2), 102000, 2), // a newer version of a credited payment
		r1[3],                             // a copy of an event applied already
		paid(t, "pay_10", u(1), 90000, 1), paid(t, "pay_11", u(0), 91000, 1),
	}
	r3 := []events.Envelope{
		paid(t, "pay_0", u(0), 100000, 3), // after its refund: a contradiction, parked
		paid(t, "pay_12", u(2), 92000, 1), paid(t, "pay_13", u(2), 93000, 1), paid(t, "pay_13", u(2), 93000, 1),
	}
	for ri, receive := range [][]events.Envelope{r1, r2, r3} {
		ds := make([]sqstransport.Delivery, len(receive))
		for i, e := range receive {
			ds[i] = sqstransport.Delivery{Envelope: e}
		}
		berrs := batch.app.Processor.HandleBatchDeliveries(ctx, ds)
		for i, e := range receive {
			serr := single.app.Processor.Handle(ctx, e)
			if (berrs[i] == nil) != (serr == nil) || sqstransport.IsPermanent(berrs[i]) != sqstransport.IsPermanent(serr) {
				t.Errorf("receive %d, event %d (%s %s): batch %v, one at a time %v", ri+1, i, e.EventType, e.AggregateID, berrs[i], serr)
			}
		}
	}
	for _, q := range []string{
		`SELECT payment_id, user_id, recipient, payment_amount_paise, currency, rate_bp, amount_paise, event_id, payment_version,
			occurred_at, status, reversal_event_id FROM cashback_credits ORDER BY payment_id`,
		`SELECT user_id, balance_paise FROM wallets ORDER BY user_id`,
		`SELECT payment_id, status, version, last_event_id FROM payment_versions ORDER BY payment_id`,
		`SELECT event_type, aggregate_id, aggregate_version, payload::text FROM outbox ORDER BY aggregate_id, aggregate_version`,
	} {
		b, s := rowsOf(t, batch, q), rowsOf(t, single, q)
		if !reflect.DeepEqual(b, s) {
			t.Errorf("%s\nbatch path:      %v\none at a time:   %v", q, b, s)
		}
		if len(b) == 0 {
			t.Errorf("%s: no rows; the comparison proves nothing", q)
		}
	}
	if n := batch.count(`SELECT count(DISTINCT xmin::text) FROM cashback_credits WHERE payment_id = ANY($1)`,
		[]string{"pay_1", "pay_2", "pay_3", "pay_4", "pay_5", "pay_6", "pay_7", "pay_8", "pay_9"}); n != 1 {
		t.Errorf("the first receive's credits (but pay_0's, reversed since) were written by %d transactions, want 1", n)
	}
}

// rowsOf reads every row of q as text.
func rowsOf(t *testing.T, s *stack, q string) [][]string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]string, error) {
		vals, err := r.Values()
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprint(v)
		}
		return row, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A wallet whose credits in one receive add up past what a bigint holds:
// the batch path must not wrap the sum in Go and commit a negative
// balance. One at a time, PostgreSQL refuses the credit that overflows; the
// batch falls back to that, so the first credit lands, the second fails,
// and the wallet equals the credits committed. (Reachable once
// REWARDS_MAX_RATE_BP is raised towards its 10000 ceiling: nothing else
// bounds a payment's amount.)
func TestBatchOfCreditsPastABigintFallsBackAndTheWalletEqualsItsCredits(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO cashback_rates (effective_from, rate_bp) VALUES ('1971-01-01Z', 10000)`); err != nil {
		t.Fatal(err)
	}
	const big = int64(1) << 62
	receive := []events.Envelope{paid(t, "pay_big1", "u_big", big, 1), paid(t, "pay_big2", "u_big", big, 1)}
	ds := make([]sqstransport.Delivery, len(receive))
	for i, e := range receive {
		ds[i] = sqstransport.Delivery{Envelope: e}
	}
	errs := s.app.Processor.HandleBatchDeliveries(ctx, ds)
	if errs[0] != nil || errs[1] == nil {
		t.Errorf("errors %v: want the first credit applied and the second, past a bigint, failed", errs)
	}
	var balance, credits int64
	var credited string
	if err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT balance_paise FROM wallets WHERE user_id = 'u_big'), 0),
		(SELECT count(*) FROM cashback_credits WHERE user_id = 'u_big'),
		(SELECT coalesce(sum(amount_paise), 0)::text FROM cashback_credits WHERE user_id = 'u_big' AND status = 'CREDITED')`).Scan(&balance, &credits, &credited); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(balance) != credited || credits != 1 {
		t.Errorf("wallet balance %d, %d credits committed summing to %s; want one credit of %d and the wallet equal to it", balance, credits, credited, big)
	}
}
