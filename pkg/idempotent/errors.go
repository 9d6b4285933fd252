package idempotent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Outcome says what Handle did with a message.
type Outcome int

const (
	// Applied: the key was new, the effect ran and committed with it.
	Applied Outcome = iota + 1
	// Duplicate: the key was already committed with the same payload hash;
	// nothing ran. The caller acks the message.
	Duplicate
	// Conflict: the key was already committed with a different payload
	// hash: a producer reused an event id. Nothing ran; Handle also returns
	// ErrConflict so the copy is parked for a human, not silently acked.
	Conflict
	// Expired: the message is older than the dedupe window, so a duplicate
	// could no longer be recognised. Nothing ran; Handle returns ErrExpired.
	Expired
	// Failed: the effect (or the database) returned an error; the
	// transaction rolled back, key included, so a redelivery will try again.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	case Expired:
		return "expired"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Done reports whether the message may be acknowledged (deleted from its
// queue): its effect is committed, now or before.
func (o Outcome) Done() bool { return o == Applied || o == Duplicate }

// permanentError marks errors that no redelivery can fix. Transports check
// for a Permanent() bool method and park such messages (DLQ or FAILED)
// instead of retrying them.
type permanentError struct{ msg string }

func (e *permanentError) Error() string   { return e.msg }
func (e *permanentError) Permanent() bool { return true }

var (
	// ErrConflict: same event id, different payload. See Conflict.
	ErrConflict error = &permanentError{"idempotent: event id reused with a different payload"}
	// ErrExpired: older than the dedupe window. See Expired.
	ErrExpired error = &permanentError{"idempotent: message older than the dedupe window refused"}
	// ErrAhead: the event id was minted more than MaxFutureSkew ahead of
	// the consumer's clock. The returned error wraps it with the skew.
	ErrAhead error = &permanentError{"idempotent: event id from the future refused"}
	// ErrInvalidMessage: the Message cannot be kept as a key: its EventID
	// is not a UUIDv7 (processed_messages is partitioned by the id's time)
	// or it has no Hash to compare a later copy with. MessageOf of a
	// decoded envelope always makes a valid one. The returned error wraps
	// it with the reason.
	ErrInvalidMessage error = &permanentError{"idempotent: message refused"}
	// ErrNilEffect: Handle, or an Item of a batch, was given no Effect. A
	// bug in the caller, permanent so that the message waits in the DLQ
	// for the fix rather than being redelivered until it lands there.
	ErrNilEffect error = &permanentError{"idempotent: nil effect"}
)

// retryable reports PostgreSQL errors after which the same transaction,
// run again, can succeed: serialization failures and deadlocks.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

func isDuplicateObject(err error) bool {
	var pe *pgconn.PgError
	// 42P07 duplicate_table; 23505 when two sessions race on the catalog.
	return errors.As(err, &pe) && (pe.Code == "42P07" || pe.Code == "23505")
}

// claimError explains a dedupe claim refused for want of a partition for
// the message's day (check_violation, "no partition of relation"):
// Migrate creates partitions only a few days ahead, and a running
// Maintainer the rest. The error stays retryable: once the partition
// exists, the redelivery applies.
func claimError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23514" && strings.Contains(pe.Message, "no partition") {
		return fmt.Errorf("idempotent: processed_messages has no partition for this message's day: is a Maintainer running (NewMaintainer, then Run)? %w", err)
	}
	return err
}
