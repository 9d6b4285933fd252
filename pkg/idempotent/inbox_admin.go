package idempotent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the operator functions below need: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Backlog is one consumer's inbox backlog: the figures behind the gauges
// inbox_pending, inbox_oldest_pending_age_seconds and inbox_failed.
type Backlog struct {
	Consumer      string
	Pending       int64         // PENDING rows
	OldestPending time.Duration // since the oldest PENDING row was received; 0 if none
	Failed        int64         // FAILED rows, each blocking its key
}

// InboxBacklog reports the backlog of consumer, or of every consumer with
// unfinished rows when consumer is "" (a consumer with none is absent).
func InboxBacklog(ctx context.Context, q Querier, consumer string) ([]Backlog, error) {
	where, args := "", []any{}
	if consumer != "" {
		where, args = "AND consumer = $1", append(args, consumer)
	}
	rows, err := q.Query(ctx, `SELECT consumer,
			count(*) FILTER (WHERE status = 'PENDING'),
			coalesce(extract(epoch FROM now() - min(received_at) FILTER (WHERE status = 'PENDING')), 0)::float8,
			count(*) FILTER (WHERE status = 'FAILED')
		FROM inbox WHERE status IN ('PENDING', 'FAILED') `+where+`
		GROUP BY consumer ORDER BY consumer`, args...)
	if err != nil {
		return nil, fmt.Errorf("idempotent: inbox backlog: %w", err)
	}
	var out []Backlog
	var b Backlog
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&b.Consumer, &b.Pending, &secs, &b.Failed}, func() error {
		b.OldestPending = time.Duration(secs * float64(time.Second))
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempotent: inbox backlog: %w", err)
	}
	return out, nil
}

// FailedRow is a FAILED inbox row, as an operator needs to see it.
type FailedRow struct {
	Consumer         string
	EventID          uuid.UUID
	EventType        string
	AggregateID      string
	AggregateVersion int64
	OrderingKey      string
	Attempts         int
	LastError        string
	ReceivedAt       time.Time
	LastAttemptAt    *time.Time
	// Blocked is how many unfinished rows of the same key wait behind this
	// one: a FAILED row holds its key until it is replayed.
	Blocked int64
}

// FailedFilter narrows ListFailed. Zero fields match everything; Limit
// defaults to 100.
type FailedFilter struct {
	Consumer  string
	EventType string
	Limit     int
}

// ListFailed returns FAILED rows, oldest received first, with their last
// error and how many rows each one blocks.
func ListFailed(ctx context.Context, q Querier, f FailedFilter) ([]FailedRow, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT i.consumer, i.message_id, i.event_type, i.aggregate_id, i.aggregate_version,
			i.ordering_key, i.attempts, coalesce(i.last_error, ''), i.received_at, i.last_attempt_at,
			(SELECT count(*) FROM inbox b
			  WHERE b.consumer = i.consumer AND b.ordering_key = i.ordering_key AND b.status IN ('PENDING', 'FAILED')
			    AND (b.aggregate_version, b.occurred_at, b.message_id) > (i.aggregate_version, i.occurred_at, i.message_id))
		FROM inbox i
		WHERE i.status IN ('PENDING', 'FAILED') AND i.status = 'FAILED'
		  AND ($1 = '' OR i.consumer = $1) AND ($2 = '' OR i.event_type = $2)
		ORDER BY i.received_at, i.message_id
		LIMIT $3`, f.Consumer, f.EventType, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("idempotent: list failed inbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[FailedRow])
	if err != nil {
		return nil, fmt.Errorf("idempotent: list failed inbox rows: %w", err)
	}
	return out, nil
}

// ReplayFilter selects FAILED rows to replay. Name an event id (EventID,
// optionally narrowed to one Consumer), or a Consumer together with an
// EventType or with AllFailed: a filter that would replay every FAILED row of
// every consumer by accident is refused.
type ReplayFilter struct {
	EventID   uuid.UUID
	Consumer  string
	EventType string
	AllFailed bool
}

// ErrReplayFilter is returned by Replay (and Validate) for a filter that
// names nothing.
var ErrReplayFilter = errors.New("idempotent: replay needs an event id, or a consumer with an event type or AllFailed")

// Validate returns ErrReplayFilter unless f names rows: an event id, or a
// consumer with an event type or AllFailed. Replay calls it; a tool can call
// it first, to refuse a bad filter before it connects.
func (f ReplayFilter) Validate() error {
	if f.EventID != uuid.Nil || (f.Consumer != "" && (f.EventType != "" || f.AllFailed)) {
		return nil
	}
	return ErrReplayFilter
}

// ReplayedRow names a row Replay returned to PENDING.
type ReplayedRow struct {
	Consumer string
	EventID  uuid.UUID
}

// Replay returns the FAILED rows that match f to PENDING, due now, with a
// fresh attempt budget (attempts = 0; last_error is kept for the record),
// which also unblocks the rows of their keys. Only FAILED rows move: a DONE
// row is never replayed (that would apply it twice) and a PENDING one is
// already on its way. Run it after fixing the cause, or the rows fail again.
func Replay(ctx context.Context, q Querier, f ReplayFilter) ([]ReplayedRow, error) {
	var conds []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.EventID != uuid.Nil {
		add("message_id = $%d", f.EventID)
	}
	if f.Consumer != "" {
		add("consumer = $%d", f.Consumer)
	}
	if f.EventType != "" {
		add("event_type = $%d", f.EventType)
	}
	rows, err := q.Query(ctx, `UPDATE inbox SET status = 'PENDING', attempts = 0, next_attempt_at = now()
		WHERE status IN ('PENDING', 'FAILED') AND status = 'FAILED' AND `+strings.Join(conds, " AND ")+`
		RETURNING consumer, message_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("idempotent: replay inbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ReplayedRow])
	if err != nil {
		return nil, fmt.Errorf("idempotent: replay inbox rows: %w", err)
	}
	return out, nil
}
