package cashback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

// Rate is one row of cashback_rates: rate_bp is in force from
// effective_from until the next row's effective_from. CreatedBy is the API
// client that scheduled it ("" for the schema's default rate).
type Rate struct {
	EffectiveFrom time.Time `json:"effective_from"`
	RateBP        int       `json:"rate_bp"`
	CreatedBy     string    `json:"created_by,omitempty"`
}

// ErrNoRate means no rate was in force at the event's time. It is not
// permanent: an operator can add a rate and the redelivery will apply.
var ErrNoRate = errors.New("cashback: no cashback rate in force at occurred_at")

// RateAt is the rate in force at t (rule 4 of docs/design.md: t is the event's occurred_at).
func RateAt(ctx context.Context, q pgx.Tx, t time.Time) (int, error) {
	var bp int
	err := q.QueryRow(ctx, `SELECT rate_bp FROM cashback_rates WHERE effective_from <= $1
		ORDER BY effective_from DESC LIMIT 1`, t).Scan(&bp)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w (%s)", ErrNoRate, t.Format(time.RFC3339Nano))
	}
	return bp, err
}

// Rates lists the rate history, oldest first, in UTC: pgx scans a time in
// the process's zone, where a rate AddRate accepted (before the end of year
// 9999 UTC) may be in year 10000, which JSON cannot carry.
func Rates(ctx context.Context, pool *pgxpool.Pool) ([]Rate, error) {
	rows, err := pool.Query(ctx, `SELECT effective_from, rate_bp, coalesce(created_by, '') FROM cashback_rates ORDER BY effective_from`)
	if err != nil {
		return nil, err
	}
	rates, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Rate])
	for i := range rates {
		rates[i].EffectiveFrom = rates[i].EffectiveFrom.UTC()
	}
	return rates, err
}

// ErrRetroactiveRate refuses a rate that would take effect too soon: in
// the past it would change what an in-flight retry credits for a payment
// that has already happened, which is exactly what rule 4 of docs/design.md forbids; and a
// payment committed a moment ago may not have its event's occurred_at
// behind it yet on every clock. So a rate must start at least
// RateRules.MinLead from now.
var ErrRetroactiveRate = errors.New("cashback: a new rate must take effect in the future, at least the minimum lead from now")

// ErrRateTooLate is returned by AddRate for an effective_from past the end
// of year 9999 UTC: PostgreSQL would store it, but no JSON or RFC 3339
// answer can carry it back, so it would break every listing of the rates.
var ErrRateTooLate = errors.New("cashback: effective_from is past the end of year 9999 UTC")

// ErrRateExists: a rate already starts at that instant.
var ErrRateExists = errors.New("cashback: a rate already takes effect at that time")

// ErrRateAboveCeiling refuses a rate above RateRules.MaxBP.
var ErrRateAboveCeiling = errors.New("cashback: rate_bp above the ceiling")

// RateChange is a new rate and who decided it.
type RateChange struct {
	// EffectiveFrom is when it starts; nil means now + RateRules.MinLead
	// by the database clock. A time given, even the zero time, is checked
	// against the lead like any other.
	EffectiveFrom *time.Time
	RateBP        int
	// Client is the API client making the change, stored as created_by.
	Client string
}

// RateRules bound what a rate change may do.
type RateRules struct {
	// MaxBP is the highest rate accepted (REWARDS_MAX_RATE_BP; defaults to
	// DefaultMaxRateBP). It is a money decision: 10000 would credit the
	// whole payment back.
	MaxBP int
	// MinLead is how far in the future, by the database clock, a rate must
	// start (REWARDS_RATE_MIN_LEAD; defaults to DefaultRateMinLead); it
	// must be positive.
	MinLead time.Duration
}

// Validate refuses rules no rate change could be checked against: a MinLead
// that is not positive, a MaxBP outside 0..terms.MaxRateBP.
func (r RateRules) Validate() error {
	if r.MinLead <= 0 || r.MaxBP < 0 || r.MaxBP > terms.MaxRateBP {
		return fmt.Errorf("rate rules %+v: MinLead must be positive, MaxBP within 0..%d", r, terms.MaxRateBP)
	}
	return nil
}

// Defaults of RateRules.
const (
	DefaultMaxRateBP   = 1000 // 10%
	DefaultRateMinLead = time.Minute
)

// AddRate schedules c and returns it as stored, with the rate it replaces:
// the one in force just before c.EffectiveFrom. It refuses a rate above
// rules.MaxBP (ErrRateAboveCeiling) and one starting less than
// rules.MinLead from now (ErrRetroactiveRate), so no event that already
// happened can ever see its rate change, and one past year 9999 UTC
// (ErrRateTooLate).
func AddRate(ctx context.Context, pool *pgxpool.Pool, c RateChange, rules RateRules) (added Rate, previousBP int, err error) {
	if err := rules.Validate(); err != nil {
		return Rate{}, 0, fmt.Errorf("cashback: %w", err)
	}
	if c.RateBP < 0 || c.RateBP > rules.MaxBP {
		return Rate{}, 0, fmt.Errorf("%w: rate_bp must be within 0..%d", ErrRateAboveCeiling, rules.MaxBP)
	}
	from := c.EffectiveFrom
	if from != nil && from.UTC().Year() > 9999 {
		return Rate{}, 0, ErrRateTooLate
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO cashback_rates (effective_from, rate_bp, created_by)
			SELECT coalesce($1, now() + $4 * interval '1 microsecond'), $2, $3
			WHERE coalesce($1, now() + $4 * interval '1 microsecond') >= now() + $4 * interval '1 microsecond'
			RETURNING effective_from, rate_bp, created_by`, from, c.RateBP, c.Client, rules.MinLead.Microseconds()).
			Scan(&added.EffectiveFrom, &added.RateBP, &added.CreatedBy)
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT rate_bp FROM cashback_rates WHERE effective_from < $1
			ORDER BY effective_from DESC LIMIT 1`, added.EffectiveFrom).Scan(&previousBP)
		if errors.Is(err, pgx.ErrNoRows) {
			previousBP, err = -1, nil
		}
		return err
	})
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Rate{}, 0, ErrRetroactiveRate
	case errors.As(err, &pe) && pe.Code == "23505":
		return Rate{}, 0, ErrRateExists
	case err != nil:
		return Rate{}, 0, err
	}
	added.EffectiveFrom = added.EffectiveFrom.UTC()
	return added, previousBP, nil
}
