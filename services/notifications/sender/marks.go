package sender

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// markQueue writes SENT marks in groups: one statement (one commit) for
// every mark that arrived while the previous statement ran, instead of one
// per row. Nothing waits for a group to fill: a mark that finds no
// statement running is written at once, alone, so a lone message is not
// delayed, and under load the groups grow by themselves to the number of
// calls that finished during one statement.
//
// Each mark is still fenced by its own claim_id: a row that is no longer
// SENDING under that claim (the reconciler took it over) is not touched,
// and its mark reports errLostLease.
type markQueue struct {
	mu      sync.Mutex
	waiting []*sentMark
	leading bool // a goroutine is writing a group, or about to
}

type sentMark struct {
	id        int64
	claimID   uuid.UUID
	messageID string
	// done receives the mark's outcome, or lead: it is this mark's
	// goroutine's turn to write the waiting group.
	done chan markResult
}

type markResult struct {
	err  error
	lead bool
}

// mark records r as SENT with the provider's message id and returns once
// the statement that wrote it (or failed to) has finished.
func (q *markQueue) mark(ctx context.Context, pool *pgxpool.Pool, r row, messageID string) error {
	m := &sentMark{id: r.ID, claimID: r.ClaimID, messageID: messageID, done: make(chan markResult, 1)}
	q.mu.Lock()
	q.waiting = append(q.waiting, m)
	lead := !q.leading
	q.leading = true
	q.mu.Unlock()
	if !lead {
		if res := <-m.done; !res.lead {
			return res.err
		}
	}
	// This goroutine writes the waiting group, which holds m: m was queued
	// before it could lead, and no other leader took it.
	q.mu.Lock()
	group := q.waiting
	q.waiting = nil
	q.mu.Unlock()
	writeSent(ctx, pool, group)
	q.mu.Lock()
	if len(q.waiting) > 0 {
		// Hand the next group to one of its own marks rather than writing
		// it here: m is recorded, and its caller should not wait on rows
		// that are not its own.
		q.waiting[0].done <- markResult{lead: true}
	} else {
		q.leading = false
	}
	q.mu.Unlock()
	return (<-m.done).err
}

// writeSent marks the group SENT in one statement and tells each mark how
// it went.
func writeSent(ctx context.Context, pool *pgxpool.Pool, group []*sentMark) {
	ids := make([]int64, len(group))
	// [16]byte, not uuid.UUID: pgx encodes it as is, where a uuid.UUID goes
	// through its driver.Valuer (a string, parsed back) at ~20 allocations.
	claims := make([][16]byte, len(group))
	msgIDs := make([]string, len(group))
	for i, m := range group {
		ids[i], claims[i], msgIDs[i] = m.id, m.claimID, m.messageID
	}
	rows, err := pool.Query(ctx, `UPDATE notifications n SET status = 'SENT', provider_message_id = m.message_id,
		       sent_at = now(), last_error = NULL, claim_id = NULL, sending_since = NULL, updated_at = now()
		FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS m(id, claim_id, message_id)
		WHERE n.id = m.id AND n.status = 'SENDING' AND n.claim_id = m.claim_id
		RETURNING n.id`, ids, claims, msgIDs)
	var marked []int64
	if err == nil {
		marked, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		err = fmt.Errorf("sender: mark %d SENT: %w", len(group), err)
	}
	ok := make(map[int64]bool, len(marked))
	for _, id := range marked {
		ok[id] = true
	}
	for _, m := range group {
		switch {
		case err != nil:
			m.done <- markResult{err: err}
		case ok[m.id]:
			m.done <- markResult{}
		default:
			m.done <- markResult{err: errLostLease}
		}
	}
}
