package terms

import (
	"math"
	"testing"
)

func TestAmountRoundsDownInIntegerPaise(t *testing.T) {
	for _, tc := range []struct {
		amount int64
		bp     int
		want   int64
	}{
		{120000, 200, 2400}, // ₹1,200 at 2% = ₹24
		{120000, 300, 3600},
		{12345, 200, 246}, // 246.9 paise: the fraction is not credited
		{49, 200, 0},      // 0.98 paise
		{50, 200, 1},
		{1, 10000, 1},
		{math.MaxInt64, 10000, math.MaxInt64}, // no overflow: 128-bit product
		{math.MaxInt64, 200, math.MaxInt64 / 50},
	} {
		got, err := Amount(tc.amount, tc.bp)
		if err != nil || got != tc.want {
			t.Errorf("Amount(%d, %d) = %d, %v; want %d", tc.amount, tc.bp, got, err, tc.want)
		}
	}
	for _, bad := range [][2]int64{{0, 200}, {-5, 200}, {100, -1}, {100, 10001}} {
		if _, err := Amount(bad[0], int(bad[1])); err == nil {
			t.Errorf("Amount(%d, %d) succeeded, want an error", bad[0], bad[1])
		}
	}
}
