package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

// The rewards API's test clients: a reader, an operator with read and
// admin, and a key that belongs to another service's client.
const (
	readKey    = "rewards-read-0123456789abcdef01234567"
	adminKey   = "rewards-admin-0123456789abcdef0123456"
	foreignKey = "payments-web-0123456789abcdef01234567"
)

var testAccess = service.AccessEnv{APIKeys: "reader:" + readKey + ",ops/read+admin:" + adminKey,
	RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second}

// do sends body to path with key (none when "") and returns the status and body.
func (s *stack) do(method, path, key, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.http.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every route of the rewards API refuses a caller without the route's
// role: no key, a wrong key, the Basic scheme, another service's key (401)
// and a read key on the rate change (403 naming admin). Rates, wallets
// and credits are as they were.
func TestHostileRequestsToEveryRewardsRouteAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO wallets (user_id, balance_paise) VALUES ('u_1', 2400)`); err != nil {
		t.Fatal(err)
	}
	testenv.HostileRoutes(t, s.http.URL, []testenv.Route{
		{Method: http.MethodGet, Path: "/v1/wallets/u_1", Role: service.RoleRead},
		{Method: http.MethodGet, Path: "/v1/cashback-rates", Role: service.RoleRead},
		{Method: http.MethodPost, Path: "/v1/cashback-rates", Body: `{"rate_bp":10000}`, Role: service.RoleAdmin},
		{Method: http.MethodPost, Path: "/v1/cashback-rates", Body: `{"rate_bp":500}`, Role: service.RoleAdmin},
	}, testenv.RouteKeys{Read: readKey, Admin: adminKey, Foreign: foreignKey}, func() string {
		return testenv.TableDigest(t, s.pool, "cashback_rates", "wallets", "cashback_credits", "processed_messages", "outbox")
	})
}

// A rate above REWARDS_MAX_RATE_BP is 422 naming the ceiling and stores
// nothing. A rate within it is stored with the client that made it, and
// the service logs exactly one audit line with that client, the rate it
// replaces and the new one.
func TestARateAboveTheCeilingIsRefusedAndAnAcceptedOneRecordsItsClientInOneAuditLine(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	code, body := s.do(http.MethodPost, "/v1/cashback-rates", adminKey, `{"rate_bp":1001}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "rate_above_ceiling") || !strings.Contains(body, "1000") {
		t.Errorf("rate 1001 over a ceiling of 1000: %d %s, want 422 rate_above_ceiling naming 1000", code, body)
	}
	if n := s.count(`SELECT count(*) FROM cashback_rates`); n != 1 {
		t.Fatalf("%d rates after a refused change, want only the seeded one", n)
	}

	code, body = s.do(http.MethodPost, "/v1/cashback-rates", adminKey, `{"rate_bp":1000}`)
	if code != http.StatusCreated {
		t.Fatalf("rate 1000 at the ceiling: %d %s, want 201", code, body)
	}
	var by string
	if err := s.pool.QueryRow(context.Background(), `SELECT created_by FROM cashback_rates WHERE rate_bp = 1000`).Scan(&by); err != nil || by != "ops" {
		t.Errorf("stored created_by = %q (%v), want ops", by, err)
	}
	var audits []map[string]any
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, "audit: cashback rate changed") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			audits = append(audits, m)
		}
	}
	if len(audits) != 1 {
		t.Fatalf("%d audit lines, want 1:\n%s", len(audits), s.logs.String())
	}
	if a := audits[0]; a["client"] != "ops" || a["old_rate_bp"] != float64(200) || a["new_rate_bp"] != float64(1000) {
		t.Errorf("audit line %v, want client ops, old_rate_bp 200, new_rate_bp 1000", a)
	}
}

// A rate must start at least REWARDS_RATE_MIN_LEAD (default one minute)
// from now: one starting in ten seconds could still reach a payment that
// is being made right now, so it is refused and nothing is stored. Left
// out, effective_from is now plus the lead.
func TestARateStartingSoonerThanTheMinimumLeadIsRefused(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true, cfg: func(c *app.Config) { c.RateMinLead = time.Minute }})
	soon := time.Now().Add(10 * time.Second).UTC().Format(time.RFC3339Nano)
	code, body := s.do(http.MethodPost, "/v1/cashback-rates", adminKey, fmt.Sprintf(`{"rate_bp":300,"effective_from":%q}`, soon))
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "retroactive_rate") {
		t.Errorf("a rate starting in 10 s: %d %s, want 422 retroactive_rate", code, body)
	}
	if n := s.count(`SELECT count(*) FROM cashback_rates`); n != 1 {
		t.Errorf("rates = %d, want only the seeded one", n)
	}
	// The zero time, sent, is a time long past, not "left out".
	code, body = s.do(http.MethodPost, "/v1/cashback-rates", adminKey, `{"rate_bp":300,"effective_from":"0001-01-01T00:00:00Z"}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "retroactive_rate") {
		t.Errorf("a rate from 0001-01-01: %d %s, want 422 retroactive_rate", code, body)
	}
	if n := s.count(`SELECT count(*) FROM cashback_rates`); n != 1 {
		t.Errorf("rates = %d, want only the seeded one", n)
	}
	t0 := time.Now()
	code, body = s.do(http.MethodPost, "/v1/cashback-rates", adminKey, `{"rate_bp":300}`)
	if code != http.StatusCreated {
		t.Fatalf("a rate without effective_from: %d %s", code, body)
	}
	var r cashback.Rate
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if lead := r.EffectiveFrom.Sub(t0); lead < 59*time.Second || lead > 2*time.Minute {
		t.Errorf("default effective_from is %v from now, want the one-minute lead", lead)
	}
}

// A wallet's credits come a page at a time, newest first; next_before
// leads to the older ones and is absent on the last page. The credits' ids
// are past 2^31 here, as a busy service's get: the cursor is a bigint.
func TestWalletCreditsArePaginatedNewestFirst(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	if _, err := s.pool.Exec(context.Background(), `SELECT setval(pg_get_serial_sequence('cashback_credits', 'id'), 3000000000)`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := s.pool.Exec(context.Background(), `INSERT INTO cashback_credits (payment_id, user_id, recipient,
			payment_amount_paise, currency, rate_bp, amount_paise, event_id, payment_version, occurred_at)
			VALUES ($1, 'u_p', 'u_p', 100000, 'INR', 200, 2000, gen_random_uuid(), 1, now())`, fmt.Sprintf("pay_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	page := func(q string) cashback.Wallet {
		code, body := s.do(http.MethodGet, "/v1/wallets/u_p"+q, readKey, "")
		if code != http.StatusOK {
			t.Fatalf("GET wallet%s: %d %s", q, code, body)
		}
		var w cashback.Wallet
		if err := json.Unmarshal([]byte(body), &w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	first := page("?limit=2")
	if len(first.Credits) != 2 || first.Credits[0].PaymentID != "pay_2" || first.Credits[1].PaymentID != "pay_1" || first.NextBefore == 0 {
		t.Fatalf("first page %+v, want pay_2, pay_1 and a cursor", first)
	}
	last := page(fmt.Sprintf("?limit=2&before=%d", first.NextBefore))
	if len(last.Credits) != 1 || last.Credits[0].PaymentID != "pay_0" || last.NextBefore != 0 {
		t.Errorf("last page %+v, want pay_0 and no cursor", last)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?before=x"} {
		if code, body := s.do(http.MethodGet, "/v1/wallets/u_p"+q, readKey, ""); code != http.StatusBadRequest {
			t.Errorf("GET wallet%s: %d %s, want 400", q, code, body)
		}
	}
}

// The service refuses to start without a client for each role its routes
// need, and with two clients sharing a key.
func TestRewardsRefusesToStartWithoutKeysForEveryRole(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ keys, want string }{
		{"", "REWARDS_API_KEYS is empty"},
		{"reader:" + readKey, "no client has the role admin"},
		{"reader:" + readKey + ",ops/read+admin:" + readKey, "clients reader and ops have the same key"},
	} {
		cfg := app.Config{DedupeRetention: 360 * time.Hour, Port: "0", MaxRateBP: 1000, RateMinLead: time.Minute,
			Access: service.AccessEnv{APIKeys: c.keys, RateLimit: 1, AddressRateLimit: 1, RateWindow: time.Second}}
		_, err := app.New(context.Background(), cfg, nil, nil, nil, slog.Default())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("keys %q: %v, want an error saying %q", c.keys, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), readKey) {
			t.Errorf("the error repeats a key: %v", err)
		}
	}
}

// A rate change is read strictly, as every body of these APIs: the same
// field twice, data after the object, a field name in another case, a
// wrong type and a body over 64 KiB are refused, naming the problem in the
// API's own words, and no rate is written.
func TestARateChangeBodyIsReadStrictlyAndARefusedOneWritesNoRate(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	cases := []struct {
		name, body string
		status     int
		code       string
		message    string
	}{
		{"the same field twice", `{"rate_bp":900,"rate_bp":300}`, 400, "duplicate_field", `field "rate_bp" given twice`},
		{"data after the object", `{"rate_bp":300} {"rate_bp":900}`, 400, "malformed_json", "data after the JSON object"},
		{"a field name in another case", `{"RATE_BP":300}`, 400, "unknown_field", `unknown field "RATE_BP"`},
		{"a string for the rate", `{"rate_bp":"300"}`, 400, "invalid_type", `field "rate_bp" must be an integer, not a string`},
		{"a time that is not one", `{"rate_bp":300,"effective_from":"soon"}`, 400, "invalid_type", `field "effective_from" must be an RFC 3339 time`},
		{"not JSON", `rate=300`, 400, "malformed_json", "body is not valid JSON (at byte 1)"},
		{"70 KB", `{"rate_bp":300,"pad":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "body_too_large", "body over 64 KiB"},
	}
	for _, c := range cases {
		code, body := s.do(http.MethodPost, "/v1/cashback-rates", adminKey, c.body)
		var b service.ErrorBody
		_ = json.Unmarshal([]byte(body), &b)
		if code != c.status || b.Error.Code != c.code || b.Error.Message != c.message {
			t.Errorf("%s: %d %s, want %d %s %q", c.name, code, body, c.status, c.code, c.message)
		}
	}
	if n := s.count(`SELECT count(*) FROM cashback_rates`); n != 1 {
		t.Errorf("%d rates after refused changes, want only the seeded one", n)
	}
}

// The tasks are named for the queues as configured, so a shutdown that
// names a task still running names the queue it really reads.
func TestTasksAreNamedForTheConfiguredQueues(t *testing.T) {
	t.Parallel()
	s := start(t, options{noWorkers: true})
	var names []string
	for _, task := range s.app.Tasks() {
		names = append(names, task.Name)
	}
	all := strings.Join(names, ", ")
	for _, want := range []string{"subscriber " + name(s.payments), "outbox relay " + name(s.rewards)} {
		if !strings.Contains(all, want) {
			t.Errorf("tasks %s; want one named %q", all, want)
		}
	}
}
