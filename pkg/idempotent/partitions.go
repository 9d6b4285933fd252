package idempotent

import (
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultRetention is how long a dedupe key is remembered. It must outlast
// every way a copy can come back: SQS keeps a message at most 14 days (in
// the source queue, and again in its DLQ from the original enqueue time), so
// 15 days leaves a day of margin. Copies older than the window are refused,
// never applied (see ErrExpired).
const DefaultRetention = 15 * 24 * time.Hour

// DefaultPartitionsAhead is how many future days of partitions exist at any
// time, so that a maintenance loop that stalls for a while, or a producer
// whose clock runs ahead, does not make inserts fail.
const DefaultPartitionsAhead = 3

const day = 24 * time.Hour

// MaxFutureSkew is how far ahead of a consumer's clock an event id may have
// been minted: the partitions that exist ahead of today. A Consumer refuses
// an id beyond it at once, as a permanent error naming the skew (its dedupe
// row would have no partition to go to, and retrying cannot change that
// until days have passed).
const MaxFutureSkew = DefaultPartitionsAhead * day

// ValidateRetention checks that a dedupe window outlasts the longest time a
// queue can hand a message back (its MessageRetentionPeriod) plus a margin of
// one day. A window shorter than that would let a late redelivery be applied
// a second time.
func ValidateRetention(retention, queueRetention time.Duration) error {
	if retention < queueRetention+day {
		return fmt.Errorf("idempotent: retention %v must exceed the queue retention %v by at least a day", retention, queueRetention)
	}
	return nil
}

// uuidAt is the smallest UUIDv7-ordered value minted at t: the 48-bit
// millisecond timestamp followed by zeros. It is a partition bound, not an id.
func uuidAt(t time.Time) uuid.UUID {
	var u uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	return u
}

func partitionName(d time.Time) string {
	return "processed_messages_p" + d.UTC().Format("20060102")
}

var partitionRE = regexp.MustCompile(`^processed_messages_p(\d{8})$`)

// EnsurePartitions creates the daily partitions of processed_messages from
// the day the retention window starts to partitionsAhead days after today.
// Existing partitions are left alone. It returns the names it created.
func EnsurePartitions(ctx context.Context, pool *pgxpool.Pool, retention time.Duration, partitionsAhead int) ([]string, error) {
	return ensurePartitionsAt(ctx, pool, time.Now(), retention, partitionsAhead)
}

func ensurePartitionsAt(ctx context.Context, pool *pgxpool.Pool, now time.Time, retention time.Duration, ahead int) ([]string, error) {
	first := now.UTC().Add(-retention).Truncate(day)
	last := now.UTC().Truncate(day).Add(time.Duration(ahead) * day)
	var created []string
	for d := first; !d.After(last); d = d.Add(day) {
		name := partitionName(d)
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			return created, err
		}
		if exists {
			continue
		}
		if err := createPartition(ctx, pool, name, d); err != nil {
			if isDuplicateObject(err) {
				continue // a replica created it first
			}
			return created, fmt.Errorf("idempotent: create partition %s: %w", name, err)
		}
		created = append(created, name)
	}
	return created, nil
}

// createPartition attaches one day. The DDL needs a brief ACCESS EXCLUSIVE
// lock on processed_messages; a lock_timeout keeps it from queueing behind a
// long effect transaction and stalling every consumer behind itself (it
// fails instead, and the next maintenance round tries again).
func createPartition(ctx context.Context, pool *pgxpool.Pool, name string, d time.Time) error {
	return partitionDDL(ctx, pool, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF processed_messages FOR VALUES FROM ('%s') TO ('%s')`,
		pgx.Identifier{name}.Sanitize(), uuidAt(d), uuidAt(d.Add(day))))
}

// partitionDDL runs sql, which attaches or drops a partition, under a
// lock_timeout of 5 s unless the session has its own (the Maintainer's):
// the ACCESS EXCLUSIVE lock it needs queues behind every open transaction
// that touched processed_messages, and every new insert queues behind it.
// Failing fast costs a round; waiting would stall the consumers.
func partitionDDL(ctx context.Context, pool *pgxpool.Pool, sql string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', '5s', true) WHERE current_setting('lock_timeout') = '0'`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// DropExpiredPartitions drops every daily partition of processed_messages
// whose whole day lies before the retention window by more than
// ClockSkewMargin (so a replica whose clock lags this one's still finds
// the keys of every copy it accepts, and its EnsurePartitions never
// recreates a dropped day). Dropping a partition is instant and leaves no
// dead tuples, unlike a DELETE of the same rows; behind a long transaction
// on the table it gives up after a lock_timeout (5 s unless the pool's
// sessions set one) rather than stall every insert queued behind it. It
// returns the names it dropped.
func DropExpiredPartitions(ctx context.Context, pool *pgxpool.Pool, retention time.Duration) ([]string, error) {
	return dropExpiredAt(ctx, pool, time.Now(), retention)
}

func dropExpiredAt(ctx context.Context, pool *pgxpool.Pool, now time.Time, retention time.Duration) ([]string, error) {
	rows, err := pool.Query(ctx, `
		SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'processed_messages'`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	horizon := now.UTC().Add(-retention - ClockSkewMargin)
	var dropped []string
	for _, name := range names {
		m := partitionRE.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		d, err := time.Parse("20060102", m[1])
		if err != nil || d.Add(day).After(horizon) {
			continue
		}
		if err := partitionDDL(ctx, pool, "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			return dropped, fmt.Errorf("idempotent: drop partition %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

func fsSub(f fs.FS, dir string) (fs.FS, error) { return fs.Sub(f, dir) }
