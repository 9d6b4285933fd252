package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/stack"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// The chaos soak (make soak; a short one runs in make test).
//
// Payments are driven through the HTTP API at a steady pace for
// SOAK_DURATION while a controller SIGKILLs and restarts the payments API,
// the payments relay (a process of its own, ROLE=relay), rewards and
// notifications at random, restarts PostgreSQL and the SQS server once
// each, re-sends copies of published events, and moves copies through the
// DLQ and back with cmd/redrive. A request that fails or times out is
// retried with the same Idempotency-Key until it gets a definite answer,
// as a real client does, so every payment is either acknowledged (201) or
// refused. Then, once the pipeline is quiet, it checks that nothing was
// lost or doubled and prints a table.
//
//	SOAK_DURATION  how long the chaos lasts (default 60s)
//	SOAK_PAYMENTS  payments spread over it (default 300)
//	SOAK_SEED      the random seed (default: from the clock; printed, so a
//	               run can be replayed)

const (
	soakUsers   = 40
	soakWorkers = 8
	// soakPerPayment bounds the retries of one payment: an API killed
	// mid-request leaves its key locked until IDEMPOTENCY_LOCK_TIMEOUT.
	soakPerPayment = 3 * time.Minute
)

// soakAPIEnv is the payments API of the soak: no relay in it (that is its
// own process), and a key lease short enough that a request cut by a kill
// can be retried within seconds (STRIPE_TIMEOUT must stay below 3/4 of it).
var soakAPIEnv = []string{"ROLE=api", "IDEMPOTENCY_LOCK_TIMEOUT=15s", "STRIPE_TIMEOUT=10s"}

type soakConfig struct {
	duration time.Duration
	payments int
	seed     uint64
}

func soakSettings(t *testing.T) soakConfig {
	c := soakConfig{duration: 60 * time.Second, payments: 300, seed: uint64(time.Now().UnixNano())}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 10s", v)
		}
		c.duration = d
	}
	if v := os.Getenv("SOAK_PAYMENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SOAK_PAYMENTS=%q: want a positive number", v)
		}
		c.payments = n
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want an unsigned number", v)
		}
		c.seed = n
	}
	return c
}

// soakPayment is one payment the driver makes, and what became of it.
type soakPayment struct {
	key, user string
	amount    int64
	id        string // from the 201
	code      int    // the definite answer; 0 if none came
	tries     int
	last      string // the last error or answer, for the report
}

// victim is a process the controller kills.
type victim struct {
	name string
	env  []string // for every start (the identity of a StartAs name is kept by stack)
}

func TestChaosSoak(t *testing.T) {
	l := local(t)
	cfg := soakSettings(t)
	fmt.Printf("soak: seed %d (replay with SOAK_SEED=%d), %d payments over %v\n", cfg.seed, cfg.seed, cfg.payments, cfg.duration)
	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x5eed))

	// Every service behind Toxiproxy; payments split into its two roles, so
	// each can be killed on its own; SOAK_REPLICAS of every process.
	nw := newSoakNet(t)
	replicas := soakReplicas(t)
	apiEnv := append(append([]string{}, soakAPIEnv...), nw.env["payments"]...)
	relayEnv := append([]string{"ROLE=relay"}, nw.env["payments"]...)
	var victims, extra []victim
	var apis []string
	for r := 1; r <= replicas; r++ {
		for _, k := range []struct {
			base, replica string
			env           []string
		}{
			{stack.Payments, "soak-api", apiEnv}, {"", "soak-relay", relayEnv},
			{stack.Rewards, "soak-rewards", nw.env["rewards"]}, {stack.Notifications, "soak-notifications", nw.env["notifications"]},
		} {
			switch {
			case r == 1 && k.base != "": // the stack's own process, restarted with the soak's environment
				if err := l.Restart(k.base, k.env...); err != nil {
					t.Fatal(err)
				}
				victims = append(victims, victim{k.base, k.env})
				if k.base == stack.Payments {
					apis = append(apis, k.base)
				}
			default:
				name := fmt.Sprintf("%s-%d", k.replica, r)
				base := k.base
				if base == "" {
					base = stack.Payments
				}
				if err := l.StartAs(name, base, k.env...); err != nil {
					t.Fatal(err)
				}
				victims = append(victims, victim{name, nil})
				extra = append(extra, victim{name, nil})
				if k.replica == "soak-api" {
					apis = append(apis, name)
				}
			}
		}
	}
	t.Cleanup(func() {
		for _, v := range extra {
			_ = l.Stop(v.name)
		}
		for _, n := range []string{stack.Payments, stack.Rewards, stack.Notifications} {
			restartPlain(t, n)
		}
	})
	var apiMu sync.Mutex
	apiURL := func() string { // a running API replica, as a load balancer would pick
		apiMu.Lock()
		defer apiMu.Unlock()
		n := apis[rand.IntN(len(apis))]
		if !l.Running(n) {
			n = apis[0]
		}
		return l.URL(n)
	}

	// The payments, decided up front so the seed replays them.
	pays := make([]*soakPayment, cfg.payments)
	for i := range pays {
		pays[i] = &soakPayment{key: fmt.Sprintf("soak_%s_%d", s.run, i),
			user: fmt.Sprintf("u_soak_%s_%02d", s.run, rng.IntN(soakUsers)), amount: 100 + rng.Int64N(500_000)}
	}

	// The driver: payment i is due at t0 + i*duration/payments.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	jobs := make(chan *soakPayment)
	var acked sync.Map // payment id → *soakPayment, for the injector
	var ackedIDs struct {
		sync.Mutex
		ids []string
	}
	var drivers sync.WaitGroup
	for range soakWorkers {
		drivers.Go(func() {
			for p := range jobs {
				soakPay(ctx, p, apiURL)
				if p.code == http.StatusCreated {
					acked.Store(p.id, p)
					ackedIDs.Lock()
					ackedIDs.ids = append(ackedIDs.ids, p.id)
					ackedIDs.Unlock()
				}
			}
		})
	}
	go func() {
		defer close(jobs)
		for i, p := range pays {
			due := t0.Add(time.Duration(int64(cfg.duration) * int64(i) / int64(len(pays))))
			select {
			case <-time.After(time.Until(due)):
			case <-ctx.Done():
				return
			}
			select {
			case jobs <- p:
			case <-ctx.Done():
				return
			}
		}
	}()
	randomAcked := func(n int) []string {
		ackedIDs.Lock()
		defer ackedIDs.Unlock()
		var out []string
		for range n {
			if len(ackedIDs.ids) > 0 {
				out = append(out, ackedIDs.ids[rng.IntN(len(ackedIDs.ids))])
			}
		}
		return out
	}

	// The controller, on the test goroutine: one disturbance at a time.
	st := soakStats{kills: map[string]int{}, crashes: map[string]int{}}
	for _, v := range victims {
		st.victims = append(st.victims, v.name)
	}
	pgAt, sqsAt, partAt := t0.Add(cfg.duration*35/100), t0.Add(cfg.duration*65/100), t0.Add(cfg.duration*15/100)
	pgDone, sqsDone, partDone := false, false, false
	cuts0 := faults.Cuts()
	end := t0.Add(cfg.duration)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
		for _, v := range victims { // a process that died on its own is noted and brought back
			if !l.Running(v.name) {
				st.crashes[v.name]++
				t.Logf("soak: %s was not running (see %s); starting it", v.name, l.LogPath(v.name))
				soakStart(t, l, v)
			}
		}
		switch now := time.Now(); {
		case !pgDone && now.After(pgAt):
			pgDone = true
			st.pg = soakInfra(t, "restart-pg")
		case !sqsDone && now.After(sqsAt):
			sqsDone = true
			st.sqs = soakInfra(t, "restart-sqs")
		case !partDone && now.After(partAt):
			partDone = true
			nw.partition(t, rng, &st, partitionLength(rng, cfg.duration))
		default:
			switch r := rng.IntN(10); {
			case r >= 6:
				nw.inject(t, rng, &st, time.Duration(2000+rng.IntN(4000))*time.Millisecond)
			case r < 4:
				v := victims[rng.IntN(len(victims))]
				if err := l.Kill(v.name); err != nil {
					t.Fatal(err)
				}
				st.kills[v.name]++
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
				soakStart(t, l, v)
			case r < 5:
				st.inject(t, randomAcked(1+rng.IntN(3)))
			default:
				st.redrive(t, randomAcked(1+rng.IntN(3)))
			}
		}
	}
	for _, v := range victims {
		if !l.Running(v.name) {
			soakStart(t, l, v)
		}
	}
	st.cuts = faults.Cuts() - cuts0
	fmt.Printf("soak: chaos over after %v; waiting for the driver\n", time.Since(t0).Round(time.Second))
	drivers.Wait()

	// Quiescence: every acknowledged payment through to its SMS.
	var ackIDs []string
	for _, p := range pays {
		if p.code == http.StatusCreated {
			ackIDs = append(ackIDs, p.id)
		}
	}
	q0 := time.Now()
	eventually(t, 5*time.Minute, func() (bool, string) {
		pending := count(t, s.payDB, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1) AND published_at IS NULL`, ackIDs) +
			count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1) AND published_at IS NULL`, ackIDs)
		credited := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id = ANY($1)`, ackIDs)
		sent := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE status = 'SENT' AND event_id = ANY($1)`, cashbackEvents(t, ackIDs))
		inbox := count(t, s.notDB, `SELECT count(*) FROM inbox WHERE status IN ('PENDING', 'FAILED') AND aggregate_id = ANY($1)`, ackIDs)
		ok := pending == 0 && credited == int64(len(ackIDs)) && sent >= credited && inbox == 0
		return ok, fmt.Sprintf("%d unpublished outbox rows, %d/%d credited, %d SMS sent, %d inbox rows pending", pending, credited, len(ackIDs), sent, inbox)
	})
	fmt.Printf("soak: quiet %v after the driver\n", time.Since(q0).Round(time.Second))
	soakCheck(t, cfg, pays, &st)
}

// soakPay makes one payment, retrying with the same key until a definite
// answer: 201 (acknowledged) or a 4xx other than 409 (refused). Connection
// errors, timeouts, 5xx and 409 (the same key still running, or locked by a
// request the kill cut) are retried.
func soakPay(ctx context.Context, p *soakPayment, apiURL func() string) {
	body, _ := json.Marshal(upi(p.user, p.amount))
	hc := &http.Client{Timeout: 15 * time.Second}
	deadline := time.Now().Add(soakPerPayment)
	delay := 100 * time.Millisecond
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p.tries++
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiURL()+"/v1/payments", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", p.key)
		if s.apiKey != "" { // every API replica takes the stack's key
			req.Header.Set("Authorization", "Bearer "+s.apiKey)
		}
		resp, err := hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			p.last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
			switch {
			case resp.StatusCode == http.StatusCreated:
				var got payment
				if json.Unmarshal(b, &got) == nil && got.ID != "" {
					p.code, p.id = resp.StatusCode, got.ID
					return
				}
			case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict:
				p.code = resp.StatusCode
				return
			}
		} else {
			p.last = err.Error()
		}
		time.Sleep(delay)
		delay = min(delay*2, 2*time.Second)
	}
}

func soakStart(t *testing.T, l *stack.Local, v victim) {
	t.Helper()
	if err := l.Start(v.name, v.env...); err != nil {
		t.Fatalf("soak: restart %s: %v", v.name, err)
	}
}

// soakInfra runs scripts/stack.sh restart-pg or restart-sqs. Exit status 3
// means the stack cannot restart that server honestly (an external
// PostgreSQL, an SQS server without persistence): the reason is printed
// and the step skipped.
func soakInfra(t *testing.T, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.root, "scripts", "stack.sh"), what)
	cmd.Dir = s.root
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		reason := strings.TrimSpace(string(out))
		fmt.Printf("soak: %s skipped: %s\n", what, reason)
		return "skipped: " + reason
	}
	if err != nil {
		t.Fatalf("soak: scripts/stack.sh %s: %v\n%s", what, err, out)
	}
	fmt.Printf("soak: %s done\n", what)
	return "done"
}

// soakStats is what the controller did.
type soakStats struct {
	victims        []string
	kills, crashes map[string]int
	pg, sqs        string
	// copies re-sent with the same body, by event id: payment events to
	// payments-events, cashback events to rewards-events
	injectedPay, injectedRew map[uuid.UUID]int
	redriven                 map[uuid.UUID]int // payment events moved through the DLQ and back
	redrives                 int               // redrive runs
	faults                   map[string]int    // network faults injected, by kind
	cuts                     int64             // answers the cut-on-reply faults actually dropped
	partition                string            // the database partition, and the backlog it caused
}

// namesOf are the victims whose name is base or a replica of it (prefix).
func namesOf(st *soakStats, base, prefix string) []string {
	var out []string
	for _, n := range st.victims {
		if n == base || strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

func add(m *map[uuid.UUID]int, id uuid.UUID) {
	if *m == nil {
		*m = map[uuid.UUID]int{}
	}
	(*m)[id]++
}

func (st *soakStats) inject(t *testing.T, paymentIDs []string) {
	for _, pid := range paymentIDs {
		if e, ok := publishedEvent(t, s.payDB, pid, contract.PaymentSucceeded); ok {
			send(t, s.payQ, e)
			add(&st.injectedPay, e.EventID)
		}
		if e, ok := publishedEvent(t, s.rewDB, pid, contract.CashbackCredited); ok {
			send(t, s.rewQ, e)
			add(&st.injectedRew, e.EventID)
		}
	}
}

func (st *soakStats) redrive(t *testing.T, paymentIDs []string) {
	var n int
	for _, pid := range paymentIDs {
		if e, ok := publishedEvent(t, s.payDB, pid, contract.PaymentSucceeded); ok {
			send(t, s.payDLQ, e)
			add(&st.redriven, e.EventID)
			n++
		}
	}
	if n == 0 {
		return
	}
	if moved := redrive(t, "-source", "payments-events-dlq", "-max", strconv.Itoa(n)); moved != n {
		t.Errorf("soak: redrive moved %d messages, want the %d copies put in the DLQ", moved, n)
	}
	st.redrives++
}

// publishedEvent is the envelope of the payment's outbox row of that type,
// if the relay has published it (a copy of a published event is what a
// duplicate delivery carries).
func publishedEvent(t *testing.T, db *pgxpool.Pool, paymentID, eventType string) (events.Envelope, bool) {
	t.Helper()
	var id uuid.UUID
	err := db.QueryRow(bg(), `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = $2 AND published_at IS NOT NULL`,
		paymentID, eventType).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return events.Envelope{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return outboxEnvelope(t, db, id), true
}

// cashbackEvents are the CashbackCredited event ids of the payments.
func cashbackEvents(t *testing.T, paymentIDs []string) []uuid.UUID {
	t.Helper()
	return query(t, s.rewDB, pgx.RowTo[uuid.UUID], `SELECT id FROM outbox WHERE aggregate_id = ANY($1) AND event_type = $2`,
		paymentIDs, contract.CashbackCredited)
}

// soakCheck checks the invariants, prints them as a table with what the
// run did, and fails the test naming the payments and events that broke
// one.
func soakCheck(t *testing.T, cfg soakConfig, pays []*soakPayment, st *soakStats) {
	t.Helper()
	var ackIDs []string
	byID := map[string]*soakPayment{}
	var refused, unanswered []string
	retried := 0
	for _, p := range pays {
		switch {
		case p.code == http.StatusCreated:
			ackIDs = append(ackIDs, p.id)
			byID[p.id] = p
		case p.code != 0:
			refused = append(refused, p.key+": "+p.last)
		default:
			unanswered = append(unanswered, p.key+": "+p.last)
		}
		if p.tries > 1 {
			retried++
		}
	}

	type inv struct {
		name string
		bad  []string
	}
	var invs []inv
	check := func(name string, bad []string) { invs = append(invs, inv{name, bad}) }

	check("every payment got a definite answer (same key retried)", unanswered)
	check("no payment refused", refused)

	// Nothing doubled at the API: the soak's users have exactly the
	// acknowledged payments.
	var extra []string
	dbPays := query(t, s.payDB, pgx.RowTo[string], `SELECT id FROM payments WHERE user_id LIKE $1`, "u_soak_"+s.run+"_%")
	for _, id := range dbPays {
		if byID[id] == nil {
			extra = append(extra, id)
		}
	}
	check("payments rows = acknowledged payments", extra)

	// Exactly one credit per acknowledged payment, of its rate at occurred_at.
	type paid struct {
		amount     int64
		occurredAt time.Time
		eventID    uuid.UUID
	}
	events0 := map[string]paid{}
	rows, err := s.payDB.Query(bg(), `SELECT p.id, p.amount_paise, o.occurred_at, o.id FROM payments p
		JOIN outbox o ON o.aggregate_id = p.id AND o.event_type = $2 WHERE p.id = ANY($1)`, ackIDs, contract.PaymentSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	var twice []string // payments with a second PaymentSucceeded
	for rows.Next() {
		var id string
		var p paid
		if err := rows.Scan(&id, &p.amount, &p.occurredAt, &p.eventID); err != nil {
			t.Fatal(err)
		}
		if _, seen := events0[id]; seen {
			twice = append(twice, id)
		}
		events0[id] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Rewards' business key absorbs a second event for a payment; a
	// consumer without one would apply it twice.
	check("payments with more than one PaymentSucceeded", twice)
	type rate struct {
		From time.Time
		BP   int64
	}
	rates := query(t, s.rewDB, pgx.RowToStructByPos[rate], `SELECT effective_from, rate_bp FROM cashback_rates ORDER BY effective_from`)
	rateAt := func(at time.Time) int64 {
		bp := int64(0)
		for _, r := range rates {
			if !r.From.After(at) {
				bp = r.BP
			}
		}
		return bp
	}
	cs := credits(t, "payment_id = ANY($1)", ackIDs)
	perPayment := map[string][]credit{}
	for _, c := range cs {
		perPayment[c.PaymentID] = append(perPayment[c.PaymentID], c)
	}
	var creditBad []string
	for _, id := range ackIDs {
		p, c := events0[id], perPayment[id]
		want := p.amount * rateAt(p.occurredAt) / 10000
		switch {
		case p.eventID == uuid.Nil:
			creditBad = append(creditBad, id+": no PaymentSucceeded in the payments outbox")
		case len(c) != 1:
			creditBad = append(creditBad, fmt.Sprintf("%s (event %s): %d credits", id, p.eventID, len(c)))
		case c[0].AmountPaise != want || c[0].Status != "CREDITED":
			creditBad = append(creditBad, fmt.Sprintf("%s (event %s): credit %d paise %s, want %d CREDITED", id, p.eventID, c[0].AmountPaise, c[0].Status, want))
		}
	}
	check("one credit per acknowledged payment, at its rate", creditBad)

	// Wallets: balance = credits - reversals.
	var walletBad []string
	rows, err = s.rewDB.Query(bg(), `SELECT w.user_id, w.balance_paise,
			coalesce((SELECT sum(amount_paise) FROM cashback_credits c WHERE c.user_id = w.user_id), 0)
			- coalesce((SELECT sum(amount_paise) FROM cashback_credits c WHERE c.user_id = w.user_id AND c.status = 'REVERSED'), 0)
		FROM wallets w WHERE w.user_id LIKE $1`, "u_soak_"+s.run+"_%")
	if err != nil {
		t.Fatal(err)
	}
	wallets := 0
	for rows.Next() {
		var user string
		var bal, want int64
		if err := rows.Scan(&user, &bal, &want); err != nil {
			t.Fatal(err)
		}
		wallets++
		if bal != want {
			walletBad = append(walletBad, fmt.Sprintf("%s: balance %d, credits - reversals %d", user, bal, want))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	check(fmt.Sprintf("wallet = credits - reversals (%d wallets)", wallets), walletBad)

	// One SMS delivered per credit.
	cevs := cashbackEvents(t, ackIDs)
	perKey := map[string]int{}
	for _, d := range deliveries(t, "sms:") {
		perKey[d.IdempotencyKey]++
	}
	var smsBad []string
	if len(cevs) != len(cs) {
		smsBad = append(smsBad, fmt.Sprintf("%d CashbackCredited events for %d credits", len(cevs), len(cs)))
	}
	for _, e := range cevs {
		if n := perKey["sms:"+e.String()]; n != 1 {
			smsBad = append(smsBad, fmt.Sprintf("sms:%s delivered %d times", e, n))
		}
	}
	check("one SMS delivered per credit", smsBad)

	var outboxBad []string
	for _, db := range []struct {
		name string
		q    func() []string
	}{
		{"payments", func() []string { return ids(t, s.payDB, ackIDs) }},
		{"rewards", func() []string { return ids(t, s.rewDB, ackIDs) }},
	} {
		for _, id := range db.q() {
			outboxBad = append(outboxBad, db.name+" outbox row "+id)
		}
	}
	check("no outbox row unpublished (both producers)", outboxBad)
	inboxBad := query(t, s.notDB, pgx.RowTo[string],
		`SELECT message_id::text || ' ' || status FROM inbox WHERE status IN ('PENDING', 'FAILED') AND aggregate_id = ANY($1)`, ackIDs)
	check("no inbox row PENDING or FAILED", inboxBad)

	// Duplicates absorbed by rewards, by cause. The consumer logs each
	// duplicate copy with its event id; injected and redriven copies are
	// counted here; a relay resend is an outbox row claimed again after a
	// publish whose mark was lost (claims - 1, less the publishes that
	// failed and were logged so); visibility redeliveries (a consumer
	// killed between commit and delete, a database restart) are the rest.
	payEvents := map[uuid.UUID]bool{}
	for _, p := range events0 {
		payEvents[p.eventID] = true
	}
	dupRewards := 0
	var dupLines, failLines []string
	for _, n := range namesOf(st, stack.Rewards, "soak-rewards-") {
		dupLines = append(dupLines, logLines(t, n, "duplicate copy acked")...)
	}
	for _, n := range namesOf(st, "", "soak-relay-") {
		failLines = append(failLines, logLines(t, n, "outbox publish failed")...)
	}
	for _, line := range dupLines {
		var m struct {
			EventID uuid.UUID `json:"event_id"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && payEvents[m.EventID] {
			dupRewards++
		}
	}
	var reclaims int64
	if err := s.payDB.QueryRow(bg(), `SELECT coalesce(sum(attempts - 1), 0) FROM outbox WHERE aggregate_id = ANY($1)`, ackIDs).Scan(&reclaims); err != nil {
		t.Fatal(err)
	}
	failedPublishes := 0
	for _, line := range failLines {
		var m struct {
			EventID uuid.UUID `json:"event_id"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && payEvents[m.EventID] {
			failedPublishes++
		}
	}
	sum := func(m map[uuid.UUID]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	injected, redriven := sum(st.injectedPay), sum(st.redriven)
	// The rest came from the system itself: relay resends first (bounded
	// by the re-claims), visibility redeliveries after them.
	own := max(dupRewards-injected-redriven, 0)
	resends := min(max(int(reclaims)-failedPublishes, 0), own)
	visibility := own - resends
	var dupBad []string
	if dupRewards < injected+redriven {
		dupBad = append(dupBad, fmt.Sprintf("rewards logged %d duplicates, fewer than the %d copies injected and redriven", dupRewards, injected+redriven))
	}
	check("every extra copy absorbed as a duplicate", dupBad)
	var dlqBad []string
	payEventIDs := make([]uuid.UUID, 0, len(payEvents))
	for id := range payEvents {
		payEventIDs = append(payEventIDs, id)
	}
	for _, q := range []struct{ name, url string }{{"payments-events-dlq", s.payDLQ}, {"rewards-events-dlq", s.rewDLQ}} {
		ids := payEventIDs
		if q.url == s.rewDLQ {
			ids = cevs
		}
		for _, m := range peek(t, q.url, withEventID(ids...)) {
			dlqBad = append(dlqBad, q.name+": "+attr(m, "event_id")+" "+attr(m, "park_reason"))
		}
	}
	check("no soak event in any DLQ", dlqBad)
	dlqPay, dlqRew := depth(t, s.payDLQ), depth(t, s.rewDLQ)

	// The slowest payment: from its row's created_at to its SMS's sent_at.
	created := map[string]time.Time{}
	for _, r := range query(t, s.payDB, pgx.RowToStructByPos[struct {
		ID string
		At time.Time
	}], `SELECT id, created_at FROM payments WHERE id = ANY($1)`, ackIDs) {
		created[r.ID] = r.At
	}
	paymentOf := map[uuid.UUID]string{}
	for _, r := range query(t, s.rewDB, pgx.RowToStructByPos[struct {
		ID  uuid.UUID
		Agg string
	}], `SELECT id, aggregate_id FROM outbox WHERE event_type = 'CashbackCredited' AND aggregate_id = ANY($1)`, ackIDs) {
		paymentOf[r.ID] = r.Agg
	}
	var slowest time.Duration
	slowestID := ""
	for _, r := range query(t, s.notDB, pgx.RowToStructByPos[struct {
		EventID uuid.UUID
		At      time.Time
	}], `SELECT event_id, sent_at FROM notifications WHERE status = 'SENT' AND event_id = ANY($1)`, cevs) {
		if c, ok := created[paymentOf[r.EventID]]; ok && r.At.Sub(c) > slowest {
			slowest, slowestID = r.At.Sub(c), paymentOf[r.EventID]
		}
	}

	// The table.
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nchaos soak: seed %d, %v, %d payments\n", cfg.seed, cfg.duration, len(pays))
	fmt.Fprintf(w, "invariant\tresult\n")
	failed := false
	for _, i := range invs {
		res := "ok"
		if len(i.bad) > 0 {
			res, failed = fmt.Sprintf("FAILED (%d)", len(i.bad)), true
		}
		fmt.Fprintf(w, "%s\t%s\n", i.name, res)
	}
	fmt.Fprintf(w, "\nwhat happened\tcount\n")
	fmt.Fprintf(w, "payments acknowledged (201)\t%d\n", len(ackIDs))
	fmt.Fprintf(w, "payments retried with the same key\t%d\n", retried)
	fmt.Fprintf(w, "credits / SMS delivered\t%d / %d\n", len(cs), len(cevs))
	for _, n := range st.victims {
		fmt.Fprintf(w, "SIGKILL + restart: %s\t%d\n", n, st.kills[n])
	}
	for _, n := range slices.Sorted(maps.Keys(st.crashes)) {
		fmt.Fprintf(w, "exited on its own, restarted: %s\t%d\n", n, st.crashes[n])
	}
	fmt.Fprintf(w, "PostgreSQL restart\t%s\n", st.pg)
	fmt.Fprintf(w, "SQS server restart\t%s\n", st.sqs)
	fmt.Fprintf(w, "redrive runs (copies moved through the DLQ)\t%d (%d)\n", st.redrives, redriven)
	fmt.Fprintf(w, "duplicates absorbed by rewards\t%d\n", dupRewards)
	fmt.Fprintf(w, "  injected copy\t%d\n", injected)
	fmt.Fprintf(w, "  redrive\t%d\n", redriven)
	fmt.Fprintf(w, "  relay resend after a kill\t%d\n", resends)
	fmt.Fprintf(w, "  visibility redelivery\t%d\n", visibility)
	fmt.Fprintf(w, "injected CashbackCredited copies (notifications inbox)\t%d\n", sum(st.injectedRew))
	fmt.Fprintf(w, "replicas of each process\t%d\n", len(namesOf(st, stack.Rewards, "soak-rewards-")))
	kills := 0
	for _, n := range st.kills {
		kills += n
	}
	fmt.Fprintf(w, "replicas killed (SIGKILL, all processes)\t%d\n", kills)
	for _, f := range soakFaults {
		fmt.Fprintf(w, "network fault: %s\t%d\n", f.name, st.faults[f.name])
	}
	fmt.Fprintf(w, "answers dropped by the cut faults\t%d\n", st.cuts)
	fmt.Fprintf(w, "database partition\t%s\n", st.partition)
	fmt.Fprintf(w, "messages in the DLQs at the end (payments / rewards, whole queues)\t%d / %d\n", dlqPay, dlqRew)
	fmt.Fprintf(w, "longest payment → SMS\t%v (%s)\n", slowest.Round(time.Millisecond), slowestID)
	_ = w.Flush()

	if failed {
		for _, i := range invs {
			for j, b := range i.bad {
				if j == 20 {
					t.Errorf("%s: ... and %d more", i.name, len(i.bad)-20)
					break
				}
				t.Errorf("%s: %s", i.name, b)
			}
		}
		t.Errorf("soak failed; replay with SOAK_SEED=%d SOAK_DURATION=%v SOAK_PAYMENTS=%d", cfg.seed, cfg.duration, len(pays))
	}
}

// ids are the payments' outbox rows still unpublished in db.
func ids(t *testing.T, db *pgxpool.Pool, paymentIDs []string) []string {
	t.Helper()
	return query(t, db, pgx.RowTo[string],
		`SELECT id::text || ' (' || aggregate_id || ')' FROM outbox WHERE aggregate_id = ANY($1) AND published_at IS NULL`, paymentIDs)
}
