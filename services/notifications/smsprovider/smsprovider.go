// Package smsprovider is a TEST DOUBLE: a development SMS provider that
// sends nothing to any phone but behaves like a careful real one, so the
// notifications service can be tested against honest semantics instead of
// a mock. Never point a production deployment at it.
//
//	POST /v1/messages        header Idempotency-Key (required), body {"to","body"}.
//	                         The first request under a key is "delivered" and its
//	                         response stored (201); every later request under the
//	                         same key gets that response replayed (200, header
//	                         Idempotent-Replayed: true): same message id, delivered
//	                         once. The same key with a different to/body is a 422
//	                         (checked before any replay).
//	GET  /v1/messages?idempotency_key=K
//	                         the message accepted under K (200), or 404.
//	GET  /v1/deliveries      what was delivered: one entry per distinct key, with
//	                         the number of send requests seen for it.
//	POST /v1/control         fault injection, see Control. GET shows the current one.
//	POST /v1/reset           forget every message and fault.
//	GET  /healthz, /readyz, /metrics
//
// The first two are the sender's API. Handler, as the command serves it,
// puts every route but the last three behind API keys: the sender's API needs the
// role send (a real provider wants its customer's credential, and a lookup
// shows a phone number), deliveries and GET control the role read (they
// hold phone numbers), POST control and reset the role admin. ServeHTTP,
// for tests in process, serves only the sender's API and /healthz, with no
// key.
//
// Bodies are read by httpjson.Decode, as every API of the project reads
// them: one object of known fields, at most 64 KiB (413 beyond), and a
// refusal names the field without the decoder's text.
//
// State lives in memory (it is a dev tool) and is safe for concurrent use.
package smsprovider

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/effectively-once/payments-cashback/pkg/httpjson"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Control is the body of POST /v1/control. Fields left out keep their
// current value. A body with a value the provider would not apply as
// asked (a fail_status outside 400-599, a negative count or hang) is
// refused whole, 400 invalid_field naming the field.
type Control struct {
	// FailNext: the next N send requests fail with FailStatus (default
	// 503) without storing or delivering anything.
	FailNext *int `json:"fail_next,omitempty"`
	// FailStatus is the status of injected failures, 400 to 599 (default
	// 503; a 4xx such as 400 makes them rejections).
	FailStatus *int `json:"fail_status,omitempty"`
	// HangMS makes send requests sleep that long before answering, for the
	// next HangNext requests (default: 1 when HangMS is set).
	HangMS   *int `json:"hang_ms,omitempty"`
	HangNext *int `json:"hang_next,omitempty"`
	// HangAfterAccept: the hang happens after the message has been stored,
	// counted and delivered, so a client that times out does not know it
	// was accepted (the crash-in-SENDING case). Otherwise it happens before.
	HangAfterAccept *bool `json:"hang_after_accept,omitempty"`
	// To aims the failures and hangs at send requests to this recipient;
	// requests to anyone else pass untouched and spend none of them. Empty
	// (the default): every request.
	To *string `json:"to,omitempty"`
}

// control is the effective fault state.
type control struct {
	FailNext        int    `json:"fail_next"`
	FailStatus      int    `json:"fail_status"`
	HangMS          int    `json:"hang_ms"`
	HangNext        int    `json:"hang_next"`
	HangAfterAccept bool   `json:"hang_after_accept"`
	To              string `json:"to"`
}

// Delivery is one delivered message, as GET /v1/deliveries lists it.
type Delivery struct {
	// Sender is the API client that sent it: keys are each sender's own.
	Sender         string    `json:"sender"`
	IdempotencyKey string    `json:"idempotency_key"`
	MessageID      string    `json:"message_id"`
	To             string    `json:"to"`
	Body           string    `json:"body"`
	Requests       int       `json:"requests"` // send requests seen under this key
	DeliveredAt    time.Time `json:"delivered_at"`
	// Traceparent is the W3C trace context of the accepted request, if it
	// carried one: which trace this SMS belongs to.
	Traceparent string `json:"traceparent,omitempty"`
}

// message is the stored first response for a key.
type message struct {
	MessageID      string    `json:"message_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	To             string    `json:"to"`
	Body           string    `json:"body"`
	Status         string    `json:"status"`
	CreatedAt      time.Time `json:"created_at"`
	traceparent    string
}

// scopedKey is an Idempotency-Key in its sender's namespace: a real
// provider keeps keys per account, so one sender's key never replays, or
// reveals, another's message.
type scopedKey struct{ sender, key string }

// Server is the provider; it is an http.Handler.
type Server struct {
	mu       sync.Mutex
	byKey    map[scopedKey]*message
	requests map[scopedKey]int // send requests per key, failed ones included
	order    []scopedKey       // keys in delivery order
	seq      int
	ctl      control
	mux      *http.ServeMux      // the sender's API
	sleep    func(time.Duration) // time.Sleep; tests may shorten it
}

// New returns an empty provider.
func New() *Server {
	s := &Server{sleep: time.Sleep}
	s.reset()
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/messages", s.send)
	s.mux.HandleFunc("GET /v1/messages", s.lookup)
	s.mux.HandleFunc("GET /healthz", health)
	return s
}

// Needs are the roles Handler's routes need.
var Needs = []service.Role{service.RoleRead, service.RoleAdmin, service.RoleSend}

// Handler is the provider as its command serves it, every route but
// /healthz, /readyz and /metrics behind a key (401 without one, 403
// without the route's role): the sender's API (send, lookup) needs the
// role send, as a real provider's API wants the sender's credential;
// deliveries and GET /v1/control need read; POST /v1/control and
// /v1/reset need admin. The operator's routes come after access's rate
// limits. The sender's API has none: the double answers as fast as it is
// asked, and a test that wants it to refuse (429, 5xx) says so through
// POST /v1/control.
//
// It is built on service.NewRouter, as the services are: request ids,
// server spans continuing the sender's trace, access logs, JSON 404 and
// 405 answers, and the open /healthz, /readyz (no checks: the double
// depends on nothing) and /metrics (metrics; none when nil).
func (s *Server) Handler(log *slog.Logger, metrics http.Handler, access service.Access) (http.Handler, error) {
	if err := access.Keys.Need(Needs...); err != nil {
		return nil, fmt.Errorf("smsprovider: %w", err)
	}
	r := service.NewRouter(log, metrics, nil)
	r.Group(func(r chi.Router) {
		r.Use(service.RequireAPIKey(access.Keys), service.RequireRole(service.RoleSend))
		r.Post("/v1/messages", s.send)
		r.Get("/v1/messages", s.lookup)
	})
	r.Group(func(r chi.Router) {
		access.Protect(r)
		read, admin := service.RequireRole(service.RoleRead), service.RequireRole(service.RoleAdmin)
		r.With(read).Get("/v1/deliveries", s.deliveries)
		r.With(read).Get("/v1/control", s.getControl)
		r.With(admin).Post("/v1/control", s.setControl)
		r.With(admin).Post("/v1/reset", func(w http.ResponseWriter, _ *http.Request) {
			s.mu.Lock()
			s.reset()
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
		})
	})
	return r, nil
}

func health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) reset() {
	s.byKey, s.requests, s.order, s.seq = map[scopedKey]*message{}, map[scopedKey]int{}, nil, 0
	s.ctl = control{FailStatus: http.StatusServiceUnavailable}
}

// ServeHTTP serves the sender's API (send, lookup) and /healthz only.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 {
		writeError(w, http.StatusBadRequest, "Idempotency-Key header required (1-255 characters)")
		return
	}
	var req struct {
		To   string `json:"to"`
		Body string `json:"body"`
	}
	if bad := httpjson.Decode(w, r, &req); bad != nil {
		bad.Write(w)
		return
	}
	if req.To == "" || req.Body == "" {
		writeError(w, http.StatusBadRequest, "to and body are required")
		return
	}

	sk := scopedKey{service.ClientOf(r.Context()), key}
	s.mu.Lock()
	s.requests[sk]++
	hang, hangAfter := s.takeHang(req.To)
	if s.ctl.FailNext > 0 && s.aimedAt(req.To) {
		s.ctl.FailNext--
		status := s.ctl.FailStatus
		s.mu.Unlock()
		s.sleep(hang)
		writeError(w, status, "injected failure")
		return
	}
	if !hangAfter && hang > 0 {
		// Hang before accepting: nothing stored yet, so release the lock.
		s.mu.Unlock()
		s.sleep(hang)
		hang = 0
		s.mu.Lock()
	}
	m, replay := s.byKey[sk]
	if replay && (m.To != req.To || m.Body != req.Body) {
		s.mu.Unlock()
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key reused with a different message")
		return
	}
	if !replay {
		s.seq++
		m = &message{MessageID: fmt.Sprintf("sms_%06d", s.seq), IdempotencyKey: key, To: req.To, Body: req.Body,
			Status: "delivered", CreatedAt: time.Now().UTC(), traceparent: r.Header.Get("traceparent")}
		s.byKey[sk] = m
		s.order = append(s.order, sk)
	}
	resp := *m
	s.mu.Unlock()

	s.sleep(hang) // hang after accepting: stored, counted and delivered already
	status := http.StatusCreated
	if replay {
		status = http.StatusOK
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, status, resp)
}

// aimedAt reports whether the faults apply to a send to this recipient
// (Control.To). Call with mu held.
func (s *Server) aimedAt(to string) bool { return s.ctl.To == "" || s.ctl.To == to }

// takeHang consumes one hang for a send to this recipient, if any. Call
// with mu held.
func (s *Server) takeHang(to string) (time.Duration, bool) {
	if s.ctl.HangNext <= 0 || s.ctl.HangMS <= 0 || !s.aimedAt(to) {
		return 0, false
	}
	s.ctl.HangNext--
	return time.Duration(s.ctl.HangMS) * time.Millisecond, s.ctl.HangAfterAccept
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "idempotency_key query parameter required")
		return
	}
	s.mu.Lock()
	m, ok := s.byKey[scopedKey{service.ClientOf(r.Context()), key}]
	var resp message
	if ok {
		resp = *m
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "no message accepted under this key")
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// Deliveries lists what was delivered, in delivery order.
func (s *Server) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Delivery, 0, len(s.order))
	for _, k := range s.order {
		m := s.byKey[k]
		out = append(out, Delivery{Sender: k.sender, IdempotencyKey: k.key, MessageID: m.MessageID, To: m.To, Body: m.Body,
			Requests: s.requests[k], DeliveredAt: m.CreatedAt, Traceparent: m.traceparent})
	}
	return out
}

// Requests is how many send requests arrived under key (failed ones too),
// from every sender.
func (s *Server) Requests(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.requests {
		if k.key == key {
			n += c
		}
	}
	return n
}

func (s *Server) deliveries(w http.ResponseWriter, r *http.Request) {
	d := s.Deliveries()
	if p := r.URL.Query().Get("idempotency_key_prefix"); p != "" {
		kept := d[:0]
		for _, x := range d {
			if strings.HasPrefix(x.IdempotencyKey, p) {
				kept = append(kept, x)
			}
		}
		d = kept
	}
	requests := 0
	for _, x := range d {
		requests += x.Requests
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": d, "total": len(d), "requests": requests})
}

// check refuses a Control that would not be applied as asked: a
// fail_status that is not an error status (400-599), a negative count or
// hang. The error names the field.
func (c Control) check() *httpjson.Error {
	invalid := func(field, format string, args ...any) *httpjson.Error {
		return httpjson.Invalid("invalid_field", field, format, args...)
	}
	switch {
	case c.FailNext != nil && *c.FailNext < 0:
		return invalid("fail_next", "fail_next must be 0 or more, got %d", *c.FailNext)
	case c.FailStatus != nil && (*c.FailStatus < 400 || *c.FailStatus > 599):
		return invalid("fail_status", "fail_status must be an error status, 400 to 599, got %d", *c.FailStatus)
	case c.HangMS != nil && *c.HangMS < 0:
		return invalid("hang_ms", "hang_ms must be 0 or more, got %d", *c.HangMS)
	case c.HangNext != nil && *c.HangNext < 0:
		return invalid("hang_next", "hang_next must be 0 or more, got %d", *c.HangNext)
	}
	return nil
}

// SetControl applies c as POST /v1/control does. A Control that POST
// refuses with a 400 (a fail_status outside 400-599, a negative count or
// hang) is a mistake of the calling test: SetControl panics with the same
// message, instead of applying something else.
func (s *Server) SetControl(c Control) {
	if bad := c.check(); bad != nil {
		panic("smsprovider: SetControl: " + bad.Message)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.FailNext != nil {
		s.ctl.FailNext = *c.FailNext
	}
	if c.FailStatus != nil {
		s.ctl.FailStatus = *c.FailStatus
	}
	if c.HangMS != nil {
		s.ctl.HangMS = *c.HangMS
		s.ctl.HangNext = 1
	}
	if c.HangNext != nil {
		s.ctl.HangNext = *c.HangNext
	}
	if c.HangAfterAccept != nil {
		s.ctl.HangAfterAccept = *c.HangAfterAccept
	}
	if c.To != nil {
		s.ctl.To = *c.To
	}
}

func (s *Server) setControl(w http.ResponseWriter, r *http.Request) {
	var c Control
	bad := httpjson.Decode(w, r, &c)
	if bad == nil {
		bad = c.check() // refused whole: none of its fields applied
	}
	if bad != nil {
		bad.Write(w)
		return
	}
	s.SetControl(c)
	s.getControl(w, r)
}

func (s *Server) getControl(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	c := s.ctl
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, c)
}

func writeJSON(w http.ResponseWriter, status int, v any) { service.WriteJSON(w, status, v) }

func writeError(w http.ResponseWriter, status int, msg string) {
	service.WriteError(w, status, strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_")), "", msg)
}
