// Package terms holds the terms of the cashback scheme as pure functions,
// with no database and no queue: which payment events earn cashback (a
// payload decoded and checked, DecodeSucceeded and DecodeRefunded), how
// much (Amount), and the payloads of the CashbackCredited and
// CashbackReversed events that record it. Package cashback applies them
// exactly once; another consumer of the same events (a store other than
// PostgreSQL, say) can share them without the rest of the service.
package terms

import (
	"errors"
	"math/bits"
)

// MaxRateBP is 100% in basis points.
const MaxRateBP = 10_000

// Amount is the cashback on amountPaise at rateBP basis points, in integer
// paise: floor(amountPaise * rateBP / 10000). Rounding is always down (a
// fraction of a paisa is never credited), so the cashback never exceeds the
// advertised rate: 2% of 120000 is 2400; 2% of 12345 (246.9) is 246.
// The product is computed in 128 bits, so no int64 amount overflows.
func Amount(amountPaise int64, rateBP int) (int64, error) {
	if amountPaise <= 0 {
		return 0, errors.New("cashback: amount_paise must be positive")
	}
	if rateBP < 0 || rateBP > MaxRateBP {
		return 0, errors.New("cashback: rate_bp must be within 0..10000")
	}
	hi, lo := bits.Mul64(uint64(amountPaise), uint64(rateBP))
	q, _ := bits.Div64(hi, lo, MaxRateBP) // hi < 10000 since rateBP <= 10000: no overflow
	return int64(q), nil                  // <= amountPaise, so it fits
}
