package httpidem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newStore(t *testing.T, cfg httpidem.Config) (*httpidem.Store, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.DB(t)
	if err := httpidem.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quiet
	s, err := httpidem.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func post(t *testing.T, h http.Handler, key string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader("{}"))
	r.Header.Set(httpidem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// An attempt that outlives its lease is taken over by a retry, which gets
// the same resource id; the stale attempt's Save is then refused
// (ErrLockLost), so only one of the two can commit.
func TestTakeoverFencesTheStaleAttempt(t *testing.T) {
	const lease = 300 * time.Millisecond
	s, pool := newStore(t, httpidem.Config{LockTimeout: lease})
	var (
		mu        sync.Mutex
		resources []string
		numbers   []int
	)
	entered, release := make(chan struct{}), make(chan struct{})
	staleSave := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ids := 0
		s.Handle(w, r, httpidem.Request{Scope: "POST /things", Fingerprint: struct{}{},
			NewResourceID: func() string { ids++; return "thing_" + string(rune('0'+ids)) }},
			func(ctx context.Context, a *httpidem.Attempt) error {
				mu.Lock()
				resources, numbers = append(resources, a.ResourceID), append(numbers, a.Number)
				mu.Unlock()
				if a.Number == 1 {
					close(entered)
					<-release // a hung attempt, past its lease
					err := a.Save(context.Background(), pool, http.StatusCreated, map[string]string{"by": "stale"})
					staleSave <- err
					return err
				}
				return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "retry"})
			})
	})

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(t, h, "k") }()
	<-entered
	time.Sleep(lease + 100*time.Millisecond)
	retry := post(t, h, "k")
	if retry.Code != http.StatusCreated || !strings.Contains(retry.Body.String(), "retry") {
		t.Fatalf("retry: %d %s", retry.Code, retry.Body)
	}
	close(release)
	if err := <-staleSave; !errors.Is(err, httpidem.ErrLockLost) {
		t.Errorf("stale Save: %v, want ErrLockLost", err)
	}
	if w := <-first; w.Code != http.StatusConflict {
		t.Errorf("stale attempt answered %d %s, want 409", w.Code, w.Body)
	}
	if replay := post(t, h, "k"); !strings.Contains(replay.Body.String(), "retry") || replay.Header().Get(httpidem.HeaderReplayed) != "true" {
		t.Errorf("replay: %d %s", replay.Code, replay.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(resources) != 2 || resources[0] != resources[1] || numbers[0] != 1 || numbers[1] != 2 {
		t.Errorf("attempts got resources %v numbers %v, want the same resource, attempts 1 and 2", resources, numbers)
	}
}

// Cleanup deletes keys older than the retention, and only those.
func TestCleanupDeletesExpiredKeys(t *testing.T) {
	s, pool := newStore(t, httpidem.Config{Retention: time.Hour})
	ctx := context.Background()
	for _, k := range []string{"old-done", "old-unfinished", "fresh"} {
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash) VALUES ('s', $1, '\x00')`, k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET response_code = 200, response_body = '{}' WHERE key = 'old-done'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE key LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}
	n, err := s.Cleanup(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Cleanup = %d, %v; want 2", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT key FROM idempotency_keys`)
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		left = append(left, k)
	}
	if len(left) != 1 || left[0] != "fresh" {
		t.Errorf("left %v, want [fresh]", left)
	}
}

func TestKeyValidation(t *testing.T) {
	for key, ok := range map[string]bool{"a": true, strings.Repeat("k", 255): true, strings.Repeat("k", 256): false, "tab\there": false} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set(httpidem.HeaderKey, key)
		if _, err := httpidem.KeyFrom(r); (err == nil) != ok {
			t.Errorf("KeyFrom(%q) = %v, want ok=%v", key, err, ok)
		}
	}
	if _, err := httpidem.KeyFrom(httptest.NewRequest(http.MethodPost, "/", nil)); !errors.Is(err, httpidem.ErrKeyMissing) {
		t.Errorf("no header: %v", err)
	}
}
