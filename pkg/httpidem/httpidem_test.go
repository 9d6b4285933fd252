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
	"sync/atomic"
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
	// Two headers, each valid: the answer says what is wrong (two), not
	// that a key has the wrong characters.
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Add(httpidem.HeaderKey, "a")
	r.Header.Add(httpidem.HeaderKey, "b")
	if _, err := httpidem.KeyFrom(r); !errors.Is(err, httpidem.ErrKeyRepeated) || !strings.Contains(err.Error(), "one") {
		t.Errorf("two Idempotency-Key headers: %v, want ErrKeyRepeated", err)
	}
	w := httptest.NewRecorder()
	httpidem.RequireKey(http.NotFoundHandler()).ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"idempotency_key_invalid"`) || !strings.Contains(w.Body.String(), "exactly one") {
		t.Errorf("two headers answered %d %s, want 400 idempotency_key_invalid saying to send exactly one", w.Code, w.Body)
	}
}

// crashHandler answers POST /things with Handle, whose op crashes its first
// attempt (ErrAbandon: no response, the lease left to expire) and saves
// 201 {"by": ...} on any later one.
func crashHandler(s *httpidem.Store, pool *pgxpool.Pool, ran *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handle(w, r, httpidem.Request{Scope: "client POST /things", Fingerprint: map[string]int{"amount": 42},
			NewResourceID: func() string { return "thing_1" }},
			func(ctx context.Context, a *httpidem.Attempt) error {
				ran.Add(1)
				if a.Number == 1 {
					return httpidem.ErrAbandon
				}
				return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "client"})
			})
	})
}

// crash sends a request whose attempt crashes, through a real server (which
// absorbs the handler's abort as a crashed process would drop the
// connection).
func crash(t *testing.T, h http.Handler, key string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/things", strings.NewReader("{}"))
	req.Header.Set(httpidem.HeaderKey, key)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the crashed attempt answered %d", resp.StatusCode)
	}
}

// An attempt that crashed (no response, lease expired) is finished by
// Resume without its client: the operation runs again with the same
// resource id and the request it was given, once however many Resume calls
// race, and the client's retry then gets the saved response. A lease still
// held, a key released by a failed attempt, a finished key and a key older
// than maxAge are left alone.
func TestResumeFinishesACrashedAttemptOnceWithoutItsClient(t *testing.T) {
	const lease = 300 * time.Millisecond
	s, pool := newStore(t, httpidem.Config{LockTimeout: lease})
	ctx := context.Background()
	var ran atomic.Int64
	h := crashHandler(s, pool, &ran)
	crash(t, h, "k")

	var resumed atomic.Int64
	resume := func(ctx context.Context, a *httpidem.Attempt, request []byte) error {
		resumed.Add(1)
		if a.ResourceID != "thing_1" || a.Number != 2 || a.Scope() != "client POST /things" || string(request) != `{"amount":42}` {
			t.Errorf("resumed attempt: resource %q number %d scope %q request %s; want thing_1, 2, the key's scope and the first request",
				a.ResourceID, a.Number, a.Scope(), request)
		}
		time.Sleep(50 * time.Millisecond) // racing Resume calls overlap
		return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "resume"})
	}
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 0 {
		t.Fatalf("Resume within the lease = %d, %v; want 0: the attempt may still be running", n, err)
	}
	time.Sleep(lease + 50*time.Millisecond)
	var wg sync.WaitGroup
	var total atomic.Int64
	for range 4 {
		wg.Go(func() {
			n, err := s.Resume(ctx, time.Hour, resume)
			if err != nil {
				t.Errorf("Resume: %v", err)
			}
			total.Add(int64(n))
		})
	}
	wg.Wait()
	if total.Load() != 1 || resumed.Load() != 1 {
		t.Fatalf("4 racing Resume calls resumed %d keys and ran the operation %d times, want 1 and 1", total.Load(), resumed.Load())
	}
	if w := post(t, h, "k"); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), "resume") || w.Header().Get(httpidem.HeaderReplayed) != "true" {
		t.Errorf("the client's retry: %d %s, want the resumed 201 replayed", w.Code, w.Body)
	}
	if ran.Load() != 1 {
		t.Errorf("the client's handler ran %d times, want once (the crash)", ran.Load())
	}
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 0 {
		t.Errorf("Resume of a finished key = %d, %v; want 0", n, err)
	}

	// Left alone: a key released by a failed attempt (its client was told
	// to retry) and a crashed key older than maxAge.
	failing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handle(w, r, httpidem.Request{Scope: "client POST /things", Fingerprint: 1},
			func(context.Context, *httpidem.Attempt) error {
				return &httpidem.Error{Status: 502, Code: "provider", Message: "retry"}
			})
	})
	if w := post(t, failing, "released"); w.Code != 502 {
		t.Fatalf("failing attempt: %d %s", w.Code, w.Body)
	}
	crash(t, h, "old")
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = 'old'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 50*time.Millisecond)
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 0 || resumed.Load() != 1 {
		t.Errorf("Resume with a released key and one past maxAge = %d, %v (operation run %d times); want 0 and no run", n, err, resumed.Load())
	}
}

// An operation that fails when resumed keeps its lease until it expires,
// as a crash would: the next Resume tries it again, and a client retry in
// the meantime is told the request is in flight.
func TestResumeThatFailsIsTriedAgainAfterTheLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	s, pool := newStore(t, httpidem.Config{LockTimeout: lease})
	ctx := context.Background()
	var ran atomic.Int64
	h := crashHandler(s, pool, &ran)
	crash(t, h, "k")
	time.Sleep(lease + 50*time.Millisecond)

	calls := 0
	resume := func(ctx context.Context, a *httpidem.Attempt, _ []byte) error {
		calls++
		if calls == 1 {
			return errors.New("provider down")
		}
		return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "resume"})
	}
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 0 || calls != 1 {
		t.Fatalf("failing Resume = %d, %v after %d calls; want 0 finished, 1 call", n, err, calls)
	}
	if w := post(t, h, "k"); w.Code != http.StatusConflict {
		t.Errorf("client retry while the failed resume holds the lease: %d %s, want 409", w.Code, w.Body)
	}
	time.Sleep(lease + 50*time.Millisecond)
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 1 || calls != 2 {
		t.Fatalf("second Resume = %d, %v after %d calls; want 1 finished, 2 calls", n, err, calls)
	}
	var code int
	if err := pool.QueryRow(ctx, `SELECT response_code FROM idempotency_keys WHERE key = 'k'`).Scan(&code); err != nil || code != http.StatusCreated {
		t.Errorf("saved response %d, %v; want 201", code, err)
	}
}

// An attempt that fails with an outcome it cannot know (OutcomeUnknown: a
// provider call that timed out may have charged the card) releases the key
// for its client's retry at once, and, if no retry comes, is finished by
// Resume one lease later, with the request it was given. A client retry
// that finishes it first leaves Resume nothing to do.
func TestAFailureWithAnUnknownOutcomeIsResumedWithoutItsClient(t *testing.T) {
	const lease = 300 * time.Millisecond
	s, pool := newStore(t, httpidem.Config{LockTimeout: lease})
	ctx := context.Background()
	var ran atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handle(w, r, httpidem.Request{Scope: "client POST /things", Fingerprint: map[string]int{"amount": 42},
			NewResourceID: func() string { return "thing_" + r.Header.Get(httpidem.HeaderKey) }},
			func(ctx context.Context, a *httpidem.Attempt) error {
				if ran.Add(1) <= 2 { // the first attempt of each key
					return &httpidem.Error{Status: 502, Code: "provider_unavailable", Message: "retry", OutcomeUnknown: true}
				}
				return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "client"})
			})
	})
	for _, k := range []string{"gave-up", "retried"} {
		if w := post(t, h, k); w.Code != 502 {
			t.Fatalf("%s: first attempt %d %s, want 502", k, w.Code, w.Body)
		}
	}
	// The client that retries is not made to wait for the lease.
	if w := post(t, h, "retried"); w.Code != http.StatusCreated {
		t.Fatalf("the client's immediate retry: %d %s, want 201", w.Code, w.Body)
	}
	var resumed []string
	resume := func(ctx context.Context, a *httpidem.Attempt, request []byte) error {
		resumed = append(resumed, a.ResourceID)
		if a.Number != 2 || string(request) != `{"amount":42}` {
			t.Errorf("resumed attempt %d with request %s, want attempt 2 with the first request", a.Number, request)
		}
		return a.Save(ctx, pool, http.StatusCreated, map[string]string{"by": "resume"})
	}
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 0 {
		t.Fatalf("Resume within a lease of the failure = %d, %v; want 0: the client may be retrying", n, err)
	}
	time.Sleep(lease + 50*time.Millisecond)
	if n, err := s.Resume(ctx, time.Hour, resume); err != nil || n != 1 || len(resumed) != 1 || resumed[0] != "thing_gave-up" {
		t.Fatalf("Resume after the lease = %d, %v, resumed %v; want only the key whose client gave up", n, err, resumed)
	}
	if w := post(t, h, "gave-up"); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), "resume") {
		t.Errorf("the late retry: %d %s, want the resumed 201 replayed", w.Code, w.Body)
	}
}

// A Store without its pool is refused when it is built, not at the first
// request.
func TestNewRefusesANilPool(t *testing.T) {
	if s, err := httpidem.New(nil, httpidem.Config{}); s != nil || err == nil || !strings.Contains(err.Error(), "needs a pool") {
		t.Fatalf("New(nil): %v, %v; want no store and an error saying it needs a pool", s, err)
	}
}
