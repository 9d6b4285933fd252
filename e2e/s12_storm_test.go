package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 12. The storm: 1,000 payments through the API (8 at a time).
// The relay publishes each PaymentSucceeded once; on top of that every
// event gets 0–2 extra copies (re-sent from the payments outbox, as a relay
// resend would), in random order, and about a fifth of the extra copies go
// through the DLQ and come back by redrive, in three rounds while the rest
// is flowing. Every event is thus delivered 1–3 times. Exactly 1,000
// credits, summing to exactly 2% of the total, 1,000 applied, the rest
// duplicates, 1,000 SMS each delivered once.
func TestStormOfAThousandPaymentsDeliveredOneToThreeTimesWithRedrivesCreditsEachExactlyOnce(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("E2E_STORM_N")); err == nil && v > 0 {
		n = v
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t.Logf("storm of %d payments, seed %d", n, seed)
	applied0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied")
	dup0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")

	// 1. The payments, 8 concurrent clients. Amounts are whole rupees, so
	// 2% of each is a whole number of paise and the sum is exact.
	users := make([]string, 50)
	for i := range users {
		users[i] = id("u_e2e12")
	}
	amounts := make([]int64, n)
	var total int64
	for i := range amounts {
		amounts[i] = 100 * (1 + rng.Int64N(5000)) // ₹1 .. ₹5,000
		total += amounts[i]
	}
	t0 := time.Now()
	payIDs := make([]string, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				payIDs[i] = pay(t, users[i%len(users)], amounts[i]).ID
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d payments created in %v", n, time.Since(t0).Round(time.Millisecond))

	// 2. The extra copies, from the payments outbox.
	rows, err := s.payDB.Query(bg(), `SELECT id FROM outbox WHERE aggregate_id = ANY($1) AND event_type = $2`, payIDs, contract.PaymentSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	var eventIDs []uuid.UUID
	for rows.Next() {
		var e uuid.UUID
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		eventIDs = append(eventIDs, e)
	}
	if rows.Err() != nil || len(eventIDs) != n {
		t.Fatalf("%d PaymentSucceeded in the payments outbox (%v), want %d", len(eventIDs), rows.Err(), n)
	}
	var toQueue, toDLQ []events.Envelope
	for _, e := range eventIDs {
		env := outboxEnvelope(t, s.payDB, e)
		for range rng.IntN(3) { // 0, 1 or 2 more copies
			if rng.IntN(5) == 0 {
				toDLQ = append(toDLQ, env)
			} else {
				toQueue = append(toQueue, env)
			}
		}
	}
	rng.Shuffle(len(toQueue), func(i, j int) { toQueue[i], toQueue[j] = toQueue[j], toQueue[i] })
	rng.Shuffle(len(toDLQ), func(i, j int) { toDLQ[i], toDLQ[j] = toDLQ[j], toDLQ[i] })
	extra := len(toQueue) + len(toDLQ)
	t.Logf("%d extra copies: %d straight to payments-events, %d by way of the DLQ and a redrive", extra, len(toQueue), len(toDLQ))

	// 3. Deliver them in three rounds, each followed by a redrive of a
	// third of the dead-lettered copies.
	moved := 0
	for r := range 3 {
		q := toQueue[r*len(toQueue)/3 : (r+1)*len(toQueue)/3]
		d := toDLQ[r*len(toDLQ)/3 : (r+1)*len(toDLQ)/3]
		sendMany(t, s.payQ, q)
		sendMany(t, s.payDLQ, d)
		moved += redrive(t, "-source", "payments-events-dlq")
	}
	if moved < len(toDLQ) {
		t.Errorf("the redrives moved %d messages, want at least the %d dead-lettered copies", moved, len(toDLQ))
	}
	t.Logf("all copies delivered %v after the start", time.Since(t0).Round(time.Millisecond))

	// 4. Exactly once, in every database.
	eventually(t, 3*time.Minute, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id = ANY($1)`, payIDs)
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate") - dup0
		return c == int64(n) && d >= float64(extra), fmt.Sprintf("%d of %d payments credited, %v of %d extra copies seen as duplicates", c, n, d, extra)
	})
	t.Logf("all credited and every copy seen %v after the start", time.Since(t0).Round(time.Millisecond))
	var credited, distinct, sum int64
	if err := s.rewDB.QueryRow(bg(), `SELECT count(*), count(DISTINCT payment_id), coalesce(sum(amount_paise), 0)
		FROM cashback_credits WHERE payment_id = ANY($1)`, payIDs).Scan(&credited, &distinct, &sum); err != nil {
		t.Fatal(err)
	}
	if credited != int64(n) || distinct != int64(n) {
		t.Errorf("%d credits for %d distinct payments, want %d and %d", credited, distinct, n, n)
	}
	if sum*50 != total {
		t.Errorf("credits sum to %d paise; 2%% of the total %d is %d", sum, total, total/50)
	}
	if a := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied") - applied0; a != float64(n) {
		t.Errorf("rewards applied %v messages, want %d", a, n)
	}
	if p := count(t, s.rewDB, `SELECT count(*) FROM processed_messages WHERE consumer = 'rewards' AND message_id = ANY($1)`, eventIDs); p != int64(n) {
		t.Errorf("%d dedupe rows, want %d", p, n)
	}
	var wallets int64
	if err := s.rewDB.QueryRow(bg(), `SELECT coalesce(sum(balance_paise), 0) FROM wallets WHERE user_id = ANY($1)`, users).Scan(&wallets); err != nil {
		t.Fatal(err)
	}
	if wallets != sum {
		t.Errorf("wallets hold %d paise, the credits sum to %d", wallets, sum)
	}

	// 1,000 SMS, each delivered once.
	var cashbackEvents []uuid.UUID
	rows, err = s.rewDB.Query(bg(), `SELECT id FROM outbox WHERE aggregate_id = ANY($1) AND event_type = $2`, payIDs, contract.CashbackCredited)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e uuid.UUID
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		cashbackEvents = append(cashbackEvents, e)
	}
	if len(cashbackEvents) != n {
		t.Fatalf("%d CashbackCredited in the rewards outbox, want %d", len(cashbackEvents), n)
	}
	eventually(t, 3*time.Minute, func() (bool, string) {
		c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = ANY($1) AND status = 'SENT'`, cashbackEvents)
		return c == int64(n), fmt.Sprintf("%d of %d notifications SENT", c, n)
	})
	t.Logf("all SMS sent %v after the start", time.Since(t0).Round(time.Millisecond))
	if c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE recipient = ANY($1)`, users); c != int64(n) {
		t.Errorf("%d notifications for the storm's users, want %d", c, n)
	}
	want := map[string]bool{}
	for _, e := range cashbackEvents {
		want["sms:"+e.String()] = true
	}
	got, requests := 0, 0
	for _, d := range deliveries(t, "sms:") {
		if want[d.IdempotencyKey] {
			got++
			requests += d.Requests
		}
	}
	if got != n || requests != n {
		t.Errorf("provider delivered %d SMS after %d requests, want %d and %d", got, requests, n, n)
	}
	if left := len(peek(t, s.payDLQ, withEventID(eventIDs...))); left != 0 {
		t.Errorf("%d copies left in the DLQ, want 0", left)
	}
}
