package app_test

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
	"github.com/effectively-once/payments-cashback/services/notifications/api"
	"github.com/effectively-once/payments-cashback/services/notifications/app"
)

// The notifications API's test clients: a reader, and a key of another
// service's client.
const (
	readKey    = "notifications-read-0123456789abcdef012"
	foreignKey = "rewards-admin-0123456789abcdef0123456"
)

var testAccess = service.AccessEnv{APIKeys: "support:" + readKey, RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second}

// The notifications API's one route, which lists phone numbers, refuses a
// caller without the role read: no key, a wrong key, the Basic scheme,
// another service's key. The notifications and the inbox are as they
// were. (It has no admin route: replay and skip are cmd/inboxctl's, on the
// database, not over HTTP.)
func TestHostileRequestsToTheNotificationsRouteAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	e := credited(t)
	s.send(e)
	eventually(t, 20*time.Second, "the SMS sent", func() bool {
		return s.count(`SELECT count(*) FROM notifications WHERE status = 'SENT'`) == 1
	})
	testenv.HostileRoutes(t, s.http.URL, []testenv.Route{
		{Method: http.MethodGet, Path: "/v1/notifications", Role: service.RoleRead},
		{Method: http.MethodGet, Path: "/v1/notifications?event_id=" + e.EventID.String(), Role: service.RoleRead},
	}, testenv.RouteKeys{Read: readKey, Admin: readKey, Foreign: foreignKey}, func() string {
		return testenv.TableDigest(t, s.pool, "notifications", "inbox")
	})
}

// closedPoolAPI is the API on a pool closed under it (any query fails),
// with testAccess's keys, and its log.
func closedPoolAPI(t *testing.T) (http.Handler, *testenv.Buffer) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	log := slog.New(service.NewContextHandler(logs, slog.LevelInfo))
	access, err := testAccess.Parse("NOTIFICATIONS_", api.Needs, service.RoleRead)
	if err != nil {
		t.Fatal(err)
	}
	r := service.NewRouter(log, nil, nil)
	if err := api.Routes(r, pool, log, access); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	return r, logs
}

// A failing database gives a 500 with the request id and no error text.
func TestANotifications500BodyHoldsTheRequestIDAndNoErrorText(t *testing.T) {
	t.Parallel()
	r, logs := closedPoolAPI(t)
	testenv.Internal500(t, r, testenv.Route{Method: http.MethodGet, Path: "/v1/notifications"}, "Bearer "+readKey, logs, "closed pool")
}

// Without its own key at the SMS provider the service refuses to start,
// naming the variable, rather than offer every SMS to a provider that
// would refuse it (401).
func TestNotificationsRefusesToStartWithoutItsProviderKey(t *testing.T) {
	t.Parallel()
	cfg := app.Config{PolicyCashback: "resend", PolicyCashbackReversed: "resend", Port: "0", Access: testAccess}
	_, err := app.New(context.Background(), cfg, nil, nil, nil, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "SMS_PROVIDER_API_KEY is empty") {
		t.Errorf("no provider key: %v, want SMS_PROVIDER_API_KEY is empty", err)
	}
}

// Without a reader's key the service refuses to start.
func TestNotificationsRefusesToStartWithoutAReadKey(t *testing.T) {
	t.Parallel()
	cfg := app.Config{PolicyCashback: "resend", PolicyCashbackReversed: "resend", Port: "0",
		Access: service.AccessEnv{RateLimit: 1, AddressRateLimit: 1, RateWindow: time.Second}}
	_, err := app.New(context.Background(), cfg, nil, nil, nil, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "NOTIFICATIONS_API_KEYS is empty") {
		t.Errorf("no keys: %v, want NOTIFICATIONS_API_KEYS is empty", err)
	}
}

// ?status= is one of the four states a notification can be in; anything
// else (a typo, a NUL, bytes that are not UTF-8) is 400 naming the allowed
// values, answered without a query (the pool is closed: a query would be
// a 500). A bad event_id or limit is 400 too.
func TestANotificationsQueryOutsideTheStatesIsRefusedWithoutAskingTheDatabase(t *testing.T) {
	t.Parallel()
	r, logs := closedPoolAPI(t)
	get := func(q string) (int, service.ErrorBody) {
		req := httptest.NewRequest(http.MethodGet, "/v1/notifications"+q, nil)
		req.Header.Set("Authorization", "Bearer "+readKey)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		var b service.ErrorBody
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		return w.Code, b
	}
	for _, q := range []string{"?status=bogus", "?status=sent", "?status=%FF", "?status=SENT%00", "?event_id=%00", "?limit=%FF"} {
		code, b := get(q)
		if code != http.StatusBadRequest || b.Error.Field == "" {
			t.Errorf("%s: %d %+v, want 400 naming the parameter", q, code, b.Error)
		}
		if strings.HasPrefix(q, "?status=") && b.Error.Message != "status must be one of PENDING, SENDING, SENT, FAILED" {
			t.Errorf("%s: message %q, want the allowed values", q, b.Error.Message)
		}
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("a query value outside its shape reached the database:\n%.2000s", logs.String())
	}
	if code, _ := get("?status=SENT"); code != http.StatusInternalServerError {
		t.Errorf("status=SENT on the closed pool: %d, want 500 (the checks above would prove nothing)", code)
	}
}
