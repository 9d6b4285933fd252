package idempotent

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// WithNow sets a Consumer's clock, for tests that skew it.
func WithNow(now func() time.Time) Option { return func(c *Consumer) { c.now = now } }

// EnsurePartitionsAt is EnsurePartitions by a clock that reads now: what
// Migrate does on a replica whose clock is skewed.
func EnsurePartitionsAt(ctx context.Context, pool *pgxpool.Pool, now time.Time, retention time.Duration, ahead int) ([]string, error) {
	return ensurePartitionsAt(ctx, pool, now, retention, ahead)
}
