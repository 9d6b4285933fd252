package sender_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// A provider that refuses this service's credential (401, 403) has
// accepted nothing and says nothing of the message: the message waits,
// its attempts not counted, so a key misconfigured for longer than the
// retry schedule turns no message FAILED; once the key is accepted, it is
// sent, once, with its key.
func TestARefusedCredentialSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	target, _ := url.Parse(e.url)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var refuse atomic.Bool
	refuse.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"unknown key"}}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := fast()
	s := e.sender(sms.NewHTTPProvider(srv.URL, "", 200*time.Millisecond), cfg)
	ev := e.intent()
	ctx := context.Background()
	for range 2 * cfg.MaxAttempts {
		s.SendOnce(ctx)
		time.Sleep(cfg.RetryMax + 20*time.Millisecond) // past any backoff
	}
	r := e.row(ev)
	if r.Status != "PENDING" || r.Attempts != 0 {
		t.Fatalf("after %d refused calls: %+v; want PENDING with no attempt counted", 2*cfg.MaxAttempts, r)
	}
	if r.Last == nil || !strings.Contains(*r.Last, "SMS_PROVIDER_API_KEY") {
		t.Errorf("last_error %v; want it to name SMS_PROVIDER_API_KEY", r.Last)
	}
	refuse.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for e.row(ev).Status != "SENT" && time.Now().Before(deadline) {
		s.SendOnce(ctx)
		time.Sleep(20 * time.Millisecond)
	}
	if r := e.row(ev); r.Status != "SENT" || r.Attempts != 1 {
		t.Fatalf("once the key is accepted: %+v; want SENT after one counted attempt", r)
	}
	if _, ok := e.delivery(r.Key); !ok || len(e.provider.Deliveries()) != 1 {
		t.Errorf("deliveries %+v; want exactly one, with key %s", e.provider.Deliveries(), r.Key)
	}
}
