package testenv

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Route is one route of an API under test and the role it needs.
type Route struct {
	Method, Path, Body string
	Role               service.Role
}

// RouteKeys are the keys a hostile-request table tries: Read holds only
// the role read, Admin holds every role the API needs, Foreign is a valid
// key of another service's client (unknown here).
type RouteKeys struct {
	Read, Admin, Foreign string
}

// HostileRoutes sends, to every route at baseURL, the requests no caller
// without the route's role may get through, and checks each answer: no
// Authorization, a wrong key, the admin key under the Basic scheme and
// another service's key are 401 with a Bearer challenge; the read key on
// a route of another role (admin, send) is 403 naming that role. No answer
// repeats a key.
// state is read before and after (a digest of the tables the API could
// change): it must not move. A read route must then answer 200 to the read
// key, so a route that refused everyone would fail here too.
func HostileRoutes(t *testing.T, baseURL string, routes []Route, keys RouteKeys, state func() string) {
	t.Helper()
	before := state()
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+keys.Admin))
	for _, rt := range routes {
		cases := []struct {
			name, auth string
			want       int
		}{
			{"no key", "", http.StatusUnauthorized},
			{"wrong key", "Bearer " + strings.Repeat("0", 48), http.StatusUnauthorized},
			{"Basic scheme", basic, http.StatusUnauthorized},
			{"admin key under Basic", "Basic " + keys.Admin, http.StatusUnauthorized},
			{"another service's key", "Bearer " + keys.Foreign, http.StatusUnauthorized},
			{"empty bearer", "Bearer ", http.StatusUnauthorized},
		}
		if rt.Role != service.RoleRead {
			cases = append(cases, struct {
				name, auth string
				want       int
			}{"read key on a route of the role " + string(rt.Role), "Bearer " + keys.Read, http.StatusForbidden})
		}
		for _, c := range cases {
			code, hdr, body := call(t, baseURL, rt, c.auth)
			what := rt.Method + " " + rt.Path + " with " + c.name
			if code != c.want {
				t.Errorf("%s: %d %s, want %d", what, code, body, c.want)
			}
			if c.want == http.StatusUnauthorized && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge", what, hdr.Get("WWW-Authenticate"))
			}
			if c.want == http.StatusForbidden && !strings.Contains(body, `\"`+string(rt.Role)+`\"`) {
				t.Errorf("%s: body %s does not name the missing role %s", what, body, rt.Role)
			}
			for _, k := range []string{keys.Read, keys.Admin, keys.Foreign} {
				if k != "" && strings.Contains(body, k) {
					t.Errorf("%s: the answer repeats a key: %s", what, body)
				}
			}
		}
	}
	if after := state(); after != before {
		t.Errorf("hostile requests changed the database:\nbefore %s\nafter  %s", before, after)
	}
	for _, rt := range routes {
		if rt.Role == service.RoleRead {
			if code, _, body := call(t, baseURL, rt, "Bearer "+keys.Read); code != http.StatusOK {
				t.Errorf("%s %s with the read key: %d %s, want 200", rt.Method, rt.Path, code, body)
			}
		}
	}
}

func call(t *testing.T, baseURL string, rt Route, auth string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(rt.Method, baseURL+rt.Path, strings.NewReader(rt.Body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", rt.Method, rt.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TableDigest is a digest of every row of tables (md5 of the rows as
// text, in a stable order), for "nothing changed" checks.
func TableDigest(t testing.TB, pool *pgxpool.Pool, tables ...string) string {
	t.Helper()
	var out []string
	for _, table := range tables {
		var d string
		// table is one of the caller's constant names, quoted as an identifier.
		q := `SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM ` +
			pgx.Identifier{table}.Sanitize() + ` t`
		if err := pool.QueryRow(context.Background(), q).Scan(&d); err != nil {
			t.Fatalf("digest of %s: %v", table, err)
		}
		out = append(out, table+"="+d)
	}
	return strings.Join(out, " ")
}

// Internal500 sends rt with auth to h, a handler whose database is gone,
// and checks the answer: 500, code "internal", the request id of the
// X-Request-Id header and nothing of the error (leak: words of its text
// such as "closed pool"); and that logs hold the error under that id.
func Internal500(t *testing.T, h http.Handler, rt Route, auth string, logs *Buffer, leak ...string) {
	t.Helper()
	req := httptest.NewRequest(rt.Method, rt.Path, strings.NewReader(rt.Body))
	req.Header.Set("Authorization", auth)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	what := rt.Method + " " + rt.Path
	var b service.ErrorBody
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || w.Code != http.StatusInternalServerError || b.Error.Code != "internal" {
		t.Fatalf("%s on a closed pool: %d %s, want 500 internal", what, w.Code, w.Body)
	}
	id := w.Header().Get("X-Request-Id")
	if id == "" || b.Error.RequestID != id {
		t.Errorf("%s: request_id %q, want the X-Request-Id %q", what, b.Error.RequestID, id)
	}
	for _, l := range leak {
		if strings.Contains(strings.ToLower(w.Body.String()), l) {
			t.Errorf("%s: the 500 body carries error text %q: %s", what, l, w.Body)
		}
	}
	found := false
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"request_id":"`+id+`"`) && strings.Contains(line, `"level":"ERROR"`) {
			found = found || slices.ContainsFunc(leak, func(l string) bool { return strings.Contains(strings.ToLower(line), l) })
		}
	}
	if !found {
		t.Errorf("%s: no ERROR log line with request_id %s and the error's text:\n%s", what, id, logs.String())
	}
}
