package cashback

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Wallet is a user's balance and the credits that made it.
type Wallet struct {
	UserID       string       `json:"user_id"`
	BalancePaise int64        `json:"balance_paise"`
	Credits      []CreditView `json:"credits"`
}

// CreditView is one cashback_credits row as the read API shows it.
type CreditView struct {
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

// LoadWallet reads a user's wallet. A user never credited has a wallet of
// balance 0 and no credits (found = false): every user has a wallet, it
// just has no row until the first credit.
func LoadWallet(ctx context.Context, pool *pgxpool.Pool, userID string) (w Wallet, found bool, err error) {
	w = Wallet{UserID: userID, Credits: []CreditView{}}
	err = pool.QueryRow(ctx, `SELECT balance_paise FROM wallets WHERE user_id = $1`, userID).Scan(&w.BalancePaise)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return w, false, err
	default:
		found = true
	}
	rows, err := pool.Query(ctx, `SELECT payment_id, amount_paise, rate_bp, payment_amount_paise, currency, status,
		event_id, occurred_at, credited_at, reversed_at, reversal_event_id
		FROM cashback_credits WHERE user_id = $1 ORDER BY id`, userID)
	if err != nil {
		return w, found, err
	}
	credits, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CreditView])
	if err != nil {
		return w, found, err
	}
	if len(credits) > 0 {
		w.Credits, found = credits, true
	}
	return w, found, nil
}
