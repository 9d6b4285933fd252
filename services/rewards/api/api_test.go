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
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const adminKey = "rewards-admin-0123456789abcdef0123456"

// closedPoolAPI is the API on a pool closed under it (any query fails),
// with adminKey holding read and admin, and its log.
func closedPoolAPI(t *testing.T) (http.Handler, *testenv.Buffer) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
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
	pool.Close()
	return r, logs
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
	get := func(path string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+adminKey)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
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
