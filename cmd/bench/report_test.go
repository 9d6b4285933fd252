package main

import (
	"strings"
	"testing"
)

// A ratio is the median of the per-round ratios, and a ratio target is met
// only when their lower quartile meets it: rounds whose median passes but
// whose lower quartile does not are a miss.
func TestARatioTargetIsJudgedOnTheLowerQuartileOfThePerRoundRatios(t *testing.T) {
	var r report
	base := &Ref{Key: "bare", Value: 100, Rounds: []float64{100, 100, 100, 100, 100}}
	row := r.add(&Row{Key: "lib", Value: 90, Rounds: []float64{70, 75, 92, 93, 94}, Baseline: base, Target: minRatio(0.9)})
	if row.Ratio != 0.92 {
		t.Errorf("ratio = %v, want the median of the per-round ratios, 0.92", row.Ratio)
	}
	if row.Met == nil || *row.Met {
		t.Errorf("met = %v, want false: the lower quartile, 0.75, is under 0.9", row.Met)
	}
	if len(r.Notes) != 0 {
		t.Errorf("notes %q for rows of matching rounds", r.Notes)
	}
	row = r.add(&Row{Key: "lib2", Value: 95, Rounds: []float64{91, 92, 95, 96, 97}, Baseline: base, Target: minRatio(0.9)})
	if row.Met == nil || !*row.Met {
		t.Errorf("met = %v, want true: the lower quartile is over 0.9", row.Met)
	}
}

// A baseline without matching rounds (a constant, a single value) gives a
// ratio of the two values, and the report says so instead of passing it
// off as a ratio of interleaved rounds.
func TestARatioWithoutMatchingRoundsIsNamedInTheNotes(t *testing.T) {
	var r report
	row := r.add(&Row{Key: "drain_vs_before", Value: 1300, Rounds: []float64{1200, 1300, 1400},
		Baseline: &Ref{Key: "before", Value: 200}, Target: minRatio(3)})
	if row.Ratio != 6.5 || row.Met == nil || !*row.Met {
		t.Errorf("ratio = %v, met = %v; want 6.5, true", row.Ratio, row.Met)
	}
	if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "drain_vs_before") {
		t.Errorf("notes = %q, want one naming drain_vs_before", r.Notes)
	}
}
