package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Scenario 13. One trace through the outbox: the payment's HTTP request,
// its outbox row, the SQS message, Rewards' consumer and its own outbox
// row, Notifications' inbox and the SMS call all share one trace id, as
// the services export it over OTLP (here to an in-memory receiver; in
// compose to Jaeger). The caller's own traceparent is continued.
func TestOnePaymentIsOneTraceFromTheRequestThroughCashbackToTheSMS(t *testing.T) {
	if s.traces == nil {
		t.Skip("needs the local stack's span receiver (E2E_STACK=local)")
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	code, hdr, b := do(t, http.MethodPost, s.paymentsURL+"/v1/payments", map[string]string{
		"Idempotency-Key": id("k"),
		"traceparent":     "00-" + traceID + "-00f067aa0ba902b7-01",
	}, upi(id("u_e2e13"), 120000))
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/payments: %d %s", code, b)
	}
	if hdr.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id on the response")
	}
	p := decode[payment](t, b)
	_, ce := pipelineOnce(t, p.ID, 2400)

	// The trace context travels in the data, not only in memory.
	for _, r := range []struct{ db, what, id string }{
		{"payments", "PaymentSucceeded", p.ID}, {"rewards", "CashbackCredited", p.ID},
	} {
		db := s.payDB
		if r.db == "rewards" {
			db = s.rewDB
		}
		var tp string
		if err := db.QueryRow(bg(), `SELECT headers->>'traceparent' FROM outbox WHERE aggregate_id = $1 AND event_type = $2`,
			r.id, r.what).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(tp, traceID) {
			t.Errorf("%s outbox row %s carries traceparent %q, want trace %s", r.db, r.what, tp, traceID)
		}
	}
	var ntp *string
	if err := s.notDB.QueryRow(bg(), `SELECT traceparent FROM notifications WHERE event_id = $1`, ce).Scan(&ntp); err != nil || ntp == nil || !strings.Contains(*ntp, traceID) {
		t.Errorf("notification of %s carries traceparent %v (err %v), want trace %s", ce, ntp, err, traceID)
	}
	code, _, b = do(t, http.MethodGet, s.smsURL+"/v1/deliveries?idempotency_key_prefix=sms:"+ce.String(), nil, nil)
	if code != http.StatusOK || !strings.Contains(string(b), traceID) {
		t.Errorf("the SMS provider's delivery of sms:%s did not carry trace %s: %d %s", ce, traceID, code, b)
	}

	// The exported spans: every hop, one trace.
	want := []struct {
		service, name string
		kind          tracepb.Span_SpanKind
	}{
		{"payments", "POST /v1/payments", tracepb.Span_SPAN_KIND_SERVER},
		{"payments", "", tracepb.Span_SPAN_KIND_CLIENT}, // a pgx query inside the request
		{"rewards", "process " + contract.PaymentSucceeded, tracepb.Span_SPAN_KIND_CONSUMER},
		{"notifications", "process " + contract.CashbackCredited, tracepb.Span_SPAN_KIND_CONSUMER},
		{"notifications", "inbox process " + contract.CashbackCredited, tracepb.Span_SPAN_KIND_CONSUMER},
		{"notifications", "sms send", tracepb.Span_SPAN_KIND_CLIENT},
	}
	eventually(t, 20*time.Second, func() (bool, string) {
		spans := s.traces.trace(traceID)
		var missing []string
		for _, w := range want {
			found := false
			for _, sp := range spans {
				if sp.Service == w.service && sp.Kind == w.kind && (w.name == "" || sp.Name == w.name) {
					found = true
					break
				}
			}
			if !found {
				missing = append(missing, fmt.Sprintf("%s %q (%v)", w.service, w.name, w.kind))
			}
		}
		return len(missing) == 0, fmt.Sprintf("trace %s has %d spans; missing %s", traceID, len(spans), strings.Join(missing, ", "))
	})
	// Each service's first span hangs off another's: one tree, not three
	// traces that merely share an id.
	eventually(t, 5*time.Second, func() (bool, string) {
		spans := s.traces.trace(traceID)
		known := map[string]bool{"00f067aa0ba902b7": true} // the caller's span
		for _, sp := range spans {
			known[sp.SpanID] = true
		}
		for _, sp := range spans {
			if !known[sp.Parent] {
				return false, fmt.Sprintf("span %s %q has parent %s, which is not in the trace", sp.Service, sp.Name, sp.Parent)
			}
		}
		return true, ""
	})
}
