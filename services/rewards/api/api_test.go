package api_test

import (
	"context"
	"log/slog"
	"net/http"
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

// A route whose database fails answers 500 "internal" with the request id
// and nothing of the error; the error is logged under that id. Here the
// pool is closed under the API.
func TestA500BodyHoldsTheRequestIDAndNoErrorText(t *testing.T) {
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
	for _, rt := range []testenv.Route{
		{Method: http.MethodGet, Path: "/v1/wallets/u_1"},
		{Method: http.MethodGet, Path: "/v1/cashback-rates"},
		{Method: http.MethodPost, Path: "/v1/cashback-rates", Body: `{"rate_bp":300}`},
	} {
		testenv.Internal500(t, r, rt, "Bearer "+adminKey, logs, "closed pool")
	}
}
