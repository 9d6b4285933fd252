// Package cashback is the rewards service's domain: it turns payment events
// into cashback credits, wallet movements and CashbackCredited /
// CashbackReversed events, each exactly once.
//
// Every payment event is applied through an idempotent.Consumer named
// "rewards", so the dedupe row (rewards, event_id), the credit, the wallet
// change and the outbox row commit in one transaction or not at all. Behind
// the dedupe key stand two more guards:
//
//   - the business key: cashback_credits.payment_id is UNIQUE, so the same
//     payment under a second event id (a buggy upstream) credits nothing
//     the second time; that copy is logged as a warning and acked;
//   - versioned state per payment (payment_versions): a refund is terminal.
//     PaymentRefunded reverses the credit once; a PaymentSucceeded copy that
//     arrives after the refund (stale, or overtaken by it) credits nothing.
//
// The rate is the one in force at the event's occurred_at (cashback_rates),
// never "now", so a retry after a rate change credits what the first
// attempt would have.
package cashback

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
