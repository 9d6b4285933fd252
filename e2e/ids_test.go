package e2e

import "testing"

// The scenarios name their payments, users and keys with id, thousands per
// scenario (19 sends 2,000 payments), and a rerun with -count shares the
// run's prefix. Two equal payment ids are one payment to rewards, so a
// collision reads as a lost credit; 100,000 ids must all differ (at 24
// random bits about 300 of them did not).
func TestIDsAreUniqueAcrossAScenarioAndItsReruns(t *testing.T) {
	const n = 100_000
	seen := make(map[string]bool, n)
	for range n {
		v := id("pay_ids")
		if seen[v] {
			t.Fatalf("id returned %s twice in %d calls", v, len(seen)+1)
		}
		seen[v] = true
	}
}
