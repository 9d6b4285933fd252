package migrate_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3/lock"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var files = fstest.MapFS{
	"00001_first.sql":  {Data: []byte("-- +goose Up\nCREATE TABLE first (x int);\n-- +goose Down\nDROP TABLE first;\n")},
	"00002_second.sql": {Data: []byte("-- +goose Up\nCREATE TABLE second (x int);\n-- +goose Down\nDROP TABLE second;\n")},
}

// A replica that starts while another migrates waits for it, however
// long (a CREATE INDEX on a big table, say), and takes the lock within
// about a second of its release. Before, it looked every 5 s and gave up
// after 5 minutes, failing the replica's start.
func TestAReplicaWaitsForTheLockAndTakesItSoonAfterItsRelease(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- migrate.Up(ctx, pool, files, "test_versions") }()
	select {
	case err := <-done:
		t.Fatalf("Up returned %v while another session held the lock", err)
	case <-time.After(1500 * time.Millisecond):
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Up did not return within 10 s of the lock's release")
	}
	if el := time.Since(released); el > 2500*time.Millisecond {
		t.Errorf("Up took the lock %v after its release, want about a second", el)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('first', 'second')`).Scan(&n); err != nil || n != 2 {
		t.Errorf("tables after Up: %d (%v), want 2", n, err)
	}
}

// A replica that waits on the lock stops waiting when its context ends.
func TestWaitingForTheLockEndsWithTheContext(t *testing.T) {
	pool := testenv.DB(t)
	holder, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := migrate.Up(ctx, pool, files, "test_versions"); err == nil {
		t.Fatal("Up succeeded while another session held the lock")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Up returned %v after its context ended at 1.5 s", el)
	}
}

// Up logs each migration it applies, naming its version table and file,
// and nothing when there is nothing to do.
func TestUpLogsEachMigrationItApplies(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	ctx := context.Background()
	pool := testenv.DB(t)
	if err := migrate.Up(ctx, pool, files, "test_versions"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	logged := buf.String()
	buf.Reset()
	mu.Unlock()
	for _, want := range []string{"00001_first.sql", "00002_second.sql", "test_versions"} {
		if !strings.Contains(logged, want) {
			t.Errorf("log after Up does not name %s:\n%s", want, logged)
		}
	}
	if err := migrate.Up(ctx, pool, files, "test_versions"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if buf.Len() != 0 {
		t.Errorf("a second Up, with nothing to do, logged:\n%s", buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A migration's session settings stay with the migration: Up runs on
// connections of its own, so the application's pool never gets back a
// connection whose search_path or timeouts a migration changed.
func TestAMigrationsSessionSettingsDoNotReachThePool(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	var before string
	if err := pool.QueryRow(ctx, `SHOW statement_timeout`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	sets := fstest.MapFS{"00001_sets.sql": {Data: []byte("-- +goose Up\nSET statement_timeout = '1234ms';\nCREATE TABLE t (x int);\n-- +goose Down\nDROP TABLE t;\n")}}
	if err := migrate.Up(ctx, pool, sets, "test_versions"); err != nil {
		t.Fatal(err)
	}
	// Every connection the pool holds, not only the next one.
	conns := make([]*pgxpool.Conn, 0, pool.Stat().TotalConns())
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Stat().TotalConns() {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var got string
		if err := c.QueryRow(ctx, `SHOW statement_timeout`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != before {
			t.Errorf("a pool connection's statement_timeout is %s after Up, want %s as before", got, before)
		}
	}
}
