package httpidem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
)

// An endpoint whose effect and saved response commit in one transaction:
// the same key and body again replays the response, the same key with
// another body is a 422, and a request without a key never reaches it.
func ExampleStore_Handle() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := httpidem.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE payments (id text PRIMARY KEY, amount_paise bigint NOT NULL)`)
	keys, err := httpidem.New(pool, httpidem.Config{})
	if err != nil {
		panic(err)
	}

	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			AmountPaise int64 `json:"amount_paise"`
		}
		if json.NewDecoder(r.Body).Decode(&in) != nil || in.AmountPaise <= 0 {
			http.Error(w, "bad request", http.StatusBadRequest) // validated first: nothing saved
			return
		}
		// The scope starts with the authenticated caller (one client here),
		// so that another client's equal key is another key.
		req := httpidem.Request{Scope: "client_a POST /v1/payments", Fingerprint: in, NewResourceID: func() string { return "pay_42" }}
		keys.Handle(w, r, req, func(ctx context.Context, a *httpidem.Attempt) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, a.ResourceID, in.AmountPaise); err != nil {
					return err
				}
				return a.Save(ctx, tx, http.StatusCreated, map[string]any{"id": a.ResourceID, "amount_paise": in.AmountPaise})
			})
		})
	})
	srv := httptest.NewServer(httpidem.RequireKey(create))
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if key != "" {
			req.Header.Set(httpidem.HeaderKey, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	post("k-1", `{"amount_paise":120000}`)
	post("k-1", `{"amount_paise":120000}`)
	post("k-1", `{"amount_paise":99}`)
	post("", `{"amount_paise":120000}`)
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// 422 replayed: false
	// 400 replayed: false
	// payments: 1
}
