package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/api"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const adminKey = "rewards-admin-0123456789abcdef0123456"

// newAPI is the API on a migrated database, with adminKey holding read
// and admin, its pool and its log.
func newAPI(t *testing.T) (http.Handler, *pgxpool.Pool, *testenv.Buffer) {
	t.Helper()
	pool := testenv.DB(t)
	if err := app.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return routes(t, pool)
}

// closedPoolAPI is the API on a pool closed under it (any query fails),
// with adminKey holding read and admin, and its log.
func closedPoolAPI(t *testing.T) (http.Handler, *testenv.Buffer) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	r, _, logs := routes(t, pool)
	pool.Close()
	return r, logs
}

func routes(t *testing.T, pool *pgxpool.Pool) (http.Handler, *pgxpool.Pool, *testenv.Buffer) {
	t.Helper()
	logs := &testenv.Buffer{}
	log := slog.New(service.NewContextHandler(logs, slog.LevelInfo))
	keys, err := service.ParseAPIKeys("ops/read+admin:"+adminKey, service.RoleRead)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(pool, log, service.Access{Keys: keys, RateLimit: 100, AddressRateLimit: 100, RateWindow: time.Second},
		cashback.RateRules{MaxBP: 1000, MinLead: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r := service.NewRouter(log, nil, nil)
	srv.Routes(r)
	return r, pool, logs
}

// call makes one request as adminKey and returns the status and body.
func call(r http.Handler, method, path, body string) (int, string) {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	return w.Code, w.Body.String()
}

// A route whose database fails answers 500 "internal" with the request id
// and nothing of the error; the error is logged under that id. Here the
// pool is closed under the API.
func TestA500BodyHoldsTheRequestIDAndNoErrorText(t *testing.T) {
	r, logs := closedPoolAPI(t)
	for _, rt := range []testenv.Route{
		{Method: http.MethodGet, Path: "/v1/wallets/u_1"},
		{Method: http.MethodGet, Path: "/v1/cashback-rates"},
		{Method: http.MethodPost, Path: "/v1/cashback-rates", Body: `{"rate_bp":300}`},
	} {
		testenv.Internal500(t, r, rt, "Bearer "+adminKey, logs, "closed pool")
	}
}

// A user id outside the id allowlist (events.ValidID, the rule user_id
// follows everywhere) names no wallet that can exist: 404, without a
// query (the pool is closed: a query would be a 500), and the id is not
// echoed back. A query value of the wrong shape is 400, also before any
// query.
func TestAUserIDThatCannotExistIsNotFoundWithoutAskingTheDatabase(t *testing.T) {
	r, logs := closedPoolAPI(t)
	get := func(path string) (int, string) { return call(r, http.MethodGet, path, "") }
	long := strings.Repeat("u", 3000)
	for _, id := range []string{"%00", "%FF", "u_17%E2%80%AE", "u%E2%80%8B17", "u_17%20", long} {
		code, body := get("/v1/wallets/" + id)
		var b service.ErrorBody
		_ = json.Unmarshal([]byte(body), &b)
		if code != http.StatusNotFound || b.Error.Code != "wallet_not_found" || strings.Contains(body, "\u202e") || strings.Contains(body, long) {
			t.Errorf("GET /v1/wallets/%.40s: %d %.200s, want 404 wallet_not_found", id, code, body)
		}
	}
	for _, q := range []string{"?limit=%00", "?before=%FF"} {
		if code, body := get("/v1/wallets/u_17" + q); code != http.StatusBadRequest {
			t.Errorf("GET /v1/wallets/u_17%s: %d %s, want 400", q, code, body)
		}
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("a user id that cannot exist reached the database:\n%.2000s", logs.String())
	}
}

// A user id with a character a client's URL encoder escapes ('@', ':') is
// the same wallet escaped or not: chi hands the handler the raw, still
// escaped path segment, which the id allowlist refused (404).
func TestAWalletAskedForWithItsUserIDPercentEncodedIsTheSameWallet(t *testing.T) {
	r, pool, _ := newAPI(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO wallets (user_id, balance_paise) VALUES ('alice@example', 2400)`); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/wallets/alice@example", "/v1/wallets/alice%40example", "/v1/wallets/%61lice%40example"} {
		code, body := call(r, http.MethodGet, path, "")
		var w struct {
			UserID  string `json:"user_id"`
			Balance int64  `json:"balance_paise"`
		}
		if err := json.Unmarshal([]byte(body), &w); code != http.StatusOK || err != nil || w.UserID != "alice@example" || w.Balance != 2400 {
			t.Errorf("GET %s: %d %s, want 200 alice@example's 2400 paise", path, code, body)
		}
	}
}

// An effective_from that parses but is past year 9999 in UTC
// (9999-12-31T23:59:59-01:00) cannot be written back as JSON: stored, it
// made POST a 201 with no body and every later GET of the rates a 200
// with no body. It is refused, and the rates still list.
func TestARateStartingAfterYear9999IsRefusedAndTheRatesStillList(t *testing.T) {
	r, _, _ := newAPI(t)
	code, body := call(r, http.MethodPost, "/v1/cashback-rates", `{"rate_bp":300,"effective_from":"9999-12-31T23:59:59-01:00"}`)
	var b service.ErrorBody
	if err := json.Unmarshal([]byte(body), &b); code != http.StatusUnprocessableEntity || err != nil || b.Error.Field != "effective_from" {
		t.Errorf("POST a rate in year 10000: %d %s, want 422 on effective_from", code, body)
	}
	code, body = call(r, http.MethodGet, "/v1/cashback-rates", "")
	var rates struct {
		Rates []cashback.Rate `json:"rates"`
	}
	if err := json.Unmarshal([]byte(body), &rates); code != http.StatusOK || err != nil || len(rates.Rates) != 1 {
		t.Errorf("GET the rates: %d %q, want 200 and the seeded rate alone", code, body)
	}
}

// The API answers times in UTC, whatever the host's zone. pgx scans a
// timestamptz in the process's zone: on a host east of UTC (TZ=Asia/Kolkata,
// as a rupee system may well run), a rate accepted for 9999-12-31T23:00Z, or
// a credit whose event occurred then, is in year 10000 there, which JSON
// cannot encode, and every GET of the rates (or of that wallet) answered 500
// until someone deleted the row by hand. The zone is set before anything
// starts and restored after everything stopped (cleanups run last-in,
// first-out), so no goroutine reads time.Local while it changes.
func TestTimesAreAnsweredInUTCOnAHostEastOfUTC(t *testing.T) {
	local := time.Local
	t.Cleanup(func() { time.Local = local })
	time.Local = time.FixedZone("IST", 5*3600+1800)
	r, pool, _ := newAPI(t)
	code, body := call(r, http.MethodPost, "/v1/cashback-rates", `{"rate_bp":300,"effective_from":"9999-12-31T23:00:00Z"}`)
	if code != http.StatusCreated || !strings.Contains(body, `"9999-12-31T23:00:00Z"`) {
		t.Fatalf("POST a rate in the last hour of 9999 UTC: %d %s, want 201 answering it in UTC", code, body)
	}
	code, body = call(r, http.MethodGet, "/v1/cashback-rates", "")
	var rates struct {
		Rates []cashback.Rate `json:"rates"`
	}
	if err := json.Unmarshal([]byte(body), &rates); code != http.StatusOK || err != nil || len(rates.Rates) != 2 ||
		!strings.Contains(body, `"9999-12-31T23:00:00Z"`) {
		t.Errorf("GET the rates: %d %q (%v), want 200 with both rates, in UTC", code, body, err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO cashback_credits
		(payment_id, user_id, recipient, payment_amount_paise, currency, rate_bp, amount_paise, event_id, payment_version, occurred_at)
		VALUES ('pay_late', 'u_late', 'u_late', 10000, 'INR', 200, 200, gen_random_uuid(), 1, '9999-12-31T23:00:00Z');
		INSERT INTO wallets (user_id, balance_paise) VALUES ('u_late', 200)`); err != nil {
		t.Fatal(err)
	}
	code, body = call(r, http.MethodGet, "/v1/wallets/u_late", "")
	if code != http.StatusOK || !strings.Contains(body, `"occurred_at":"9999-12-31T23:00:00Z"`) || !strings.Contains(body, `"credited_at":"`) ||
		strings.Contains(body, "+05:30") {
		t.Errorf("GET the wallet: %d %s, want 200 with its credit's times in UTC", code, body)
	}
}
