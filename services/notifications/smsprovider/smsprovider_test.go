package smsprovider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/effectively-once/payments-cashback/internal/ports"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

// The provider's test clients: a reader, an operator and a sender (the
// notifications service).
const (
	readKey  = "sms-read-0123456789abcdef0123456789ab"
	adminKey = "sms-admin-0123456789abcdef0123456789a"
	sendKey  = "sms-send-0123456789abcdef0123456789ab"
)

// start serves the provider as its command does, behind the test keys.
func start(t *testing.T) (*smsprovider.Server, *httptest.Server) {
	t.Helper()
	p := smsprovider.New()
	keys, err := service.ParseAPIKeys("qa:"+readKey+",ops/read+admin:"+adminKey+",notifications/send:"+sendKey, service.RoleRead)
	if err != nil {
		t.Fatal(err)
	}
	h, err := p.Handler(slog.New(slog.DiscardHandler), promhttp.Handler(), service.Access{Keys: keys, RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return p, srv
}

// send is method url with the admin key.
func send(t *testing.T, method, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func post(t *testing.T, url, key, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+sendKey)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp, m
}

func control(t *testing.T, url, body string) {
	t.Helper()
	resp := send(t, http.MethodPost, url+"/v1/control", body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("control %s: %s", body, resp.Status)
	}
}

type deliveriesBody struct {
	Deliveries []smsprovider.Delivery `json:"deliveries"`
	Total      int                    `json:"total"`
	Requests   int                    `json:"requests"`
}

func deliveries(t *testing.T, url string) deliveriesBody {
	t.Helper()
	resp := send(t, http.MethodGet, url+"/v1/deliveries", "")
	defer resp.Body.Close()
	var d deliveriesBody
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

const msg = `{"to":"u_17","body":"You got ₹24.00 cashback"}`

// The first response per key is stored and replayed: same message id,
// delivered once, every request counted.
func TestReplayPerKey(t *testing.T) {
	_, srv := start(t)
	r1, m1 := post(t, srv.URL, "sms:a", msg)
	r2, m2 := post(t, srv.URL, "sms:a", msg)
	r3, m3 := post(t, srv.URL, "sms:b", msg)
	if r1.StatusCode != http.StatusCreated || r2.StatusCode != http.StatusOK || r2.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("statuses %d, %d (replayed=%q); want 201 then a 200 replay", r1.StatusCode, r2.StatusCode, r2.Header.Get("Idempotent-Replayed"))
	}
	if m1["message_id"] == nil || m1["message_id"] != m2["message_id"] {
		t.Errorf("message ids %v and %v; want the same id for the same key", m1["message_id"], m2["message_id"])
	}
	if r3.StatusCode != http.StatusCreated || m3["message_id"] == m1["message_id"] {
		t.Errorf("another key: %d %v; want 201 and a new id", r3.StatusCode, m3["message_id"])
	}
	d := deliveries(t, srv.URL)
	if d.Total != 2 || d.Requests != 3 || d.Deliveries[0].IdempotencyKey != "sms:a" || d.Deliveries[0].Requests != 2 ||
		d.Deliveries[1].Requests != 1 {
		t.Errorf("deliveries = %+v; want sms:a (2 requests) and sms:b (1)", d)
	}
}

func TestSameKeyDifferentMessageRefused(t *testing.T) {
	_, srv := start(t)
	post(t, srv.URL, "sms:a", msg)
	r, _ := post(t, srv.URL, "sms:a", `{"to":"u_17","body":"something else"}`)
	if r.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("same key, other body: %d, want 422", r.StatusCode)
	}
	if d := deliveries(t, srv.URL); d.Total != 1 || d.Deliveries[0].Body != "You got ₹24.00 cashback" {
		t.Errorf("deliveries = %+v; want only the first message", d)
	}
}

func TestBadRequests(t *testing.T) {
	_, srv := start(t)
	for _, tc := range []struct{ key, body string }{{"", msg}, {"sms:a", `{"to":"u_17"}`}, {"sms:a", `not json`}} {
		if r, _ := post(t, srv.URL, tc.key, tc.body); r.StatusCode != http.StatusBadRequest {
			t.Errorf("key %q body %q: %d, want 400", tc.key, tc.body, r.StatusCode)
		}
	}
	if d := deliveries(t, srv.URL); d.Total != 0 {
		t.Errorf("bad requests delivered %d messages", d.Total)
	}
}

// Lookup by key, through the service's own client.
func TestLookup(t *testing.T) {
	_, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, time.Second)
	ctx := context.Background()
	if _, found, err := c.Lookup(ctx, "sms:a"); err != nil || found {
		t.Fatalf("lookup before any send: found=%v err=%v; want a 404", found, err)
	}
	r, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	got, found, err := c.Lookup(ctx, "sms:a")
	if err != nil || !found || got.MessageID != r.MessageID {
		t.Errorf("lookup = %+v found=%v err=%v; want %s", got, found, err, r.MessageID)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/messages?idempotency_key=sms:nope", nil)
	req.Header.Set("Authorization", "Bearer "+sendKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown key: %s, want 404", resp.Status)
	}
}

// fail_next N: N requests fail (503) without delivering; then it delivers.
// The client cannot tell a 5xx from a failure after accepting, so it is an
// unknown outcome; 429 is retryable and another 4xx fail_status a rejection.
func TestFailNext(t *testing.T) {
	_, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, time.Second)
	ctx := context.Background()
	m := sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"}
	control(t, srv.URL, `{"fail_next":2}`)
	for i := range 2 {
		if _, err := c.Send(ctx, m); sms.Classify(err) != sms.Unknown {
			t.Errorf("request %d: %v, want an unknown outcome", i+1, err)
		}
	}
	if _, err := c.Send(ctx, m); err != nil {
		t.Errorf("third request: %v, want accepted", err)
	}
	d := deliveries(t, srv.URL)
	if d.Total != 1 || d.Deliveries[0].Requests != 3 {
		t.Errorf("deliveries = %+v; want one delivery after 3 requests", d)
	}
	control(t, srv.URL, `{"fail_next":1,"fail_status":429}`)
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:c", To: "u_17", Body: "hi"}); sms.Classify(err) != sms.Retryable {
		t.Errorf("fail_status 429: %v, want a retryable error", err)
	}
	control(t, srv.URL, `{"fail_next":1,"fail_status":400}`)
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:b", To: "u_17", Body: "hi"}); sms.Classify(err) != sms.Rejected {
		t.Errorf("fail_status 400: %v, want a rejection", err)
	}
}

// hang_after_accept: the message is stored and delivered, then the answer
// hangs; a client that times out sees an unknown outcome, and the lookup
// finds the message.
func TestHangAfterAccept(t *testing.T) {
	_, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, 200*time.Millisecond)
	ctx := context.Background()
	control(t, srv.URL, `{"hang_ms":1500,"hang_after_accept":true}`)
	start := time.Now()
	_, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"})
	if sms.Classify(err) != sms.Unknown {
		t.Fatalf("hung send: %v, want an unknown outcome", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("the client waited %v; its timeout is 200ms", time.Since(start))
	}
	if _, found, err := c.Lookup(ctx, "sms:a"); err != nil || !found {
		t.Errorf("lookup during the hang: found=%v err=%v; want found", found, err)
	}
	if d := deliveries(t, srv.URL); d.Total != 1 {
		t.Errorf("deliveries = %d, want 1", d.Total)
	}
	// Only the next request hangs (hang_next defaults to 1).
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:b", To: "u_17", Body: "hi"}); err != nil {
		t.Errorf("request after the hang: %v", err)
	}
}

// A hang before accepting stores nothing until it ends.
func TestHangBeforeAccept(t *testing.T) {
	_, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, 100*time.Millisecond)
	ctx := context.Background()
	control(t, srv.URL, `{"hang_ms":400,"hang_after_accept":false}`)
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"}); sms.Classify(err) != sms.Unknown {
		t.Fatalf("hung send: %v, want an unknown outcome", err)
	}
	if _, found, _ := c.Lookup(ctx, "sms:a"); found {
		t.Error("lookup during a hang before accepting found the message")
	}
}

// "to" aims the faults at one recipient: a scenario's hang or failure is
// not spent on another's SMS that happens to be in flight. The others pass
// untouched; "to":"" aims them at every request again.
func TestFaultsAimedAtOneRecipientLeaveTheOthersAlone(t *testing.T) {
	_, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, 200*time.Millisecond)
	ctx := context.Background()
	control(t, srv.URL, `{"to":"u_target","fail_next":1,"hang_ms":1500,"hang_after_accept":false}`)
	t0 := time.Now()
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:other", To: "u_other", Body: "hi"}); err != nil {
		t.Fatalf("a send to another recipient: %v, want accepted", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("a send to another recipient took %v: the hang was spent on it", d)
	}
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:t1", To: "u_target", Body: "hi"}); sms.Classify(err) != sms.Unknown {
		t.Errorf("the first send to the target: %v, want the injected failure (an unknown outcome)", err)
	}
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:t2", To: "u_target", Body: "hi"}); err != nil {
		t.Errorf("the second send to the target: %v, want accepted (one failure, its hang spent with it)", err)
	}
	control(t, srv.URL, `{"to":"","fail_next":1}`)
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:any", To: "u_other", Body: "hi"}); sms.Classify(err) != sms.Unknown {
		t.Errorf(`after "to":"" a send to anyone: %v, want the injected failure`, err)
	}
	d := deliveries(t, srv.URL)
	if d.Total != 2 {
		t.Errorf("deliveries = %+v; want 2 (sms:other, sms:t2)", d)
	}
}

// Concurrent requests under one key deliver once, all get the same id.
func TestConcurrentSameKey(t *testing.T) {
	p, srv := start(t)
	c := sms.NewHTTPProvider(srv.URL, sendKey, 5*time.Second)
	ids := make([]string, 20)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			r, err := c.Send(context.Background(), sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"})
			if err != nil {
				t.Error(err)
			}
			ids[i] = r.MessageID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("message ids differ: %v", ids)
		}
	}
	if d := p.Deliveries(); len(d) != 1 || d[0].Requests != 20 {
		t.Errorf("deliveries = %+v; want one with 20 requests", d)
	}
}

func TestResetAndHealth(t *testing.T) {
	_, srv := start(t)
	post(t, srv.URL, "sms:a", msg)
	control(t, srv.URL, `{"fail_next":5}`)
	send(t, http.MethodPost, srv.URL+"/v1/reset", "").Body.Close()
	if d := deliveries(t, srv.URL); d.Total != 0 {
		t.Errorf("after reset: %d deliveries", d.Total)
	}
	if r, _ := post(t, srv.URL, "sms:a", msg); r.StatusCode != http.StatusCreated {
		t.Errorf("after reset the faults remain: %d", r.StatusCode)
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A provider that is down is a retryable error (the request never left).
func TestConnectionRefusedIsRetryable(t *testing.T) {
	// Outside the ephemeral range: no connection of another test takes it meanwhile.
	port, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := sms.NewHTTPProvider("http://"+addr, sendKey, time.Second)
	if _, err := c.Send(context.Background(), sms.Message{IdempotencyKey: "sms:a", To: "u", Body: "b"}); sms.Classify(err) != sms.Retryable {
		t.Errorf("connection refused: %v (%v), want retryable", err, sms.Classify(err))
	}
}

// A sender whose key the provider does not know (401), or whose key lacks
// the role send (403), is refused before any work: the send is Retryable
// (the message waits, nothing was delivered) and names the credential to
// check; a lookup is an error, not "not found", which would read as never
// accepted.
func TestASenderWithoutTheRightKeyIsRetryableAndDeliversNothing(t *testing.T) {
	p, srv := start(t)
	ctx := context.Background()
	for name, key := range map[string]string{"unknown key": "not-a-key-0123456789abcdef0123456789ab", "read key": readKey, "no key": ""} {
		c := sms.NewHTTPProvider(srv.URL, key, time.Second)
		_, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"})
		if sms.Classify(err) != sms.Retryable || !strings.Contains(err.Error(), "SMS_PROVIDER_API_KEY") {
			t.Errorf("%s: Send: %v (%v); want Retryable, naming SMS_PROVIDER_API_KEY", name, err, sms.Classify(err))
		}
		if _, found, err := c.Lookup(ctx, "sms:a"); found || err == nil {
			t.Errorf("%s: Lookup: found %v, %v; want an error", name, found, err)
		}
	}
	if d := p.Deliveries(); len(d) != 0 {
		t.Errorf("deliveries after refused sends: %+v, want none", d)
	}
}

// Ping says whether the provider answers at all (the probe of the sender's
// outage gate). Of the send errors, a server error or throttling may be
// the provider's outage (outage.Unavailable, for the gate to confirm); a
// refusal of the message itself is not.
func TestPingAndWhichSendErrorsMayBeAnOutage(t *testing.T) {
	_, srv := start(t)
	ctx := context.Background()
	c := sms.NewHTTPProvider(srv.URL, sendKey, time.Second)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping of a running provider: %v", err)
	}
	control(t, srv.URL, `{"fail_next":1}`)
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:a", To: "u_17", Body: "hi"}); !outage.Unavailable(err) {
		t.Errorf("a 503: %v; want it counted as a possible outage", err)
	}
	if _, err := c.Send(ctx, sms.Message{IdempotencyKey: "sms:b", To: "u_17"}); sms.Classify(err) != sms.Rejected || outage.Unavailable(err) {
		t.Errorf("a message without a body: %v; want Rejected, not an outage", err)
	}
	srv.Close()
	if err := c.Ping(ctx); err == nil || !outage.Unavailable(err) {
		t.Errorf("Ping of a stopped provider: %v; want an unavailable error", err)
	}
}

// The provider's routes refuse a caller without their role: no key, a
// wrong key, the Basic scheme, another service's key (401), a read key on
// control or reset (403 naming admin) or on the sender's API (403 naming
// send). Its deliveries and its fault state are as they were: the next
// send is delivered, and looked up, with the sender's key.
func TestHostileRequestsToTheProvidersControlRoutesAreRefusedAndChangeNothing(t *testing.T) {
	p, srv := start(t)
	post(t, srv.URL, "sms:a", msg)
	testenv.HostileRoutes(t, srv.URL, []testenv.Route{
		{Method: http.MethodGet, Path: "/v1/deliveries", Role: service.RoleRead},
		{Method: http.MethodGet, Path: "/v1/control", Role: service.RoleRead},
		{Method: http.MethodPost, Path: "/v1/control", Body: `{"fail_next":100}`, Role: service.RoleAdmin},
		{Method: http.MethodPost, Path: "/v1/reset", Role: service.RoleAdmin},
		{Method: http.MethodPost, Path: "/v1/messages", Body: msg, Role: service.RoleSend},
		{Method: http.MethodGet, Path: "/v1/messages?idempotency_key=sms:a", Role: service.RoleSend},
	}, testenv.RouteKeys{Read: readKey, Admin: adminKey, Foreign: "payments-web-0123456789abcdef01234567"}, func() string {
		b, _ := json.Marshal(p.Deliveries())
		return string(b)
	})
	if r, _ := post(t, srv.URL, "sms:b", msg); r.StatusCode != http.StatusCreated {
		t.Errorf("a send after the hostile requests: %d, want 201 (no fault was injected)", r.StatusCode)
	}
	if _, found, err := sms.NewHTTPProvider(srv.URL, sendKey, time.Second).Lookup(context.Background(), "sms:a"); !found || err != nil {
		t.Errorf("lookup of sms:a with the sender's key: found %v, %v; want found", found, err)
	}
}

// The provider reads its bodies as every API of the project does: strict,
// at most 64 KiB (413 beyond), refusals in its own words and naming the
// field; a refused send delivers nothing and a refused control changes
// nothing.
func TestBodiesAreReadStrictlyAndARefusedOneChangesNothing(t *testing.T) {
	_, srv := start(t)
	big := `{"to":"u_17","body":"` + strings.Repeat("x", 70<<10) + `"}`
	for _, c := range []struct {
		path, body string
		status     int
		code       string
		message    string
	}{
		{"/v1/messages", `{"to":"u_17","body":"hi","cc":"u_18"}`, 400, "unknown_field", `unknown field "cc"`},
		{"/v1/messages", msg + `{}`, 400, "malformed_json", "data after the JSON object"},
		{"/v1/messages", `{"to":17,"body":"hi"}`, 400, "invalid_type", `field "to" must be a string, not a number`},
		{"/v1/messages", `{"to":"u_17","to":"u_18","body":"hi"}`, 400, "duplicate_field", `field "to" given twice`},
		{"/v1/messages", big, 413, "body_too_large", "body over 64 KiB"},
		{"/v1/control", `{"fail_nex":1}`, 400, "unknown_field", `unknown field "fail_nex"`},
		{"/v1/control", `{"fail_next":1} x`, 400, "malformed_json", "data after the JSON object"},
		{"/v1/control", `{"hang_ms":"5"}`, 400, "invalid_type", `field "hang_ms" must be an integer, not a string`},
		{"/v1/control", `{"fail_next":1,"pad":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "body_too_large", "body over 64 KiB"},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Idempotency-Key", "sms:strict")
		req.Header.Set("Authorization", "Bearer "+map[bool]string{true: sendKey, false: adminKey}[c.path == "/v1/messages"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b service.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&b)
		resp.Body.Close()
		if resp.StatusCode != c.status || b.Error.Code != c.code || b.Error.Message != c.message {
			t.Errorf("POST %s %.40q: %d %+v, want %d %s %q", c.path, c.body, resp.StatusCode, b.Error, c.status, c.code, c.message)
		}
	}
	if d := deliveries(t, srv.URL); d.Total != 0 {
		t.Errorf("refused sends delivered %d messages", d.Total)
	}
	resp := send(t, http.MethodGet, srv.URL+"/v1/control", "")
	defer resp.Body.Close()
	var ctl map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&ctl)
	if ctl["fail_next"] != float64(0) || ctl["hang_ms"] != float64(0) {
		t.Errorf("control after refused changes: %v, want none", ctl)
	}
}

// A fault POST /v1/control would not apply as asked (a fail_status that is
// not an error status, a negative count or hang) is refused with a 400
// naming the field, and changes nothing, not even its valid fields: a test
// asking for "fail_next 1 with status 200" would otherwise get 503s, or
// no fault at all, from a control that answered 200.
func TestControlRefusesAFaultItWouldNotApplyNamingTheField(t *testing.T) {
	_, srv := start(t)
	control(t, srv.URL, `{"fail_status":429}`)
	for _, c := range []struct{ body, field string }{
		{`{"fail_next":1,"fail_status":200}`, "fail_status"},
		{`{"fail_status":399}`, "fail_status"},
		{`{"fail_status":600}`, "fail_status"},
		{`{"fail_status":999}`, "fail_status"},
		{`{"fail_next":-3}`, "fail_next"},
		{`{"hang_ms":-5}`, "hang_ms"},
		{`{"hang_ms":100,"hang_next":-1}`, "hang_next"},
	} {
		resp := send(t, http.MethodPost, srv.URL+"/v1/control", c.body)
		var b service.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&b)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || b.Error.Code != "invalid_field" || b.Error.Field != c.field ||
			!strings.Contains(b.Error.Message, c.field) {
			t.Errorf("POST /v1/control %s = %s %+v; want 400 invalid_field naming %s", c.body, resp.Status, b.Error, c.field)
		}
	}
	resp := send(t, http.MethodGet, srv.URL+"/v1/control", "")
	defer resp.Body.Close()
	var ctl map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&ctl)
	if ctl["fail_next"] != float64(0) || ctl["fail_status"] != float64(429) || ctl["hang_ms"] != float64(0) || ctl["hang_next"] != float64(0) {
		t.Errorf("control after refused changes: %v; want fail_status 429 and no fault, as before them", ctl)
	}
	// The bounds themselves are faults it applies.
	control(t, srv.URL, `{"fail_next":0,"fail_status":400,"hang_ms":0,"hang_next":0}`)
	control(t, srv.URL, `{"fail_status":599}`)
}

// The provider serves what every service serves: /healthz, /readyz and
// /metrics, open; an unknown route is a JSON 404 and a wrong method a JSON
// 405 with its Allow header, as on the services.
func TestTheProviderServesHealthReadinessMetricsAndJSONErrorsForUnknownRoutes(t *testing.T) {
	_, srv := start(t)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a key: %s, want 200", path, resp.Status)
		}
	}
	testenv.RoutingErrors(t, srv.URL, "Bearer "+adminKey, []testenv.RoutingCase{
		{Method: http.MethodGet, Path: "/v1/nope", Status: http.StatusNotFound, Code: "not_found"},
		{Method: http.MethodDelete, Path: "/v1/messages", Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Allow: "GET, HEAD, POST"},
		{Method: http.MethodGet, Path: "/v1/reset", Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Allow: "POST"},
	})
}

// Idempotency-Keys are each sender's own, as a real provider keeps them
// per account: a second sender's key equal to the first's is a message of
// its own (not a 422, not a replay of the other's), a lookup finds only
// the asker's message, and each delivery says whose it is.
func TestIdempotencyKeysArePerSender(t *testing.T) {
	const otherKey = "sms-send2-0123456789abcdef0123456789a"
	p := smsprovider.New()
	keys, err := service.ParseAPIKeys("qa:"+readKey+",ops/read+admin:"+adminKey+",notifications/send:"+sendKey+",marketing/send:"+otherKey, service.RoleRead)
	if err != nil {
		t.Fatal(err)
	}
	h, err := p.Handler(slog.New(slog.DiscardHandler), promhttp.Handler(), service.Access{Keys: keys, RateLimit: 1000, AddressRateLimit: 1000, RateWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(method, path, apiKey, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Idempotency-Key", "sms:shared")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	c1, m1 := do(http.MethodPost, "/v1/messages", sendKey, `{"to":"+911111111111","body":"yours"}`)
	c2, m2 := do(http.MethodPost, "/v1/messages", otherKey, `{"to":"+912222222222","body":"theirs"}`)
	if c1 != http.StatusCreated || c2 != http.StatusCreated || m1["message_id"] == m2["message_id"] {
		t.Fatalf("two senders, one key: %d %v and %d %v; want two 201s with two message ids", c1, m1, c2, m2)
	}
	if c, m := do(http.MethodGet, "/v1/messages?idempotency_key=sms:shared", otherKey, ""); c != http.StatusOK || m["message_id"] != m2["message_id"] || m["to"] != "+912222222222" {
		t.Errorf("the second sender's lookup: %d %v, want its own message %v", c, m, m2["message_id"])
	}
	if c, m := do(http.MethodGet, "/v1/messages?idempotency_key=sms:shared", sendKey, ""); c != http.StatusOK || m["message_id"] != m1["message_id"] {
		t.Errorf("the first sender's lookup: %d %v, want its own message %v", c, m, m1["message_id"])
	}
	ds := p.Deliveries()
	if len(ds) != 2 || ds[0].Sender != "notifications" || ds[1].Sender != "marketing" || ds[0].Requests != 1 || ds[1].Requests != 1 {
		t.Errorf("deliveries %+v, want one per sender, each after one request, naming its sender", ds)
	}
}
