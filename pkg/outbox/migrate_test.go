package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// The claim's index is built CONCURRENTLY, and such a build can fail (a
// statement or lock timeout, a killed deploy), leaving an INVALID index
// behind with the migration unrecorded. Run again, the migration must
// rebuild it rather than take the leftover for done and drop the old,
// valid index: the claim is never left without a usable index.
func TestTheDueIndexMigrationRerunAfterAFailedConcurrentBuildLeavesAValidIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	// Back to the schema before 00003: its old index, 00003 unrecorded.
	for _, sql := range []string{
		`DROP INDEX outbox_due`,
		`CREATE INDEX outbox_unpublished ON outbox (next_attempt_at, id) WHERE published_at IS NULL`,
		`DELETE FROM ` + outbox.VersionTable + ` WHERE version_id >= 3`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The build fails: an open producer transaction (a writer's lock) makes it wait, and
	// its statement timeout ends it, as a deploy's would.
	producer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx)
	if _, err := producer.Exec(ctx, `LOCK TABLE outbox IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, buildErr := conn.Exec(ctx, `SET statement_timeout = '500ms'`)
	if buildErr == nil {
		_, buildErr = conn.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_due ON outbox (next_attempt_at) WHERE published_at IS NULL`)
	}
	_, _ = conn.Exec(ctx, `RESET statement_timeout`)
	conn.Release()
	if buildErr == nil {
		t.Fatal("the concurrent build did not time out; the test could not set up a failed build")
	}
	if err := producer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := outbox.Migrate(mctx, pool); err != nil {
		t.Fatal(err)
	}
	if v := validClaimIndexes(t, pool); len(v) != 1 || v[0] != "outbox_due" {
		t.Errorf("valid claim indexes after the rerun: %v; want outbox_due, valid, alone", v)
	}

	// A database the earlier 00003 left so (outbox_due invalid, the old
	// index gone, 00003 recorded) is repaired by the next migration.
	for _, sql := range []string{
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'outbox_due'::regclass`,
		`DELETE FROM ` + outbox.VersionTable + ` WHERE version_id >= 4`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := outbox.Migrate(mctx, pool); err != nil {
		t.Fatal(err)
	}
	if v := validClaimIndexes(t, pool); len(v) != 1 || v[0] != "outbox_due" {
		t.Errorf("valid claim indexes after the repair: %v; want outbox_due", v)
	}
}

// validClaimIndexes names the valid indexes of the outbox that the claim
// can use.
func validClaimIndexes(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var valid []string
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'outbox'::regclass AND i.indisvalid AND c.relname IN ('outbox_due', 'outbox_unpublished')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		valid = append(valid, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return valid
}
