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
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/payments/api"
	"github.com/effectively-once/payments-cashback/services/payments/provider"
)

// A payment id outside the id allowlist (events.ValidID: a NUL, bytes that
// are not UTF-8, a bidi override, 3,000 characters) names no payment that
// can exist: GET and refund answer 404, word for word as for an unknown
// payment, without asking the database. The pool here is closed, so any
// query would be a 500 with an ERROR line; a well-formed id shows it.
func TestAPaymentIDThatCannotExistIsNotFoundWithoutAskingTheDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	log := slog.New(service.NewContextHandler(logs, slog.LevelInfo))
	keys, err := httpidem.New(pool, httpidem.Config{LockTimeout: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	gw := provider.NewStripe(provider.Config{URL: "http://127.0.0.1:1", APIKey: "sk_test_123", MaxRetries: -1, Logger: log})
	clients, err := service.ParseAPIKeys("web:"+webKey, service.RolePay)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(pool, keys, gw, log, service.Access{Keys: clients, RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := service.NewRouter(log, nil, nil)
	srv.Routes(r)
	pool.Close()
	call := func(method, path string) (int, service.ErrorBody) {
		req := httptest.NewRequest(method, path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+webKey)
		req.Header.Set("Idempotency-Key", "k-ids")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		var b service.ErrorBody
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		return w.Code, b
	}
	for _, id := range []string{"%00", "%FF", "pay_1%00", "pay_%E2%80%AE1", "pay_%20", strings.Repeat("p", 3000), "pay_'%3B--"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			path := "/v1/payments/" + id
			if method == http.MethodPost {
				path += "/refund"
			}
			code, b := call(method, path)
			if code != http.StatusNotFound || b.Error.Code != "payment_not_found" || b.Error.Message != "no payment with this id" {
				t.Errorf("%s %.60s: %d %+v, want 404 payment_not_found", method, path, code, b.Error)
			}
		}
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("an id that cannot exist reached the database:\n%.2000s", logs.String())
	}
	if code, _ := call(http.MethodGet, "/v1/payments/pay_00000000000000000000000000000000"); code != http.StatusInternalServerError {
		t.Errorf("a well-formed id on the closed pool: %d, want 500 (the check above would prove nothing)", code)
	}
}
