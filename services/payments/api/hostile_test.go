package api_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// raw sends a create request with exactly these headers (no default
// Authorization) and body.
func (e *env) raw(headers map[string]string, body []byte) response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/payments", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("POST /v1/payments: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, body: b, header: resp.Header}
}

func body(userID, amount string) []byte {
	return []byte(`{"user_id":` + userID + `,"amount_paise":` + amount + `,"currency":"INR","method":"upi"}`)
}

// Hostile requests: who is calling, and what they send. Each is answered
// with the right 4xx and a JSON error naming the problem, and none writes a
// payment, an outbox row or an idempotency key, or reaches Stripe.
func TestHostileRequestsGetTheRight4xxAndWriteNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	auth := "Bearer " + webKey
	ok := func(h map[string]string) map[string]string {
		out := map[string]string{"Authorization": auth, "Idempotency-Key": "k-hostile", "Content-Type": "application/json"}
		for k, v := range h {
			out[k] = v
		}
		return out
	}
	tenMB := append([]byte(`{"user_id":"u_17","amount_paise":1,"currency":"INR","method":"upi","pad":"`), bytes.Repeat([]byte("x"), 10<<20)...)
	tenMB = append(tenMB, `"}`...)
	nested := []byte(strings.Repeat("[", 30000) + strings.Repeat("]", 30000))
	cases := []struct {
		name    string
		headers map[string]string
		body    []byte
		status  int
		code    string
		field   string
	}{
		// Who is calling.
		{"no Authorization", map[string]string{"Authorization": ""}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"unknown key", map[string]string{"Authorization": "Bearer " + strings.Repeat("z", 40)}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"a key with one byte more", map[string]string{"Authorization": auth + "x"}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"a key one byte short", map[string]string{"Authorization": auth[:len(auth)-1]}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"Basic instead of Bearer", map[string]string{"Authorization": "Basic " + webKey}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"Bearer without a key", map[string]string{"Authorization": "Bearer "}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"the client's name as the key", map[string]string{"Authorization": "Bearer web"}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"another service's client key", map[string]string{"Authorization": "Bearer " + foreignKey}, []byte(validBody), 401, "unauthorized", "Authorization"},
		{"a key with the role read only", map[string]string{"Authorization": "Bearer " + readerKey}, []byte(validBody), 403, "forbidden", "Authorization"},
		// Smuggled fields and numbers.
		{"duplicated user_id", nil, []byte(`{"user_id":"u_17","user_id":"u_18","amount_paise":120000,"currency":"INR","method":"upi"}`), 400, "duplicate_field", "user_id"},
		{"duplicated amount, small then large", nil, []byte(`{"user_id":"u_17","amount_paise":1,"amount_paise":99999999,"currency":"INR","method":"upi"}`), 400, "duplicate_field", "amount_paise"},
		{"amount 1e400", nil, body(`"u_17"`, `1e400`), 400, "invalid_type", "amount_paise"},
		{"amount just over int64", nil, body(`"u_17"`, `9223372036854775808`), 400, "invalid_type", "amount_paise"},
		{"amount just under -int64", nil, body(`"u_17"`, `-9223372036854775809`), 400, "invalid_type", "amount_paise"},
		{"amount in exponent notation", nil, body(`"u_17"`, `12e4`), 400, "invalid_type", "amount_paise"},
		{"amount as a boolean", nil, body(`"u_17"`, `true`), 400, "invalid_type", "amount_paise"},
		{"amount overflowing the paise limit by one", nil, body(`"u_17"`, `100000000`), 400, "invalid_field", "amount_paise"},
		{"amount null", nil, body(`"u_17"`, `null`), 400, "invalid_field", "amount_paise"},
		// Identifiers that look right and are not.
		{"user_id with a bidi override", nil, body(`"u_17\u202e"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id with a zero-width space", nil, body(`"u\u200b17"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id with a Cyrillic homoglyph", nil, body(`"u_1\u0430"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id with invalid UTF-8", nil, body("\"u_\xff\xfe17\"", `120000`), 400, "invalid_field", "user_id"},
		{"user_id with a NUL", nil, body(`"u_17\u0000"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id carrying SQL", nil, body(`"u_17'; DROP TABLE payments;--"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id of 129 characters", nil, body(`"`+strings.Repeat("u", 129)+`"`, `120000`), 400, "invalid_field", "user_id"},
		{"user_id as an object", nil, body(`{"$ne":null}`, `120000`), 400, "invalid_type", "user_id"},
		// Shapes.
		{"10 MB body", nil, tenMB, 413, "body_too_large", "body"},
		{"30,000 nested arrays", nil, nested, 400, "malformed_json", "body"},
		{"a JSON string", nil, []byte(`"pay me"`), 400, "malformed_json", "body"},
		{"a byte-order mark before the object", nil, append([]byte("\xef\xbb\xbf"), validBody...), 400, "malformed_json", "body"},
		{"currency with a trailing space", nil, []byte(`{"user_id":"u_17","amount_paise":120000,"currency":"INR ","method":"upi"}`), 400, "unsupported_currency", "currency"},
		{"method in upper case", nil, []byte(`{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"UPI"}`), 400, "invalid_field", "method"},
		{"Idempotency-Key of 256 bytes", map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, []byte(validBody), 400, "idempotency_key_invalid", "Idempotency-Key"},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d hostile cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := ok(c.headers)
			if h["Authorization"] == "" {
				delete(h, "Authorization")
			}
			r := e.raw(h, c.body)
			if r.status != c.status {
				t.Fatalf("status %d, body %.300s; want %d", r.status, r.body, c.status)
			}
			if d := r.errorDetail(t); d.Code != c.code || d.Field != c.field || d.Message == "" {
				t.Errorf("error %+v, want code %q field %q and a message", d, c.code, c.field)
			}
			if c.status == 401 && r.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without a WWW-Authenticate challenge")
			}
		})
	}
	e.assertNothingWritten()
}

// A refusal never hands back what the caller sent at length: a currency
// or a method is not echoed at all, and a field name the decoder names
// (unknown, repeated, of the wrong type) is cut to 64 bytes, in the
// message and in the error's field: a 2 KB value gets a short answer.
func TestARefusalDoesNotEchoTheCallersValuesAndNamesAFieldInAtMost64Bytes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	marker := strings.Repeat("<script>evil</script>", 100) // 2 KB, inside the body limit
	longName := "f" + strings.Repeat("x", 2000)
	for name, b := range map[string]string{
		"currency":      `{"user_id":"u_17","amount_paise":120000,"currency":"` + marker + `","method":"upi"}`,
		"method":        `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"` + marker + `"}`,
		"unknown field": `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"upi","` + longName + `":1}`,
		"repeated":      `{"user_id":"u_17","amount_paise":120000,"currency":"INR","method":"upi","` + longName + `":1,"` + longName + `":2}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := e.raw(map[string]string{"Authorization": "Bearer " + webKey, "Idempotency-Key": "k-echo", "Content-Type": "application/json"}, []byte(b))
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", r.status)
			}
			if strings.Contains(string(r.body), "evil") || len(r.body) > 512 {
				t.Errorf("the %d-byte answer echoes the request: %.200s", len(r.body), r.body)
			}
			if d := r.errorDetail(t); len(d.Field) > 64 {
				t.Errorf("error field of %d bytes, want at most 64", len(d.Field))
			}
		})
	}
	e.assertNothingWritten()
}

func TestOneClientsIdempotencyKeyNeverReplaysAnotherClientsResponse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	web := e.raw(map[string]string{"Authorization": "Bearer " + webKey, "Idempotency-Key": "shared"}, []byte(validBody))
	ops := e.raw(map[string]string{"Authorization": "Bearer " + opsKey, "Idempotency-Key": "shared"}, []byte(validBody))
	if web.status != 201 || ops.status != 201 {
		t.Fatalf("statuses %d, %d; want 201 twice", web.status, ops.status)
	}
	if a, b := web.payment(t), ops.payment(t); a.ID == b.ID || ops.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("ops got web's payment %s (replayed %q): keys must be per client", b.ID, ops.header.Get("Idempotent-Replayed"))
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 2 {
		t.Errorf("%d payments, want 2", n)
	}
}

func TestAClientOverItsRateLimitGets429AndNothingIsWritten(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, time.Minute, 3, nil)
	for i := range 3 {
		if r := e.create(fmt.Sprintf("k-%d", i), validBody); r.status != 201 {
			t.Fatalf("request %d: status %d %s", i, r.status, r.body)
		}
	}
	r := e.create("k-over", validBody)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.errorDetail(t).Code != "rate_limited" {
		t.Fatalf("4th request in a second: status %d, Retry-After %q, body %s; want 429 rate_limited with Retry-After",
			r.status, r.header.Get("Retry-After"), r.body)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'k-over'`); n != 0 {
		t.Errorf("the refused request left %d idempotency keys", n)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 3 {
		t.Errorf("%d payments, want 3", n)
	}
	// Another client has its own budget.
	other := e.raw(map[string]string{"Authorization": "Bearer " + opsKey, "Idempotency-Key": "k-ops"}, []byte(validBody))
	if other.status != 201 {
		t.Errorf("another client was limited too: %d %s", other.status, other.body)
	}
}

// A slowloris body: headers at once, then the body a byte at a time. The
// server's read timeout ends it with 408; nothing is written.
func TestASlowBodyIsCutOffByTheReadTimeoutAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, time.Minute, 10000, func(h http.Handler) string {
		srv := service.NewHTTPServer("127.0.0.1:0", h, service.HTTPTimeouts{Read: 500 * time.Millisecond})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
		return "http://" + ln.Addr().String()
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: k-slow\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", webKey, len(validBody))
	t0 := time.Now()
	go func() {
		for i := range len(validBody) - 1 { // never the last byte
			if _, err := conn.Write([]byte{validBody[i]}); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the slow body within 10 s: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request_timeout") {
		t.Errorf("slow body: %s %s; want 408 request_timeout", resp.Status, b)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("the slow body held the server for %v, want about the 500ms read timeout", d)
	}
	e.assertNothingWritten()
}

// as sends a request with client's key and, if set, an Idempotency-Key.
func (e *env) as(client, method, path, idem, body string) response {
	e.t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if client != "" {
		h["Authorization"] = "Bearer " + client
	}
	if idem != "" {
		h["Idempotency-Key"] = idem
	}
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, body: b, header: resp.Header}
}

// A payment belongs to the client that made it. Another client's GET and
// refund of it are 404, word for word the answer for an id that does not
// exist, and the refund writes nothing and never reaches Stripe.
func TestAnotherClientsPaymentIsNotFoundForGetAndRefundAndNothingIsWritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	p := e.mustCreate("k-web")
	stripeCalls, outboxRows, keys := e.stripe.total(), e.count(`SELECT count(*) FROM outbox`), e.count(`SELECT count(*) FROM idempotency_keys`)
	missing := e.as(opsKey, http.MethodGet, "/v1/payments/pay_00000000000000000000000000000000", "", "")
	for _, r := range []response{
		e.as(opsKey, http.MethodGet, "/v1/payments/"+p.ID, "", ""),
		e.as(opsKey, http.MethodPost, "/v1/payments/"+p.ID+"/refund", "r-ops", "{}"),
	} {
		if r.status != http.StatusNotFound || string(r.body) != string(missing.body) {
			t.Errorf("ops on web's payment: %d %s; want the 404 of a missing payment: %s", r.status, r.body, missing.body)
		}
	}
	if got := e.as(webKey, http.MethodGet, "/v1/payments/"+p.ID, "", ""); got.status != http.StatusOK {
		t.Errorf("web reading its own payment: %d %s", got.status, got.body)
	}
	var status string
	if err := e.pool.QueryRow(context.Background(), `SELECT status FROM payments WHERE id = $1`, p.ID).Scan(&status); err != nil || status != "SUCCEEDED" {
		t.Errorf("payment status %q (%v), want SUCCEEDED", status, err)
	}
	if n := e.stripe.total(); n != stripeCalls {
		t.Errorf("Stripe saw %d more calls", n-stripeCalls)
	}
	if n, k := e.count(`SELECT count(*) FROM outbox`), e.count(`SELECT count(*) FROM idempotency_keys`); n != outboxRows || k != keys {
		t.Errorf("outbox %d→%d, idempotency keys %d→%d: the refused requests wrote", outboxRows, n, keys, k)
	}
}

// Requests without a key, or with a wrong one, count against their
// address's limit before any key is looked at: a flood of them gets 429,
// not an endless series of 401s.
func TestRequestsWithoutAKeyAreRateLimitedPerAddressBeforeAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, time.Minute, 3, nil) // 3 per client, 6 per address, per second
	for i := range 6 {
		if r := e.as("", http.MethodPost, "/v1/payments", fmt.Sprintf("k-%d", i), validBody); r.status != http.StatusUnauthorized {
			t.Fatalf("keyless request %d: %d %s, want 401", i, r.status, r.body)
		}
	}
	r := e.as(strings.Repeat("x", 40), http.MethodPost, "/v1/payments", "k-over", validBody)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("7th request from the address: %d %s, want 429 with Retry-After", r.status, r.body)
	}
	e.assertNothingWritten()
}

// A refused body is answered in the API's own words: what is wrong and
// where, never encoding/json's text (its error strings, Go type or struct
// names).
func TestRefusedBodiesAreExplainedWithoutTheDecodersText(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	cases := []struct{ body, field, message string }{
		{`xyz`, "body", "body is not valid JSON (at byte 1)"},
		{`{"user_id":`, "body", "body ends early"},
		{strings.Repeat("[", 30000) + strings.Repeat("]", 30000), "body", "body nests too deep"},
		{validBody + `{}`, "body", "data after the JSON object"},
		{`{"user_id":"u_17","user_id":"u_18","amount_paise":1,"currency":"INR","method":"upi"}`, "user_id", `field "user_id" given twice`},
		{`{"user_id":17,"amount_paise":120000,"currency":"INR","method":"upi"}`, "user_id", `field "user_id" must be a string, not a number`},
	}
	for _, c := range cases {
		r := e.raw(map[string]string{"Authorization": "Bearer " + webKey, "Idempotency-Key": "k-words"}, []byte(c.body))
		d := r.errorDetail(t)
		if r.status != http.StatusBadRequest || d.Field != c.field || d.Message != c.message {
			t.Errorf("body %.40q: %d %+v, want 400 field %q message %q", c.body, r.status, d, c.field, c.message)
		}
		for _, leak := range []string{"invalid character", "unexpected EOF", "exceeded max depth", "json:", "Go struct"} {
			if strings.Contains(string(r.body), leak) {
				t.Errorf("body %.40q: the answer carries the decoder's %q: %s", c.body, leak, r.body)
			}
		}
	}
	huge := e.raw(map[string]string{"Authorization": "Bearer " + webKey, "Idempotency-Key": "k-words"},
		[]byte(`{"user_id":"`+strings.Repeat("x", 70<<10)+`"}`))
	if d := huge.errorDetail(t); huge.status != http.StatusRequestEntityTooLarge || d.Message != "body over 64 KiB" {
		t.Errorf("70 KiB body: %d %+v, want 413 \"body over 64 KiB\"", huge.status, d)
	}
	e.assertNothingWritten()
}
