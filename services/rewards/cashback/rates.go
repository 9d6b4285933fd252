package cashback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Rate is one row of cashback_rates: rate_bp is in force from
// effective_from until the next row's effective_from.
type Rate struct {
	EffectiveFrom time.Time `json:"effective_from"`
	RateBP        int       `json:"rate_bp"`
}

// ErrNoRate means no rate was in force at the event's time. It is not
// permanent: an operator can add a rate and the redelivery will apply.
var ErrNoRate = errors.New("cashback: no cashback rate in force at occurred_at")

// RateAt is the rate in force at t (rule 4: t is the event's occurred_at).
func RateAt(ctx context.Context, q pgx.Tx, t time.Time) (int, error) {
	var bp int
	err := q.QueryRow(ctx, `SELECT rate_bp FROM cashback_rates WHERE effective_from <= $1
		ORDER BY effective_from DESC LIMIT 1`, t).Scan(&bp)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w (%s)", ErrNoRate, t.Format(time.RFC3339Nano))
	}
	return bp, err
}

// Rates lists the rate history, oldest first.
func Rates(ctx context.Context, pool *pgxpool.Pool) ([]Rate, error) {
	rows, err := pool.Query(ctx, `SELECT effective_from, rate_bp FROM cashback_rates ORDER BY effective_from`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Rate])
}

// ErrRetroactiveRate refuses a rate that would take effect in the past:
// it would change what an in-flight retry credits for a payment that has
// already happened, which is exactly what rule 4 forbids.
var ErrRetroactiveRate = errors.New("cashback: a new rate cannot take effect in the past")

// ErrRateExists: a rate already starts at that instant.
var ErrRateExists = errors.New("cashback: a rate already takes effect at that time")

// AddRate schedules rateBP from effectiveFrom on (zero: now, by the
// database clock). effective_from must not lie in the past.
func AddRate(ctx context.Context, pool *pgxpool.Pool, effectiveFrom time.Time, rateBP int) (Rate, error) {
	if rateBP < 0 || rateBP > MaxRateBP {
		return Rate{}, errors.New("cashback: rate_bp must be within 0..10000")
	}
	var from *time.Time
	if !effectiveFrom.IsZero() {
		from = &effectiveFrom
	}
	var r Rate
	// A second of slack absorbs clock skew between caller and database.
	err := pool.QueryRow(ctx, `INSERT INTO cashback_rates (effective_from, rate_bp)
		SELECT coalesce($1, now()), $2 WHERE coalesce($1, now()) >= now() - interval '1 second'
		RETURNING effective_from, rate_bp`, from, rateBP).Scan(&r.EffectiveFrom, &r.RateBP)
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Rate{}, ErrRetroactiveRate
	case errors.As(err, &pe) && pe.Code == "23505":
		return Rate{}, ErrRateExists
	}
	return r, err
}
