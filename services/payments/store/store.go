// Package store is the payments table and the events its changes emit.
//
// Every state change writes its outbox event in the same transaction
// (pkg/outbox.Add), so an event exists exactly when the change committed:
// InsertSucceeded emits PaymentSucceeded (aggregate_version 1), MarkRefunded
// emits PaymentRefunded (aggregate_version = the new version, 2).
package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Statuses of a payment.
const (
	StatusSucceeded = "SUCCEEDED"
	StatusRefunded  = "REFUNDED"
)

// Payment is a row of the payments table, and the JSON the API returns.
type Payment struct {
	ID                string    `json:"id"`
	Client            string    `json:"-"` // the API client that made it; only it may see or refund it
	UserID            string    `json:"user_id"`
	AmountPaise       int64     `json:"amount_paise"`
	Currency          string    `json:"currency"`
	Method            string    `json:"method"`
	Status            string    `json:"status"`
	Version           int64     `json:"version"`
	ProviderRef       string    `json:"provider_ref"`
	ProviderRefundRef string    `json:"provider_refund_ref,omitempty"`
	CreatedAt         time.Time `json:"created_at"`
	UpdatedAt         time.Time `json:"updated_at"`
}

// EventPayload is the payload of PaymentSucceeded and PaymentRefunded.
type EventPayload struct {
	PaymentID   string `json:"payment_id"`
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
}

// ErrNotFound: no payment with that id.
var ErrNotFound = errors.New("payment not found")

// ErrNotRefundable: the payment is not (any more) in SUCCEEDED at the
// version the caller read, i.e. it was refunded meanwhile.
var ErrNotRefundable = errors.New("payment already refunded")

// NewID returns a fresh payment id, "pay_" and 32 hex digits of a UUIDv7
// (time-ordered, so the primary key index stays append-mostly).
func NewID() string {
	id := uuid.Must(uuid.NewV7())
	return "pay_" + strings.ReplaceAll(id.String(), "-", "")
}

// Querier is a pool or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const columns = `id, client, user_id, amount_paise, currency, method, status, version, provider_ref,
	coalesce(provider_refund_ref, ''), created_at, updated_at`

func scan(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.Client, &p.UserID, &p.AmountPaise, &p.Currency, &p.Method, &p.Status, &p.Version,
		&p.ProviderRef, &p.ProviderRefundRef, &p.CreatedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrNotFound
	}
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, err
}

// Get reads one payment of client: ErrNotFound for another client's
// payment as for none at all, so a client cannot even learn that an id
// exists.
func Get(ctx context.Context, q Querier, client, id string) (Payment, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM payments WHERE id = $1 AND client = $2`, id, client))
}

// InsertSucceeded writes p as a SUCCEEDED payment at version 1 and its
// PaymentSucceeded event, both in tx and in one round trip (the event is
// built from p, so it need not wait for the insert). It returns the row as
// stored.
func InsertSucceeded(ctx context.Context, tx pgx.Tx, p Payment) (Payment, error) {
	p.Version, p.Status = 1, StatusSucceeded
	e, err := event(contract.PaymentSucceeded, p)
	if err != nil {
		return Payment{}, err
	}
	var stored Payment
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO payments (id, client, user_id, amount_paise, currency, method, status, version, provider_ref)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+columns,
		p.ID, p.Client, p.UserID, p.AmountPaise, p.Currency, p.Method, p.Status, p.Version, p.ProviderRef).
		QueryRow(func(row pgx.Row) (err error) {
			stored, err = scan(row)
			return err
		})
	if err := outbox.QueueAdd(ctx, b, e); err != nil {
		return Payment{}, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return Payment{}, fmt.Errorf("insert payment %s: %w", p.ID, err)
	}
	return stored, nil
}

// MarkRefunded moves a SUCCEEDED payment, read at version fromVersion, to
// REFUNDED at fromVersion+1 and writes its PaymentRefunded event, both in
// tx. ErrNotRefundable if it changed meanwhile (a concurrent refund won).
func MarkRefunded(ctx context.Context, tx pgx.Tx, id string, fromVersion int64, refundRef string) (Payment, error) {
	p, err := scan(tx.QueryRow(ctx, `UPDATE payments
		SET status = $2, version = version + 1, provider_refund_ref = $3, updated_at = now()
		WHERE id = $1 AND status = $4 AND version = $5
		RETURNING `+columns, id, StatusRefunded, refundRef, StatusSucceeded, fromVersion))
	if errors.Is(err, ErrNotFound) {
		return Payment{}, ErrNotRefundable
	}
	if err != nil {
		return Payment{}, fmt.Errorf("refund payment %s: %w", id, err)
	}
	return p, emit(ctx, tx, contract.PaymentRefunded, p)
}

func emit(ctx context.Context, tx pgx.Tx, eventType string, p Payment) error {
	e, err := event(eventType, p)
	if err != nil {
		return err
	}
	return outbox.Add(ctx, tx, e)
}

// event is p's event of eventType, at p's version.
func event(eventType string, p Payment) (events.Envelope, error) {
	return events.New(eventType, p.ID, p.Version, EventPayload{
		PaymentID: p.ID, UserID: p.UserID, AmountPaise: p.AmountPaise, Currency: p.Currency, Status: p.Status,
	})
}
