package cashback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Wallet is a user's balance and one page of the credits that made it,
// newest first. NextBefore, when set, is the cursor of the next (older)
// page: pass it as Page.Before.
type Wallet struct {
	UserID       string       `json:"user_id"`
	BalancePaise int64        `json:"balance_paise"`
	Credits      []CreditView `json:"credits"`
	NextBefore   int64        `json:"next_before,omitempty"`
}

// Page selects credits of a wallet: at most Limit (1..MaxPageLimit; 0 means
// DefaultPageLimit), older than the cursor Before (0: from the newest).
type Page struct {
	Limit  int
	Before int64
}

// Page sizes of LoadWallet.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// CreditView is one cashback_credits row as the read API shows it.
type CreditView struct {
	ID                 int64      `json:"-"` // the page cursor
	PaymentID          string     `json:"payment_id"`
	AmountPaise        int64      `json:"amount_paise"`
	RateBP             int        `json:"rate_bp"`
	PaymentAmountPaise int64      `json:"payment_amount_paise"`
	Currency           string     `json:"currency"`
	Status             string     `json:"status"` // CREDITED | REVERSED
	EventID            uuid.UUID  `json:"event_id"`
	OccurredAt         time.Time  `json:"occurred_at"`
	CreditedAt         time.Time  `json:"credited_at"`
	ReversedAt         *time.Time `json:"reversed_at,omitempty"`
	ReversalEventID    *uuid.UUID `json:"reversal_event_id,omitempty"`
}

// LoadWallet reads a user's balance and one page of credits, their times
// in UTC (pgx scans them in the process's zone, where the last hours of
// year 9999 UTC may be year 10000, which JSON cannot carry). A user never
// credited has a wallet of balance 0 and no credits (found = false): every
// user has a wallet, it just has no row until the first credit.
func LoadWallet(ctx context.Context, pool *pgxpool.Pool, userID string, page Page) (w Wallet, found bool, err error) {
	if page.Limit == 0 {
		page.Limit = DefaultPageLimit
	}
	if page.Limit < 0 || page.Limit > MaxPageLimit || page.Before < 0 {
		return w, false, fmt.Errorf("cashback: page %+v: limit 1..%d, before >= 0", page, MaxPageLimit)
	}
	w = Wallet{UserID: userID, Credits: []CreditView{}}
	err = pool.QueryRow(ctx, `SELECT balance_paise FROM wallets WHERE user_id = $1`, userID).Scan(&w.BalancePaise)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return w, false, err
	default:
		found = true
	}
	// One more than the page: whether there is a next page, without a count.
	rows, err := pool.Query(ctx, `SELECT id, payment_id, amount_paise, rate_bp, payment_amount_paise, currency, status,
		event_id, occurred_at, credited_at, reversed_at, reversal_event_id
		FROM cashback_credits WHERE user_id = $1 AND ($2::bigint = 0 OR id < $2::bigint) ORDER BY id DESC LIMIT $3`,
		userID, page.Before, page.Limit+1)
	if err != nil {
		return w, found, err
	}
	credits, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CreditView])
	if err != nil {
		return w, found, err
	}
	if len(credits) > page.Limit {
		credits = credits[:page.Limit]
		w.NextBefore = credits[len(credits)-1].ID
	}
	for i := range credits {
		c := &credits[i]
		c.OccurredAt, c.CreditedAt = c.OccurredAt.UTC(), c.CreditedAt.UTC()
		if c.ReversedAt != nil {
			*c.ReversedAt = c.ReversedAt.UTC()
		}
	}
	if len(credits) > 0 {
		w.Credits, found = credits, true
	}
	return w, found, nil
}
