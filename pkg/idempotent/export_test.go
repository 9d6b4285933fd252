package idempotent

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ClaimIn runs one claim statement of p in tx instead of its own
// transaction, so a test can look at what the statement did to tx; it
// returns how many rows it claimed.
func (p *Processor) ClaimIn(ctx context.Context, tx pgx.Tx) (int, error) {
	rows, err := p.claimOn(ctx, tx, "")
	return len(rows), err
}

// SetGaugeCap bounds the rows the inbox gauges count, for tests; it returns
// a function that restores the previous bound.
func SetGaugeCap(n int64) (restore func()) {
	old := gaugeCap
	gaugeCap = n
	return func() { gaugeCap = old }
}
