package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
)

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

// The self-check counts the story's own event only: lines of other
// events (a concurrent payment's, say) and lines merely mentioning the id
// change nothing.
func TestEventOutcomesCountOnlyThisEventsLines(t *testing.T) {
	ev, other := uuid.MustParse("01a23790-36a5-7633-a1f0-086b85881942"), uuid.MustParse("01a23790-36a5-7633-a1f0-086b85881943")
	log := strings.Join([]string{
		`{"level":"INFO","msg":"payment event applied","event_id":"` + ev.String() + `"}`,
		`{"level":"INFO","msg":"duplicate copy acked: already applied","event_id":"` + ev.String() + `"}`,
		`{"level":"INFO","msg":"duplicate copy acked: already applied","event_id":"` + ev.String() + `"}`,
		`{"level":"INFO","msg":"payment event applied","event_id":"` + other.String() + `"}`,
		`{"level":"INFO","msg":"duplicate copy acked: already applied","event_id":"` + other.String() + `"}`,
		`{"level":"INFO","msg":"payment event applied","note":"` + ev.String() + `"}`,
		`not json ` + ev.String(),
	}, "\n")
	path := filepath.Join(t.TempDir(), "rewards.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	applied, dups, err := eventOutcomes(path, ev)
	if err != nil || applied != 1 || dups != 2 {
		t.Errorf("eventOutcomes = %d applied, %d duplicates, %v; want 1 and 2", applied, dups, err)
	}
}

func TestCheck(t *testing.T) {
	good := result{status: "SUCCEEDED", delivered: 3, applied: 1, dedupeRows: 1, credits: 1, creditPaise: 2400, rateBP: 200, rateInForce: 200,
		balanceBefore: 4800, balance: 7200, creditsSum: 7200, smsRows: 1, smsStatus: "SENT", providerDeliveries: 1}
	if p := good.check(); len(p) != 0 {
		t.Fatalf("check of the story = %v, want nothing wrong", p)
	}
	bad := good
	bad.credits, bad.applied, bad.balance = 2, 2, 9600
	if p := bad.check(); len(p) != 4 {
		t.Fatalf("check of a double credit = %q, want 4 problems (applied, credits, balance vs credits, wallet delta)", p)
	}
	// A rate of 3% changed by hand before the story: 3% of ₹1,200 is right.
	byHand := good
	byHand.rateInForce, byHand.rateBP, byHand.creditPaise, byHand.balance, byHand.creditsSum = 300, 300, 3600, 8400, 8400
	if p := byHand.check(); len(p) != 0 {
		t.Fatalf("check of the story at 3%% = %v, want nothing wrong", p)
	}
	stale := good
	stale.rateInForce = 300
	if p := stale.check(); len(p) != 3 {
		t.Fatalf("check of a 2%% credit while 3%% was in force = %q, want 3 problems (rate, cashback, wallet delta)", p)
	}
}
