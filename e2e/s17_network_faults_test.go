package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// The sharp cases of a misbehaving network, each a scenario of its own so
// that make test runs them (the soak mixes them at random). The services
// reach PostgreSQL, SQS and the SMS provider through Toxiproxy proxies in
// this process (internal/faults) when a scenario asks for it.

var proxies struct {
	once sync.Once
	fx   *faults.Server
}

// viaProxy puts a proxy in front of what the suite's variable key (a
// database, SQS or SMS provider URL) points at, and returns it with the
// KEY=URL entry that sends a service through it.
func viaProxy(t testing.TB, key string) (*faults.Proxy, string) {
	t.Helper()
	local(t)
	proxies.once.Do(func() { proxies.fx = faults.New() })
	raw := s.env[key]
	hp, err := faults.HostPort(raw)
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxies.fx.Proxy(fmt.Sprintf("%s-%s-%s", key, t.Name(), randomHex(2)), hp)
	if err != nil {
		t.Fatal(err)
	}
	u, err := faults.ViaProxy(raw, px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Restore(); px.Clear() })
	return px, key + "=" + u
}

// outageLength is how long the scenarios' outages last: E2E_OUTAGE, else
// 20 s, longer than SQS needs to dead-letter a message that fails on every
// receive with the scenario's retry settings (1+2+4+4+4 s to the 6th
// receive). The soak runs the real lengths.
func outageLength(t testing.TB) time.Duration {
	if d, err := time.ParseDuration(os.Getenv("E2E_OUTAGE")); err == nil && d > 0 {
		return d
	}
	return 20 * time.Second
}

// readyzStatus is the service's /readyz status code and body.
func readyzStatus(t testing.TB, baseURL string) (int, string) {
	t.Helper()
	code, _, b := do(t, http.MethodGet, baseURL+"/readyz", nil, nil)
	return code, string(b)
}

// inQueue counts the messages of queueURL whose event_id is in ids (the
// queue must have no consumer: it reads every visible message).
func inQueue(t testing.TB, queueURL string, ids []uuid.UUID) int {
	t.Helper()
	return len(peek(t, queueURL, withEventID(ids...)))
}

// Rewards commits a credit and the connection drops before COMMIT's answer
// reaches it, so it cannot know the credit exists. The message goes back to
// the queue; the redelivery finds the dedupe row and is a Duplicate:
// exactly one credit, one CashbackCredited, one SMS.
func TestTheCommitsAnswerIsLostAndTheRedeliveryIsADuplicateWithExactlyOneCredit(t *testing.T) {
	db, env := viaProxy(t, "REWARDS_DATABASE_URL")
	restartWith(t, "rewards", env)
	user, payID := id("u_e2e17a"), id("pay_e2e17a")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	cuts0 := faults.Cuts()
	if _, err := db.Add(faults.CutOnReply("COMMIT\x00", 1)); err != nil {
		t.Fatal(err)
	}
	send(t, s.payQ, e)
	eventually(t, 30*time.Second, func() (bool, string) {
		return faults.Cuts() == cuts0+1, "the COMMIT answer was not cut yet"
	})
	pipelineOnce(t, payID, 2400)
	eventually(t, 30*time.Second, func() (bool, string) {
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
		return d >= 1, fmt.Sprintf("rewards saw %v duplicates, want the redelivery to be one", d)
	})
	// The attempt whose answer was lost counts as failed, not applied:
	// rewards never learnt that it committed.
	if a := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied"); a != 0 {
		t.Errorf("rewards counted %v messages applied, want 0 (the only commit's answer was lost)", a)
	}
	if n := processed(t, e.EventID); n != 1 {
		t.Errorf("%d dedupe rows for %s, want 1", n, e.EventID)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
	if n := inQueue(t, s.payDLQ, []uuid.UUID{e.EventID}); n != 0 {
		t.Errorf("the event is in the DLQ %d times, want 0", n)
	}
}

// Rewards' database is unreachable for outageLength (2 minutes in the
// soak) while 500 payment events wait. The subscriber stops receiving,
// /readyz fails its consumer check, nothing reaches the DLQ, and once the
// database answers, the 500 are credited exactly once each.
func TestADatabaseOutageLongerThanTheDeadLetterScheduleParksNothingAndEveryPaymentIsCreditedAfter(t *testing.T) {
	db, env := viaProxy(t, "REWARDS_DATABASE_URL")
	restartWith(t, "rewards", env, "SUBSCRIBER_RETRY_BASE=1s", "SUBSCRIBER_RETRY_MAX=4s")
	outage := outageLength(t)
	const n = 500
	user := id("u_e2e17b")
	evs := make([]events.Envelope, n)
	ids := make([]uuid.UUID, n)
	for i := range evs {
		evs[i] = paymentEvent(t, contract.PaymentSucceeded, fmt.Sprintf("%s_%d", id("pay_e2e17b"), i), user, 10000, 1)
		ids[i] = evs[i].EventID
	}
	db.Cut()
	t0 := time.Now()
	sendMany(t, s.payQ, evs)
	paused := ""
	for time.Now().Before(t0.Add(outage)) {
		if code, body := readyzStatus(t, s.rewardsURL); code == http.StatusServiceUnavailable && strings.Contains(body, `"consumer":"failing"`) {
			paused = body
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := db.Restore(); err != nil {
		t.Fatal(err)
	}
	t.Logf("database back after %v", time.Since(t0).Round(time.Millisecond))
	// Done when all are credited, or when the source queue is empty
	// (whatever is not credited then went to the DLQ).
	eventually(t, 90*time.Second, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE user_id = $1`, user)
		return c == n || depth(t, s.payQ) == 0, fmt.Sprintf("%d of %d payments credited", c, n)
	})
	if d := inQueue(t, s.payDLQ, ids); d != 0 {
		t.Fatalf("%d of the %d events were dead-lettered by a %v outage; want 0", d, n, outage)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE user_id = $1`, user)
		return c == n, fmt.Sprintf("%d of %d payments credited", c, n)
	})
	t.Logf("%d credits %v after the outage began", n, time.Since(t0).Round(time.Millisecond))
	if c := count(t, s.rewDB, `SELECT count(DISTINCT payment_id) FROM cashback_credits WHERE user_id = $1`, user); c != n {
		t.Errorf("%d distinct payments credited, want %d", c, n)
	}
	if b := walletBalance(t, user); b != n*200 {
		t.Errorf("wallet = %d paise, want %d", b, n*200)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		return depth(t, s.payQ) == 0, fmt.Sprintf("payments-events still holds %d messages", depth(t, s.payQ))
	})
	if d := inQueue(t, s.payDLQ, ids); d != 0 {
		t.Fatalf("%d of the %d events were dead-lettered by a %v outage; want 0", d, n, outage)
	}
	if paused == "" {
		t.Error("rewards /readyz never failed its consumer check during the outage")
	}
	if code, body := readyzStatus(t, s.rewardsURL); code != http.StatusOK {
		t.Errorf("rewards /readyz = %d %s after the outage, want 200", code, body)
	}
}

// The SMS provider is unreachable for outageLength/2 (a minute in the
// soak) while cashback keeps being credited. Nothing is sent meanwhile;
// once it is back every credit gets exactly one SMS, under its key.
func TestTheSMSProviderDownForAMinuteEndsWithOneSMSPerCredit(t *testing.T) {
	provider, env := viaProxy(t, "SMS_PROVIDER_URL")
	restartWith(t, "notifications", env)
	provider.Cut()
	t0 := time.Now()
	const n = 20
	user := id("u_e2e17c")
	payIDs := make([]string, n)
	for i := range payIDs {
		payIDs[i] = pay(t, user, 120000).ID
	}
	ces := make([]uuid.UUID, n)
	for i, p := range payIDs {
		waitCredits(t, p, 1)
		ces[i] = outboxEventID(t, s.rewDB, p, contract.CashbackCredited)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = ANY($1)`, ces)
		return c == n, fmt.Sprintf("%d of %d SMS intents recorded", c, n)
	})
	time.Sleep(time.Until(t0.Add(outageLength(t) / 2)))
	if c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = ANY($1) AND status = 'SENT'`, ces); c != 0 {
		t.Fatalf("%d SMS SENT while the provider was unreachable", c)
	}
	if err := provider.Restore(); err != nil {
		t.Fatal(err)
	}
	// The provider keeps one SMS per key, so "one SMS" is read off the
	// requests: none reached it while it was cut, so each key's first
	// request after is its only one, and the outage cost no attempt.
	for _, ce := range ces {
		var nt notification
		eventually(t, 90*time.Second, func() (bool, string) {
			var ok bool
			nt, ok = notificationOf(t, ce)
			return ok && nt.Status == "SENT", fmt.Sprintf("notification of %s: %+v", ce, nt)
		})
		smsOnce(t, ce, 1)
		if nt.Attempts != 1 {
			t.Errorf("notification of %s: %d attempts, want 1 (calls that met the outage are not attempts)", ce, nt.Attempts)
		}
	}
}

// Two payments relays and two rewards replicas share the work; one of each
// is killed (SIGKILL) in the middle of a batch, at the worst point of it:
// the relay after its third batch is on the queue and before it is marked,
// the consumer after its tenth effect is committed and before the message
// is deleted. Every payment is still credited exactly once and gets
// exactly one SMS, and the copies the kills left behind come back to the
// surviving consumer as duplicates.
func TestTwoRelaysAndTwoConsumersOneOfEachKilledMidBatchStillCreditEveryPaymentOnce(t *testing.T) {
	l := local(t)
	for _, r := range []struct{ name, base, failpoint string }{
		{"payments-relay-2", "payments", "FAILPOINTS=after-publish-before-mark@3"},
		{"rewards-2", "rewards", "FAILPOINTS=after-commit-before-delete@10"},
	} {
		env := []string{r.failpoint}
		if r.base == "payments" {
			env = append(env, "ROLE=relay")
		}
		if err := l.StartAs(r.name, r.base, env...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Stop(r.name) })
	}
	dup0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
	const n = 200
	user := id("u_e2e17d")
	payIDs := make([]string, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				payIDs[i] = pay(t, user, 120000).ID
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	for _, name := range []string{"payments-relay-2", "rewards-2"} {
		if killed, err := l.WaitExit(name, 60*time.Second); err != nil || !killed {
			t.Fatalf("%s: killed by a signal = %v, err = %v; want SIGKILL at its failpoint, mid-batch", name, killed, err)
		}
	}
	eventually(t, 90*time.Second, func() (bool, string) {
		c := count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE user_id = $1`, user)
		return c == n, fmt.Sprintf("%d of %d payments credited", c, n)
	})
	if c := count(t, s.rewDB, `SELECT count(DISTINCT payment_id) FROM cashback_credits WHERE user_id = $1`, user); c != n {
		t.Errorf("%d distinct payments credited, want %d", c, n)
	}
	if b := walletBalance(t, user); b != n*2400 {
		t.Errorf("wallet = %d paise, want %d", b, n*2400)
	}
	ces := query(t, s.rewDB, pgx.RowTo[uuid.UUID], `SELECT id FROM outbox WHERE event_type = 'CashbackCredited' AND aggregate_id = ANY($1)`, payIDs)
	if len(ces) != n {
		t.Fatalf("rewards outbox holds %d CashbackCredited for the %d payments, want %d", len(ces), n, n)
	}
	eventually(t, 90*time.Second, func() (bool, string) {
		c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE status = 'SENT' AND event_id = ANY($1)`, ces)
		return c == n, fmt.Sprintf("%d of %d SMS SENT", c, n)
	})
	for _, ce := range ces {
		smsOnce(t, ce, 1) // notifications was not disturbed: one request each
	}
	// The killed relay's batch is sent again by the other once its lease
	// runs out, and the killed consumer's undeleted message comes back
	// after its visibility timeout: the surviving rewards takes them for
	// what they are.
	eventually(t, 60*time.Second, func() (bool, string) {
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate") - dup0
		return d >= 1, fmt.Sprintf("the surviving rewards saw %v duplicates, want the copies the kills left behind", d)
	})
}
