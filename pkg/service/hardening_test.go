package service_test

import (
	"bytes"
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

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Every form of connection string pgx accepts has its password masked:
// URL user info, the password and sslpassword query parameters, and the
// keyword/value form, bare or quoted. Nothing else changes.
func TestRedactURLMasksThePasswordInEveryFormPgxAccepts(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:hunter2@db:5432/payments?sslmode=disable":          "postgres://app:xxxxx@db:5432/payments?sslmode=disable",
		"postgres://app@db:5432/payments?password=hunter2&sslmode=disable": "postgres://app@db:5432/payments?password=xxxxx&sslmode=disable",
		"postgresql://db/payments?user=app&password=hunter2":               "postgresql://db/payments?password=xxxxx&user=app",
		"postgres://db/payments?sslpassword=hunter2":                       "postgres://db/payments?sslpassword=xxxxx",
		"host=db user=app password=hunter2 dbname=payments":                "host=db user=app password=xxxxx dbname=payments",
		"host=db password = hunter2 dbname=payments":                       "host=db password = xxxxx dbname=payments",
		`host=db password='hunter2 with \' spaces' dbname=payments`:        "host=db password=xxxxx dbname=payments",
		"password=hunter2":                "password=xxxxx",
		"host=db sslpassword=hunter2":     "host=db sslpassword=xxxxx",
		"postgres://app@db:5432/payments": "postgres://app@db:5432/payments",
		"http://127.0.0.1:12111":          "http://127.0.0.1:12111",
		"8081":                            "8081",
	} {
		got := service.RedactURL(in)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, "hunter2") {
			t.Errorf("RedactURL(%q) leaks the password: %q", in, got)
		}
	}
}

// A password with a character it should have percent-encoded ('#', '?',
// '/' or '@', as generated passwords often have) makes url.Parse refuse
// the URL or read it wrongly, while pgx reads it as libpq does and
// connects with it: the config summary, written at every start, must mask
// it all the same. Where such a URL is ambiguous the mask may cover more
// than the password, never less.
func TestRedactURLMasksAPasswordThatIsNotPercentEncoded(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:hun#ter2@db:5432/app":                                "postgres://app:xxxxx@db:5432/app",
		"postgres://app:hun?ter2@db:5432/app":                                "postgres://app:xxxxx@db:5432/app",
		"postgres://app:hun/ter2+YmFy@db:5432/app?sslmode=disable":           "postgres://app:xxxxx@db:5432/app?sslmode=disable",
		"postgres://app:1234/5678@db/app":                                    "postgres://app:xxxxx@db/app", // url.Parse reads no password here
		"postgres://app:hun@ter2@db/app":                                     "postgres://app:xxxxx@db/app",
		"postgresql://app:hun#ter2@db/app?sslmode=disable&password=hun#ter2": "postgresql://app:xxxxx@db/app?sslmode=disable&password=xxxxx",
		"postgres://db/app?sslmode=disable#&password=hun#ter2":               "postgres://db/app?sslmode=disable#&password=xxxxx",
		"postgres://db/app?application_name=a#b&pass%77ord=hunter2":          "postgres://db/app?application_name=a#b&pass%77ord=xxxxx",
		"host=db user=app password=hun#ter2/?@x dbname=app":                  "host=db user=app password=xxxxx dbname=app",
	} {
		got := service.RedactURL(in)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		for _, part := range []string{"hun", "ter2", "YmFy", "5678"} {
			if strings.Contains(got, part) {
				t.Errorf("RedactURL(%q) leaks the password: %q", in, got)
				break
			}
		}
	}
	// What pgx itself takes for the password is not in the summary.
	for _, in := range []string{"postgres://app:hun#ter2@db:5432/app", "postgres://app:hun?ter2@db:5432/app", "postgres://app:hun@ter2@db/app"} {
		cfg, err := pgconn.ParseConfig(in)
		if err != nil {
			t.Fatalf("pgx refuses %q: %v", in, err)
		}
		var buf bytes.Buffer
		service.LogConfig(slog.New(slog.NewJSONHandler(&buf, nil)), struct {
			URL string `env:"DB_URL"`
		}{in})
		if cfg.Password == "" || strings.Contains(buf.String(), cfg.Password) {
			t.Errorf("pgx connects to %q with the password %q, and the config summary holds it: %s", in, cfg.Password, strings.TrimSpace(buf.String()))
		}
	}
}

// Two clients with one key cannot be told apart (the last would win,
// silently): refused, naming both clients and never the key.
func TestTwoClientsWithTheSameKeyAreRefused(t *testing.T) {
	key := "0123456789abcdef0123456789abcdef"
	_, err := service.ParseAPIKeys("web:"+key+",ops/read:"+key, service.RolePay)
	if err == nil || !strings.Contains(err.Error(), "web") || !strings.Contains(err.Error(), "ops") {
		t.Fatalf("two clients with one key: %v, want an error naming both", err)
	}
	if strings.Contains(err.Error(), key) {
		t.Errorf("the error repeats the key: %v", err)
	}
}

// A key written where the name or a role goes (the ':' mistyped or left
// out, name and key swapped, a role list holding a key) is refused at
// start, and the error, which goes to the startup log, says which entry is
// wrong without repeating the key or a piece of it. A short typo of a role
// is still quoted, so the operator sees what to fix.
func TestParseAPIKeysErrorsNeverRepeatAKeyWrittenInTheWrongPlace(t *testing.T) {
	key := "0123456789abcdef0123456789abcdef0123456789abcdef"
	b64 := "Zm9vYmFyYmF6cXV4/Zm9vYmFyYmF6cXV4+Zm9vYmFy" // base64: its '/' and '+' split it into name and roles
	good := "web:fedcba9876543210fedcba9876543210"
	for in, want := range map[string]string{
		"ops/admin=" + key: "entry 1: want name[/role+role]:key",
		"ops/admin " + key: "entry 1: want name[/role+role]:key",
		"ops/" + key:       "entry 1: want name[/role+role]:key",
		key + ":ops":       "entry 1: key shorter than 32 bytes",
		b64 + ":ops":       "entry 1: key shorter than 32 bytes",
		good + ",ops/" + key + ":" + key[1:] + "x": "entry 2 (client ops): role (48 bytes, not shown): want read, admin, pay, send",
		good + "," + key + "=:" + key[1:] + "x":    "entry 2: client name (49 bytes, not shown): want 1-64 of A-Z a-z 0-9 _ . -",
		good + ",ops/read+reed:" + key:             `entry 2 (client ops): role "reed": want read, admin, pay, send`,
	} {
		_, err := service.ParseAPIKeys(in, service.RoleRead)
		if err == nil || err.Error() != want {
			t.Errorf("ParseAPIKeys(%q) = %v, want %q", in, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), key[:12]) || strings.Contains(err.Error(), b64[:12])) {
			t.Errorf("ParseAPIKeys(%q): the error carries the key: %v", in, err)
		}
	}
}

// "web/read: KEY" (a space after the colon, as lists are written) must
// not make a client whose key no request can present: RequireAPIKey trims
// the key it is sent, so ParseAPIKeys trims the spaces around the ':' too,
// and the key as written, sent as a Bearer token, opens the route.
func TestSpacesAroundTheColonOfAnAPIKeyEntryAreNotPartOfTheKeyOrName(t *testing.T) {
	web, ops := "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	ks, err := service.ParseAPIKeys("web/read: "+web+" , ops/admin :\t"+ops, service.RoleRead)
	if err != nil {
		t.Fatalf("ParseAPIKeys refused spaces around the colons: %v", err)
	}
	if ks.Client(web) != "web" || ks.Client(ops) != "ops" || ks.Client(" "+web) != "" {
		t.Fatalf("Client(key) = %q, %q, Client(\" \"+key) = %q: want web, ops and no client", ks.Client(web), ks.Client(ops), ks.Client(" "+web))
	}
	if err := ks.Need(service.RoleRead, service.RoleAdmin); err != nil {
		t.Errorf("ops/admin written with a space before the colon lost its role: %v", err)
	}
	h := service.RequireAPIKey(ks)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, service.ClientOf(r.Context()))
	}))
	for key, want := range map[string]string{web: "web", ops: "ops"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || rec.Body.String() != want {
			t.Errorf("Bearer key of %s: %d %q, want 200 %q", want, rec.Code, rec.Body.String(), want)
		}
	}
}

// /readyz names each check and says ok or failing; the error's text (a
// host, a driver's message) goes to the log only.
func TestReadyzReportsEachChecksNameAndStatusAndLogsTheDetail(t *testing.T) {
	var logs bytes.Buffer
	r := service.NewRouter(slog.New(slog.NewJSONHandler(&logs, nil)), nil, map[string]service.Check{
		"database":  func(context.Context) error { return errors.New("dial tcp 10.0.0.7:5432: connection refused") },
		"sqs queue": func(context.Context) error { return nil },
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	body := w.Body.String()
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(body, `"database":"failing"`) || !strings.Contains(body, `"sqs queue":"ok"`) {
		t.Errorf("/readyz: %d %s, want 503 with database failing and sqs queue ok", w.Code, body)
	}
	if strings.Contains(body, "10.0.0.7") || strings.Contains(body, "refused") {
		t.Errorf("/readyz carries the error text: %s", body)
	}
	if !strings.Contains(logs.String(), "10.0.0.7:5432: connection refused") {
		t.Errorf("the check's error was not logged: %s", logs.String())
	}
}

// /readyz is open to anyone who can reach it, and its checks cost calls
// to SQS and the database: a flood of probes runs them at most once per
// service.ReadinessTTL, concurrent probes share the one evaluation, and a
// change is seen once the TTL has passed.
func TestReadyzFloodRunsTheChecksOncePerTTLAndSeesAChangeAfterIt(t *testing.T) {
	var calls atomic.Int64
	var failing atomic.Bool
	r := service.NewRouter(slog.New(slog.DiscardHandler), nil, map[string]service.Check{
		"sqs queue": func(context.Context) error {
			calls.Add(1)
			time.Sleep(20 * time.Millisecond) // a round trip: concurrent probes overlap it
			if failing.Load() {
				return errors.New("queue gone")
			}
			return nil
		},
	})
	get := func() int {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return w.Code
	}
	var wg sync.WaitGroup
	codes := make([]int, 200)
	for i := range codes {
		wg.Go(func() { codes[i] = get() })
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("probe %d: %d, want 200", i, c)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("200 concurrent probes ran the check %d times, want once", n)
	}
	failing.Store(true)
	if c := get(); c != http.StatusOK || calls.Load() != 1 {
		t.Errorf("a probe within the TTL: %d after %d checks, want the cached 200 and no new check", c, calls.Load())
	}
	time.Sleep(service.ReadinessTTL + 50*time.Millisecond)
	if c := get(); c != http.StatusServiceUnavailable || calls.Load() != 2 {
		t.Errorf("a probe after the TTL: %d after %d checks, want 503 from a second check", c, calls.Load())
	}
}

// A probe whose client goes away mid-check does not leave a "failing"
// behind for the next ones: the checks run on a context of their own.
func TestReadyzCheckOutlivesTheProbeThatStartedIt(t *testing.T) {
	r := service.NewRouter(slog.New(slog.DiscardHandler), nil, map[string]service.Check{
		"database": func(ctx context.Context) error {
			select {
			case <-time.After(50 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/readyz", nil).WithContext(ctx))
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if w.Code != http.StatusOK {
		t.Errorf("/readyz after an abandoned probe: %d %s, want 200", w.Code, w.Body)
	}
}

// A key opens only the routes of its client's roles: 401 without a known
// Bearer key, 403 naming the missing role (never the key) with one, and the
// handler runs only for a client holding the role, whose name it sees.
func TestRolesDecideWhichRoutesAKeyOpens(t *testing.T) {
	const reader, admin = "reader-0123456789abcdef0123456789abcd", "admin-0123456789abcdef0123456789abcde"
	ks, err := service.ParseAPIKeys("dash:"+reader+",ops/read+admin:"+admin, service.RoleRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Need(service.RoleRead, service.RoleAdmin); err != nil {
		t.Errorf("Need(read, admin): %v", err)
	}
	if err := ks.Need(service.RolePay); err == nil || !strings.Contains(err.Error(), "pay") {
		t.Errorf("Need(pay) with no payer: %v, want an error naming pay", err)
	}
	r := service.NewRouter(slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, nil)
	r.Group(func(r chi.Router) {
		service.Access{Keys: ks, RateLimit: 100, AddressRateLimit: 100, RateWindow: time.Second}.Protect(r)
		r.With(service.RequireRole(service.RoleAdmin)).Post("/change", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "changed by "+service.ClientOf(r.Context()))
		})
	})
	for _, c := range []struct {
		auth string
		code int
		has  string
	}{
		{"", 401, "unauthorized"},
		{"Bearer " + reader, 403, `lacks the role \"admin\"`},
		{"Basic " + admin, 401, "unauthorized"},
		{"bearer " + admin, 200, "changed by ops"},
	} {
		req := httptest.NewRequest(http.MethodPost, "/change", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.has) {
			t.Errorf("%.12q: %d %s, want %d with %s", c.auth, w.Code, w.Body, c.code, c.has)
		}
		if strings.Contains(w.Body.String(), reader) || strings.Contains(w.Body.String(), admin) {
			t.Errorf("%.12q: the answer repeats a key: %s", c.auth, w.Body)
		}
	}
}

// LISTEN_ADDR picks the interface (loopback unless set), PORT the port; a
// host:port PORT still works, but not together with LISTEN_ADDR.
func TestListenAddrBindsLoopbackUnlessTold(t *testing.T) {
	for _, c := range []struct{ host, port, want string }{
		{"", "8081", "127.0.0.1:8081"},
		{"0.0.0.0", "8081", "0.0.0.0:8081"},
		{"::1", "8081", "[::1]:8081"},
		{"", ":8081", "0.0.0.0:8081"},
		{"", "127.0.0.1:8081", "127.0.0.1:8081"},
		{"", "0", "127.0.0.1:0"},
		{"0.0.0.0", "127.0.0.1:8081", ""},
		{"", "http", ""},
		{"", "70000", ""},
	} {
		got, err := service.ListenAddr(c.host, c.port)
		if got != c.want || (c.want == "") != (err != nil) {
			t.Errorf("ListenAddr(%q, %q) = %q, %v; want %q", c.host, c.port, got, err, c.want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "0.0.0.0:1": false, ":1": false, "10.0.0.1:1": false} {
		if service.Loopback(addr) != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, !want, want)
		}
	}
}

// A handler that panics is answered like any internal error: 500 in the
// JSON error shape with the request's id, no panic text; the panic and its
// stack go to the log under that id. http.ErrAbortHandler still aborts
// the response (the server drops the connection), as net/http means it to.
func TestAPanickingHandlerIsAJSON500WithTheRequestIDAndTheStackIsLogged(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(service.NewContextHandler(&logs, slog.LevelInfo))
	r := service.NewRouter(log, nil, nil)
	r.Get("/v1/boom", func(http.ResponseWriter, *http.Request) { panic("secret detail: dial 10.0.0.7") })
	r.Get("/v1/abort", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })

	req := httptest.NewRequest(http.MethodGet, "/v1/boom", nil)
	req.Header.Set("X-Request-Id", "req-panic-1")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	body := w.Body.String()
	if w.Code != http.StatusInternalServerError || w.Header().Get("Content-Type") != "application/json" ||
		!strings.Contains(body, `"code":"internal"`) || !strings.Contains(body, `"request_id":"req-panic-1"`) {
		t.Errorf("panic answered %d %q %s, want 500 JSON with code internal and the request id", w.Code, w.Header().Get("Content-Type"), body)
	}
	if strings.Contains(body, "secret") || strings.Contains(body, "10.0.0.7") || strings.Contains(body, "goroutine") {
		t.Errorf("the body carries the panic: %s", body)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "secret detail") {
			line = l
		}
	}
	if line == "" || !strings.Contains(line, `"request_id":"req-panic-1"`) || !strings.Contains(line, "hardening_test.go") {
		t.Errorf("no log line with the panic, the request id and the stack: %q (all logs: %s)", line, logs.String())
	}

	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/abort")
	if err == nil {
		resp.Body.Close()
		t.Errorf("ErrAbortHandler answered %d, want the connection dropped", resp.StatusCode)
	}
}

// HEAD is answered wherever GET is (the status and headers of the GET,
// no body), and a 405 lists it: Allow "GET, HEAD". A made-up method is not
// repeated at length, neither in the 405's body nor in the access log.
func TestHEADWorksWhereGETDoesAndAMadeUpMethodIsNotRepeated(t *testing.T) {
	var logs bytes.Buffer
	r := service.NewRouter(slog.New(slog.NewJSONHandler(&logs, nil)), nil, nil)
	r.Get("/v1/things", func(w http.ResponseWriter, _ *http.Request) {
		service.WriteJSON(w, http.StatusOK, map[string]int{"things": 3})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := http.Head(srv.URL + "/v1/things")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || len(b) != 0 {
		t.Errorf("HEAD /v1/things: %d %q with %d body bytes, want 200 application/json and no body", resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
	}

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/things", nil))
	if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/things: %d, Allow %q; want 405 with Allow \"GET, HEAD\"", w.Code, w.Header().Get("Allow"))
	}

	made := strings.Repeat("FROB", 1000)
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(made, "/v1/things", nil))
	if w.Code != http.StatusMethodNotAllowed || strings.Contains(w.Body.String(), "FROBFROB") || !strings.Contains(w.Body.String(), `"method_not_allowed"`) {
		t.Errorf("a 4,000-byte method: %d %.200s; want 405 method_not_allowed without the method", w.Code, w.Body)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "FROB") && strings.Contains(line, strings.Repeat("FROB", 5)) {
			t.Errorf("the access log repeats the made-up method at length: %.200s", line)
		}
	}
	if !strings.Contains(logs.String(), `"status":405`) {
		t.Errorf("the 405 was not logged: %s", logs.String())
	}
}
