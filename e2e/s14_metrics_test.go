package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 14. The operator's view: each service's /metrics moves by
// exactly what one payment and one duplicate copy of its event drive, and
// the backlog gauges return to zero once the pipeline is idle.
func TestMetricsOnEachServiceMoveByExactlyWhatOnePaymentAndOneDuplicateDrive(t *testing.T) {
	type series struct {
		url, name string
		labels    []string
		delta     float64
	}
	pay0 := []series{
		{s.paymentsURL, "payments_created_total", nil, 1},
		{s.paymentsURL, "outbox_published_total", nil, 1},
		{s.rewardsURL, "idempotent_messages_total", []string{"consumer", "rewards", "outcome", "applied"}, 1},
		{s.rewardsURL, "idempotent_messages_total", []string{"consumer", "rewards", "outcome", "duplicate"}, 1},
		{s.rewardsURL, "sqs_handler_duration_seconds_count", []string{"queue", "payments-events", "result", "ok"}, 2},
		{s.rewardsURL, "sqs_messages_deleted_total", []string{"queue", "payments-events"}, 2},
		{s.rewardsURL, "outbox_published_total", nil, 1},
		{s.notificationsURL, "inbox_received_total", []string{"outcome", "stored"}, 1},
		{s.notificationsURL, "inbox_processed_total", []string{"outcome", "done"}, 1},
		{s.notificationsURL, "notifications_provider_calls_total", []string{"result", "accepted"}, 1},
		{s.notificationsURL, "notifications_transitions_total", []string{"status", "SENT"}, 1},
	}
	before := make([]float64, len(pay0))
	for i, m := range pay0 {
		before[i] = metric(t, m.url, m.name, m.labels...)
	}

	p := pay(t, id("u_e2e14"), 120000)
	pipelineOnce(t, p.ID, 2400)
	e := outboxEventID(t, s.payDB, p.ID, contract.PaymentSucceeded)
	send(t, s.payQ, outboxEnvelope(t, s.payDB, e)) // the duplicate copy
	eventually(t, 30*time.Second, func() (bool, string) {
		got := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
		return got == before[3]+1, fmt.Sprintf("rewards duplicates %v, want %v", got, before[3]+1)
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		var off []string
		for i, m := range pay0 {
			if got := metric(t, m.url, m.name, m.labels...); got-before[i] != m.delta {
				off = append(off, fmt.Sprintf("%s %s%v moved by %v, want %v", m.url, m.name, m.labels, got-before[i], m.delta))
			}
		}
		return len(off) == 0, strings.Join(off, "; ")
	})

	// Idle pipeline: nothing waits, and every gauge an alert watches is there.
	// (Parked messages and reconciled sends are driven by scenarios 6 and 9.)
	eventually(t, 10*time.Second, func() (bool, string) {
		var off []string
		for _, g := range []series{
			{s.paymentsURL, "outbox_unpublished", nil, 0},
			{s.paymentsURL, "outbox_oldest_unpublished_age_seconds", nil, 0},
			{s.rewardsURL, "outbox_unpublished", nil, 0},
			{s.rewardsURL, "outbox_oldest_unpublished_age_seconds", nil, 0},
			{s.notificationsURL, "inbox_pending", []string{"consumer", "notifications"}, 0},
			{s.notificationsURL, "inbox_oldest_pending_age_seconds", []string{"consumer", "notifications"}, 0},
		} {
			if !exposes(t, g.url, g.name) {
				off = append(off, g.name+" missing on "+g.url)
			} else if v := metric(t, g.url, g.name, g.labels...); v != 0 {
				off = append(off, fmt.Sprintf("%s on %s = %v, want 0", g.name, g.url, v))
			}
		}
		return len(off) == 0, strings.Join(off, "; ")
	})
	for _, m := range []struct{ url, name string }{
		{s.paymentsURL, "outbox_publish_failures_total"}, {s.rewardsURL, "outbox_publish_failures_total"},
		{s.rewardsURL, "sqs_handler_duration_seconds_bucket"}, {s.notificationsURL, "inbox_failed"},
	} {
		if !exposes(t, m.url, m.name) {
			t.Errorf("%s does not expose %s", m.url, m.name)
		}
	}
}

// exposes reports whether baseURL/metrics has a sample or the HELP line of
// name (a counter never incremented has only its HELP and TYPE lines).
func exposes(t testing.TB, baseURL, name string) bool {
	t.Helper()
	code, _, b := do(t, http.MethodGet, baseURL+"/metrics", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d", baseURL, code)
	}
	text := string(b)
	base := strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count")
	return strings.Contains(text, "\n"+name+"{") || strings.Contains(text, "\n"+name+" ") ||
		strings.Contains(text, "# HELP "+base+" ")
}
