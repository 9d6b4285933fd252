package main

import "testing"

func TestINR(t *testing.T) {
	for paise, want := range map[int64]string{
		0: "₹0.00", 2400: "₹24.00", 120000: "₹1,200.00", 5: "₹0.05",
		10000000: "₹1,00,000.00", 1234567890: "₹1,23,45,678.90", -2400: "-₹24.00",
	} {
		if got := inr(paise); got != want {
			t.Errorf("inr(%d) = %s, want %s", paise, got, want)
		}
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP idempotent_messages_total Messages seen
# TYPE idempotent_messages_total counter
idempotent_messages_total{consumer="rewards",otel_scope_name="x",outcome="applied"} 1
idempotent_messages_total{consumer="rewards",otel_scope_name="x",outcome="duplicate"} 2
idempotent_messages_total{consumer="other",otel_scope_name="x",outcome="applied"} 7
sqs_messages_received_total{otel_scope_name="y",queue="payments-events"} 3
`
	for sel, want := range map[string]float64{
		mApplied: 1, mDuplicate: 2, mReceived: 3,
		`idempotent_messages_total{outcome="applied"}`: 8,
		`idempotent_messages_total`:                    10,
		`nothing_total`:                                0,
	} {
		if got := sumMetric(text, sel); got != want {
			t.Errorf("sumMetric(%s) = %v, want %v", sel, got, want)
		}
	}
}

func TestCheck(t *testing.T) {
	good := result{status: "SUCCEEDED", delivered: 3, applied: 1, dedupeRows: 1, credits: 1, creditPaise: 2400,
		balanceBefore: 4800, balance: 7200, creditsSum: 7200, smsRows: 1, smsStatus: "SENT", providerDeliveries: 1}
	if p := good.check(); len(p) != 0 {
		t.Fatalf("check of the story = %v, want nothing wrong", p)
	}
	bad := good
	bad.credits, bad.applied, bad.balance = 2, 2, 9600
	if p := bad.check(); len(p) != 4 {
		t.Fatalf("check of a double credit = %q, want 4 problems (applied, credits, balance vs credits, wallet delta)", p)
	}
}
