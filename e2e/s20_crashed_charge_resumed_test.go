package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 20. Payments is SIGKILLed between Stripe's charge and the
// commit of the payment, and the client never retries: the card is
// charged and nothing records it. Restarted, payments' resume task takes
// the key over once its lease has expired and repeats the charge under the
// same Stripe key (pi:<payment id>, which answers with the first charge),
// then commits the payment and its event: one payment, one credit, one
// SMS, with no request from anyone. The client's retry, a day later or a
// minute, replays that payment. A recording proxy in front of Stripe shows
// the charge was made before the kill, and that every charge, the first
// and the resumed one, went under that one key: the card is charged once.
func TestAChargeCrashedBeforeItsCommitIsRecordedWithoutAClientRetryAndCreditedOnce(t *testing.T) {
	l := local(t)
	rec, proxy := newStripeRecorder(t)
	lease := []string{"IDEMPOTENCY_LOCK_TIMEOUT=2s", "STRIPE_TIMEOUT=1s", "STRIPE_URL=" + proxy.URL}
	user := id("u_e2e20")
	restartWith(t, "payments", append(lease, "FAILPOINTS=after-charge-before-commit="+user)...)
	key := "k_" + s.run + "_" + randomHex(8)
	body := `{"user_id":"` + user + `","amount_paise":120000,"currency":"INR","method":"upi"}`
	post := func() (int, []byte, error) {
		req, _ := http.NewRequest(http.MethodPost, s.paymentsURL+"/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		authorize(req)
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	if code, b, err := post(); err == nil {
		t.Fatalf("the request answered %d %s; want the process killed after the charge, before the commit", code, b)
	}
	if killed, err := l.WaitExit("payments", 10*time.Second); err != nil || !killed {
		t.Fatalf("payments: killed by a signal = %v, err = %v; want SIGKILL at after-charge-before-commit", killed, err)
	}
	var paymentID string
	if err := s.payDB.QueryRow(bg(), `SELECT resource_id FROM idempotency_keys WHERE key = $1 AND response_code IS NULL`, key).Scan(&paymentID); err != nil {
		t.Fatalf("the crashed attempt's key: %v", err)
	}
	if n := count(t, s.payDB, `SELECT count(*) FROM payments WHERE id = $1`, paymentID); n != 0 {
		t.Fatalf("payment %s recorded before the restart (%d rows): the crash point was not between the charge and the commit", paymentID, n)
	}
	stripeKey := "pi:" + paymentID
	if c := rec.charges(); len(c) != 1 || c[stripeKey] < 1 {
		t.Fatalf("charges at Stripe before the restart, by key: %v; want one, under %s", c, stripeKey)
	}

	// Restarted with no client anywhere: the resume task records it.
	if err := l.Start("payments", append(lease, "FAILPOINTS=")...); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		n := count(t, s.payDB, `SELECT count(*) FROM payments WHERE id = $1 AND user_id = $2 AND amount_paise = 120000`, paymentID, user)
		return n == 1, fmt.Sprintf("payment %s not recorded by the resume task", paymentID)
	})
	waitLog(t, "payments", 1, "idempotency: resuming an operation whose attempt crashed", paymentID)
	pipelineOnce(t, paymentID, 2400)
	if n := count(t, s.payDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = $2`, paymentID, contract.PaymentSucceeded); n != 1 {
		t.Errorf("%d PaymentSucceeded rows for %s, want 1", n, paymentID)
	}

	// The client's late retry replays the recorded payment.
	code, b, err := post()
	if err != nil || code != http.StatusCreated {
		t.Fatalf("the client's retry: %d %s %v; want 201", code, b, err)
	}
	if p := decode[payment](t, b); p.ID != paymentID {
		t.Errorf("the retry answered payment %s, want the resumed %s", p.ID, paymentID)
	}
	// The resume repeated the charge under the first one's key (Stripe
	// answers it with the first charge); the replay charged nothing.
	if c := rec.charges(); len(c) != 1 || c[stripeKey] < 2 {
		t.Errorf("charges at Stripe by key after the resume and the retry: %v; want the first and the resumed, all under %s", c, stripeKey)
	}
	if n := count(t, s.payDB, `SELECT count(*) FROM payments WHERE user_id = $1`, user); n != 1 {
		t.Errorf("%d payments for %s, want 1", n, user)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
}
