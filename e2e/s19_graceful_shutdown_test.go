package e2e

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 19. SIGTERM in the middle of a backlog. Rewards holds one
// batch's transaction open (the test hook) while a backlog arrives, and is
// sent SIGTERM: it stops receiving, lets the held transaction commit,
// deletes what it committed and exits 0 within its shutdown deadline.
// Restarted, it credits the rest: every event exactly once, and no message
// it had committed comes back as a duplicate.
func TestSIGTERMMidBacklogLetsTheHeldBatchCommitExitsZeroAndTheRestIsCreditedOnce(t *testing.T) {
	l := local(t)
	const n = 2000
	users := make([]string, 10)
	for i := range users {
		users[i] = id("u_e2e19")
	}
	es := make([]events.Envelope, n)
	want := map[string]int64{}
	for i := range es {
		amount := 100 * int64(1+i%500) // whole rupees: 2% is whole paise
		es[i] = paymentEvent(t, contract.PaymentSucceeded, id("pay_e2e19"), users[i%len(users)], amount, 1)
		want[users[i%len(users)]] += amount * 2 / 100
	}
	held := es[0]
	// Held 3 s: within the handler's deadline (4 s, of the stack's 5 s
	// visibility), which would cut a longer hold as it cuts a hung effect.
	restartWith(t, "rewards", "REWARDS_SLOW_EVENT_IDS="+held.EventID.String()+"@3s")
	send(t, s.payQ, held)
	waitLog(t, "rewards", 1, "test hook: holding the transaction open", held.EventID.String())
	sendMany(t, s.payQ, es[1:])

	// The hold must still be open at the SIGTERM, or there is no drain
	// to see.
	if c := credits(t, "payment_id = $1", held.AggregateID); len(c) != 0 {
		t.Fatalf("the held event was credited before the SIGTERM (sending the backlog took over its 3 s hold): nothing to drain")
	}
	draining := len(logLines(t, "rewards", "shutting down: draining in-flight work"))
	cutOff := len(logLines(t, "rewards", "shutdown grace over"))
	t0 := time.Now()
	if err := l.Stop("rewards"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	st := l.ExitState("rewards")
	if st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("rewards after SIGTERM: %v after %v; want a clean exit (status 0) before the stack's 30 s kill; see %s", st, took, l.LogPath("rewards"))
	}
	t.Logf("rewards drained and exited in %v", took.Round(time.Millisecond))
	if d := len(logLines(t, "rewards", "shutting down: draining in-flight work")) - draining; d != 1 {
		t.Errorf("rewards logged the drain %d times, want 1", d)
	}
	if d := len(logLines(t, "rewards", "shutdown grace over")) - cutOff; d != 0 {
		t.Errorf("rewards cut off its in-flight handlers %d times, want none: the held one had time to finish", d)
	}
	// Drained, not cut off: the held transaction committed before the exit.
	if c := credits(t, "payment_id = $1", held.AggregateID); len(c) != 1 {
		t.Fatalf("the held event's payment has %d credits after the drain, want 1: its transaction was cut off", len(c))
	}
	ids := make([]uuid.UUID, n)
	payIDs := make([]string, n)
	for i, e := range es {
		ids[i], payIDs[i] = e.EventID, e.AggregateID
	}
	before := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id = ANY($1)`, payIDs)
	t.Logf("%d of %d events credited at the exit", before, n)

	if err := l.Start("rewards"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id = ANY($1)`, payIDs)
		return c == n, fmt.Sprintf("%d of %d payments credited", c, n)
	})
	if d := count(t, s.rewDB, `SELECT count(*) FROM processed_messages WHERE consumer = 'rewards' AND message_id = ANY($1)`, ids); d != n {
		t.Errorf("%d dedupe rows for the %d events, want one each", d, n)
	}
	if dup := count(t, s.rewDB, `SELECT count(*) FROM (SELECT payment_id FROM cashback_credits WHERE payment_id = ANY($1)
		GROUP BY payment_id HAVING count(*) > 1) d`, payIDs); dup != 0 {
		t.Errorf("%d payments credited more than once", dup)
	}
	for u, w := range want {
		if b := walletBalance(t, u); b != w {
			t.Errorf("wallet of %s = %d paise, want %d", u, b, w)
		}
	}
	// What the first run committed it also deleted before it exited: the
	// restarted replica meets none of it again. Read once the queue is
	// empty, in flight included: a committed message left undeleted is
	// invisible for a visibility timeout, and would come back as a
	// duplicate only after a check made as soon as the credits add up.
	eventually(t, 20*time.Second, func() (bool, string) {
		d := depth(t, s.payQ)
		return d == 0, fmt.Sprintf("payments-events still holds %d messages", d)
	})
	if dup := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate"); dup != 0 {
		t.Errorf("the restarted rewards met %v duplicates: the drained run committed them but left their messages in the queue", dup)
	}
}

// Scenario 19b. SIGTERM to payments while 8 clients are paying. Requests
// it had begun are answered; the rest cannot connect; none is answered
// with a server error. Every client then retries what got no answer, with
// the same Idempotency-Key, against the restarted service. Each key is
// exactly one payment, one charge's worth of credit, one event.
func TestSIGTERMToPaymentsUnderLoadAnswersWhatItBeganAndARetryWithTheSameKeyMakesOnePayment(t *testing.T) {
	l := local(t)
	t.Cleanup(func() {
		if !l.Running("payments") {
			restartPlain(t, "payments")
		}
	})
	user := id("u_e2e19b")
	type attempt struct {
		key  string
		code int    // 0: no answer (transport error)
		body []byte // the 201's payment
		err  error
	}
	var (
		mu    sync.Mutex
		tries []attempt
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	post := func(key string) (int, []byte, error) {
		req, err := http.NewRequest(http.MethodPost, s.paymentsURL+"/v1/payments",
			strings.NewReader(`{"user_id":"`+user+`","amount_paise":10000,"currency":"INR","method":"upi"}`))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		authorize(req)
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := "k_" + s.run + "_" + randomHex(8)
				code, b, err := post(key)
				mu.Lock()
				tries = append(tries, attempt{key, code, b, err})
				mu.Unlock()
				if err != nil {
					return // the service is gone: this client waits for the restart
				}
			}
		})
	}
	// Let the load run, then stop the service under it.
	eventually(t, 30*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(tries) >= 200, fmt.Sprintf("%d payments answered", len(tries))
	})
	t0 := time.Now()
	if err := l.Stop("payments"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	close(stop)
	wg.Wait()
	st := l.ExitState("payments")
	if st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("payments after SIGTERM: %v after %v; want a clean exit (status 0); see %s", st, took, l.LogPath("payments"))
	}
	var answered, unanswered int
	for _, a := range tries {
		switch {
		case a.err != nil:
			unanswered++
		case a.code == http.StatusCreated:
			answered++
		default:
			t.Errorf("key %s answered %d during the shutdown, want 201 or no answer at all", a.key, a.code)
		}
	}
	t.Logf("payments exited in %v: %d requests answered 201, %d got no answer", took.Round(time.Millisecond), answered, unanswered)

	if err := l.Start("payments"); err != nil {
		t.Fatal(err)
	}
	// The retries, with the same keys, against the restarted service.
	payIDs := map[string]bool{}
	for _, a := range tries {
		code, b := a.code, a.body
		if a.err != nil {
			var err error
			if code, b, err = post(a.key); err != nil {
				t.Fatalf("retry of key %s after the restart: %v", a.key, err)
			}
		}
		if code != http.StatusCreated {
			t.Errorf("key %s: %d %s, want 201", a.key, code, b)
			continue
		}
		payIDs[decode[payment](t, b).ID] = true
	}
	if len(payIDs) != len(tries) {
		t.Errorf("%d keys made %d distinct payments, want one each", len(tries), len(payIDs))
	}
	if c := count(t, s.payDB, `SELECT count(*) FROM payments WHERE user_id = $1`, user); c != int64(len(tries)) {
		t.Errorf("%d payments stored for %d keys, want one each", c, len(tries))
	}
	// One event each: rewards' business key would hide a second
	// PaymentSucceeded for a payment, and a consumer without one would not.
	ids := slices.Collect(maps.Keys(payIDs))
	if c := count(t, s.payDB, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1) AND event_type = $2`, ids, contract.PaymentSucceeded); c != int64(len(ids)) {
		t.Errorf("%d PaymentSucceeded rows for %d payments, want one each", c, len(ids))
	}
	// Every payment's event was published (by the drained relay or the
	// restarted one) and credited once.
	eventually(t, 60*time.Second, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE user_id = $1`, user)
		return c == int64(len(tries)), fmt.Sprintf("%d of %d payments credited", c, len(tries))
	})
	if dup := count(t, s.rewDB, `SELECT count(*) FROM (SELECT payment_id FROM cashback_credits WHERE user_id = $1
		GROUP BY payment_id HAVING count(*) > 1) d`, user); dup != 0 {
		t.Errorf("%d payments credited more than once", dup)
	}
	if b, w := walletBalance(t, user), int64(len(tries))*200; b != w {
		t.Errorf("wallet of %s = %d paise, want %d (2%% of ₹100, %d times)", user, b, w, len(tries))
	}
}

// Scenario 19c. SIGTERM to notifications while its call to the SMS
// provider hangs (3 s): the drain waits for the call, records SENT and
// exits 0. Nothing is left SENDING for a reconciler to look up after the
// restart, and the provider saw one request.
func TestSIGTERMDuringAHangingSMSCallWaitsForItRecordsSentAndExitsZero(t *testing.T) {
	l := local(t)
	restartWith(t, "notifications")
	user := id("u_e2e19c")
	// Aimed at this user's SMS: 19b's, still in flight, must not spend it.
	smsControl(t, map[string]any{"hang_ms": 3000, "hang_next": 1, "hang_after_accept": false, "to": user})
	t.Cleanup(func() { smsControl(t, map[string]any{"hang_next": 0, "to": ""}) })

	p := pay(t, user, 120000)
	waitCredits(t, p.ID, 1)
	ce := outboxEventID(t, s.rewDB, p.ID, contract.CashbackCredited)
	eventually(t, 30*time.Second, func() (bool, string) {
		n, ok := notificationOf(t, ce)
		return ok && n.Status == "SENDING", fmt.Sprintf("notification of %s: %+v (found %v), want SENDING (the call hanging)", ce, n, ok)
	})
	t0 := time.Now()
	if err := l.Stop("notifications"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	st := l.ExitState("notifications")
	if st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("notifications after SIGTERM: %v after %v; want a clean exit (status 0); see %s", st, took, l.LogPath("notifications"))
	}
	n, ok := notificationOf(t, ce)
	if !ok || n.Status != "SENT" || n.Attempts != 1 {
		t.Fatalf("after the drain the notification is %+v (found %v), want SENT after 1 call: the hanging call was cut off", n, ok)
	}
	t.Logf("notifications drained the hanging call and exited in %v", took.Round(time.Millisecond))
	if err := l.Start("notifications"); err != nil {
		t.Fatal(err)
	}
	smsOnce(t, ce, 1)
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
}
