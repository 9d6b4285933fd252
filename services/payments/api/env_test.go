package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/payments/api"
	"github.com/effectively-once/payments-cashback/services/payments/migrations"
	"github.com/effectively-once/payments-cashback/services/payments/provider"
	"github.com/effectively-once/payments-cashback/services/payments/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// stripeCall is one request the recording proxy saw on its way to stripe-mock.
type stripeCall struct {
	Method, Path, Key string
}

// stripeProxy records every call to stripe-mock (method, path and the
// Idempotency-Key header): stripe-mock is stateless, so the calls and keys
// the client sent are what tests count. A hook may answer a call itself
// (a decline, an outage) or hold it (a slow provider).
type stripeProxy struct {
	URL   string
	mu    sync.Mutex
	calls []stripeCall
	hook  func(w http.ResponseWriter, r *http.Request) (answered bool)
}

func newStripeProxy(t *testing.T) *stripeProxy {
	t.Helper()
	target, err := url.Parse(testenv.StripeMock(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &stripeProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.calls = append(p.calls, stripeCall{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key")})
		hook := p.hook
		p.mu.Unlock()
		if hook != nil && hook(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *stripeProxy) setHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	p.mu.Lock()
	p.hook = h
	p.mu.Unlock()
}

// callsTo returns the calls to path, in order.
func (p *stripeProxy) callsTo(path string) []stripeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stripeCall
	for _, c := range p.calls {
		if c.Path == path {
			out = append(out, c)
		}
	}
	return out
}

func (p *stripeProxy) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

const (
	chargesPath = "/v1/payment_intents"
	refundsPath = "/v1/refunds"
	validBody   = `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"upi"}`
)

// env is the Payments API on a fresh database, with Stripe behind a
// recording proxy in front of a real stripe-mock.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	stripe *stripeProxy
	url    string
	client *http.Client
	keys   *httpidem.Store
	srv    *api.Server
}

func newEnv(t *testing.T, lockTimeout time.Duration) *env {
	t.Helper()
	return newEnvWith(t, lockTimeout, 10000, nil)
}

// newEnvWith is newEnv with a rate limit per second per client and, if
// serve is not nil, served by serve (which returns the base URL) instead of
// httptest.
func newEnvWith(t *testing.T, lockTimeout time.Duration, ratePerSecond int, serve func(http.Handler) string) *env {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	if err := migrations.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	proxy := newStripeProxy(t)
	keys, err := httpidem.New(pool, httpidem.Config{LockTimeout: lockTimeout, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// No stripe-go retries: every call the proxy sees is one the service made.
	gw := provider.NewStripe(provider.Config{URL: proxy.URL, APIKey: "sk_test_123", MaxRetries: -1, MockFixtures: true, Logger: quiet})
	clients, err := service.ParseAPIKeys("web:"+webKey+",ops:"+opsKey+",reader/read:"+readerKey, service.RolePay)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(pool, keys, gw, quiet, service.Access{Keys: clients, RateLimit: ratePerSecond, AddressRateLimit: 2 * ratePerSecond, RateWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	router := service.NewRouter(quiet, nil, nil)
	srv.Routes(router)
	if serve != nil {
		return &env{t: t, pool: pool, stripe: proxy, url: serve(router), client: http.DefaultClient, keys: keys, srv: srv}
	}
	hs := httptest.NewServer(router)
	t.Cleanup(hs.Close)
	return &env{t: t, pool: pool, stripe: proxy, url: hs.URL, client: hs.Client(), keys: keys, srv: srv}
}

// The test clients' API keys; requests go as "web" unless they say.
const (
	webKey    = "web-0123456789abcdef0123456789abcdef"
	opsKey    = "ops-0123456789abcdef0123456789abcdef"
	readerKey = "reader-0123456789abcdef0123456789abc" // the role read only: no payments
	// foreignKey is a key of another service's client.
	foreignKey = "rewards-admin-0123456789abcdef0123456"
)

type response struct {
	status int
	body   []byte
	header http.Header
}

// errorDetail decodes a service.ErrorBody.
func (r response) errorDetail(t *testing.T) service.ErrorDetail {
	t.Helper()
	var b service.ErrorBody
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error.Code == "" {
		t.Fatalf("status %d: body %q is not a JSON error (%v)", r.status, r.body, err)
	}
	return b.Error
}

func (r response) payment(t *testing.T) store.Payment {
	t.Helper()
	var p store.Payment
	if err := json.Unmarshal(r.body, &p); err != nil || p.ID == "" {
		t.Fatalf("status %d: body %q is not a payment (%v)", r.status, r.body, err)
	}
	return p
}

func (e *env) try(client *http.Client, method, path, key, body string) (response, error) {
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+webKey)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, body: b, header: resp.Header}, err
}

func (e *env) do(method, path, key, body string) response {
	e.t.Helper()
	r, err := e.try(e.client, method, path, key, body)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (e *env) create(key, body string) response {
	return e.do(http.MethodPost, "/v1/payments", key, body)
}

func (e *env) refund(id, key string) response {
	return e.do(http.MethodPost, "/v1/payments/"+id+"/refund", key, "")
}

// mustCreate creates a payment and returns it.
func (e *env) mustCreate(key string) store.Payment {
	e.t.Helper()
	r := e.create(key, validBody)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create: status %d, body %s", r.status, r.body)
	}
	return r.payment(e.t)
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// outboxRow is one row of the outbox table.
type outboxRow struct {
	ID               string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	Payload          map[string]any
}

func (e *env) outbox() []outboxRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT id::text, aggregate_id, aggregate_version, event_type, payload FROM outbox ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.ID, &r.AggregateID, &r.AggregateVersion, &r.EventType, &r.Payload); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// assertNothingWritten checks that no payment, outbox row, key or Stripe
// call exists.
func (e *env) assertNothingWritten() {
	e.t.Helper()
	for _, table := range []string{"payments", "outbox", "idempotency_keys"} {
		if n := e.count("SELECT count(*) FROM " + table); n != 0 {
			e.t.Errorf("%s has %d rows, want 0", table, n)
		}
	}
	if n := e.stripe.total(); n != 0 {
		e.t.Errorf("stripe saw %d calls, want 0", n)
	}
}

// stripeError returns a hook that answers calls to path with a Stripe
// error, n times (n < 0: always), and then lets calls through.
func stripeError(path string, n int, status int, body string) func(w http.ResponseWriter, r *http.Request) bool {
	var mu sync.Mutex
	return func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != path || n == 0 {
			return false
		}
		n--
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
		return true
	}
}
