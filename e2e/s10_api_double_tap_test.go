package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"
)

// stripeRecorder is a reverse proxy in front of stripe-mock that records
// every request the payments service makes to "Stripe".
type stripeRecorder struct {
	mu   sync.Mutex
	reqs []stripeRequest
}

type stripeRequest struct {
	Method, Path, IdempotencyKey string
}

// newStripeRecorder puts a recording proxy in front of the stack's Stripe
// (stripe-mock) and returns it with the recorder.
func newStripeRecorder(t *testing.T) (*stripeRecorder, *httptest.Server) {
	target := s.env["STRIPE_URL"]
	if target == "" {
		target = "http://127.0.0.1:12111"
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rec := &stripeRecorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, stripeRequest{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key")})
		rec.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return rec, srv
}

// charges are the POST /v1/payment_intents requests, by idempotency key.
func (r *stripeRecorder) charges() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, q := range r.reqs {
		if q.Method == http.MethodPost && q.Path == "/v1/payment_intents" {
			out[q.IdempotencyKey]++
		}
	}
	return out
}

// Scenario 10. A client double-taps: the same Idempotency-Key, the same
// body, 20 times at once. One payment row, one charge at Stripe (counted
// by a recording proxy in front of stripe-mock), one PaymentSucceeded, one
// credit; every answer is the same payment (201) or "still in flight"
// (409), and a later retry replays it. A second key for the same cart is
// a second payment: the API's protection is the client's key, not the
// cart (documented).
func TestTwentyConcurrentRequestsWithOneIdempotencyKeyMakeOnePaymentOneChargeOneEvent(t *testing.T) {
	local(t)
	rec, proxy := newStripeRecorder(t)
	restartWith(t, "payments", "STRIPE_URL="+proxy.URL)

	user := id("u_e2e10")
	c := upi(user, 120000)
	key := id("tap")
	body, _ := json.Marshal(c)
	type answer struct {
		code     int
		id       string
		replayed bool
	}
	answers := make([]answer, 20)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest(http.MethodPost, s.paymentsURL+"/v1/payments", bytes.NewReader(body))
			authorize(req)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("tap %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			a := answer{code: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
			if a.code == http.StatusCreated {
				var p payment
				_ = json.Unmarshal(b, &p)
				a.id = p.ID
			}
			answers[i] = a
		})
	}
	close(start)
	wg.Wait()

	byCode := map[int]int{}
	ids := map[string]bool{}
	for _, a := range answers {
		byCode[a.code]++
		if a.code == http.StatusCreated {
			ids[a.id] = true
		}
	}
	t.Logf("20 concurrent taps: %v by status (201 created or replayed, 409 still in flight)", byCode)
	if byCode[http.StatusCreated] < 1 || byCode[http.StatusCreated]+byCode[http.StatusConflict] != 20 {
		t.Fatalf("answers by status %v: want only 201 and 409, at least one 201", byCode)
	}
	if len(ids) != 1 {
		t.Fatalf("201 answers name %d payments, want 1: %v", len(ids), ids)
	}
	var payID string
	for id := range ids {
		payID = id
	}
	// A later retry of the same tap replays the saved answer.
	code, h, b := do(t, http.MethodPost, s.paymentsURL+"/v1/payments", map[string]string{"Idempotency-Key": key}, c)
	if code != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || decode[payment](t, b).ID != payID {
		t.Errorf("retry after the taps: %d replayed=%q %s; want 201 replayed %s", code, h.Get("Idempotent-Replayed"), b, payID)
	}

	if n := count(t, s.payDB, `SELECT count(*) FROM payments WHERE user_id = $1`, user); n != 1 {
		t.Errorf("%d payments for %s, want 1", n, user)
	}
	if ch := rec.charges(); len(ch) != 1 || ch["pi:"+payID] != 1 {
		t.Errorf("Stripe saw charges %v, want exactly one, under pi:%s", ch, payID)
	}
	if n := count(t, s.payDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, payID); n != 1 {
		t.Errorf("%d events for %s, want 1 (PaymentSucceeded)", n, payID)
	}
	pipelineOnce(t, payID, 2400)

	// Another key, the same cart: a second payment, by design.
	second := pay(t, user, 120000)
	if second.ID == payID {
		t.Fatalf("a second key replayed the first payment %s", payID)
	}
	pipelineOnce(t, second.ID, 2400)
	if n := count(t, s.payDB, `SELECT count(*) FROM payments WHERE user_id = $1`, user); n != 2 {
		t.Errorf("%d payments for %s after a second key, want 2", n, user)
	}
	if ch := rec.charges(); len(ch) != 2 || ch["pi:"+second.ID] != 1 {
		t.Errorf("Stripe saw charges %v, want two, one each", ch)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		b := walletBalance(t, user)
		return b == 4800, fmt.Sprintf("wallet of %s = %d paise, want 4800 (two payments)", user, b)
	})
}
