package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Channel is the LISTEN/NOTIFY channel relays listen on.
const Channel = "outbox"

// NotifierConfig tunes a Notifier. Zero values take the defaults in brackets.
type NotifierConfig struct {
	// MinInterval is the least time between two NOTIFYs [5ms]: commits in
	// between share the next one. It is the most a commit's wake-up waits.
	MinInterval time.Duration
	Logger      *slog.Logger
}

// Notifier wakes the relays after the producer's commit, from the
// application, instead of a trigger inside the producer's transaction.
//
// Why not a trigger: a transaction that calls pg_notify takes a lock shared
// by the whole PostgreSQL server at commit and holds it through its WAL
// flush, so every notifying commit on the server goes one at a time, with
// no group commit. The Notifier sends NOTIFY from its own connection, after
// the commit and outside the producer's transaction, at most once per
// MinInterval however many commits asked for it: the producer's commit pays
// a non-blocking channel send.
//
// The wake-up stays a hint. A commit whose Notify is lost (the process
// died between COMMIT and Notify, or NOTIFY failed) is found by the relay's
// polling, within its PollInterval.
type Notifier struct {
	pool    *pgxpool.Pool
	cfg     NotifierConfig
	pending chan struct{}
}

// NewNotifier returns a Notifier sending on pool's connections; Run sends.
func NewNotifier(pool *pgxpool.Pool, cfg NotifierConfig) *Notifier {
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 5 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Notifier{pool: pool, cfg: cfg, pending: make(chan struct{}, 1)}
}

// Notify asks for a wake-up of the relays; call it after a transaction that
// added outbox rows has committed. It never blocks. A nil Notifier does
// nothing (the relays then find the rows by polling).
func (n *Notifier) Notify() {
	if n == nil {
		return
	}
	select {
	case n.pending <- struct{}{}:
	default: // one is already pending: it covers this commit too
	}
}

// notifySQL sends the wake-up in a transaction that commits without
// waiting for its WAL flush. A transaction that notifies gets a
// transaction id, so its commit record would otherwise be flushed like any
// write: one more WAL flush every MinInterval, in the queue the producers'
// commits wait in, which on a disk with a slow fsync is felt by each of
// them. The notification reaches the listeners at commit, flushed or not,
// and a NOTIFY lost in a crash costs what any lost hint does: one poll.
const notifySQL = `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')`

// Run sends the NOTIFYs that Notify asked for until ctx ends. A NOTIFY sent
// after a Notify call is what makes that call's commit visible to the
// relay it wakes: the commit happened before Notify, Notify before the send.
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.pending:
		}
		sent := time.Now()
		if _, err := n.pool.Exec(ctx, notifySQL, Channel); err != nil && ctx.Err() == nil {
			n.cfg.Logger.Warn("outbox NOTIFY failed; relays find the rows by polling", "error", err)
		}
		if w := n.cfg.MinInterval - time.Since(sent); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
	}
}
