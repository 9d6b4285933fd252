// Package api is the Payments HTTP API:
//
//	POST /v1/payments              (Idempotency-Key) charge, 201 with the payment
//	GET  /v1/payments/{id}         200 with the payment, 404
//	POST /v1/payments/{id}/refund  (Idempotency-Key) full refund, 200 with the payment
//
// How a charge stays single however often it is retried:
//
//  1. The request is validated first; a bad one writes nothing (4xx).
//  2. pkg/httpidem claims the Idempotency-Key with an INSERT and, in that
//     same row, records the payment id (pay_...) BEFORE anything else
//     happens. A retry of an unfinished attempt gets the same payment id.
//  3. Stripe is called with the idempotency key pi:<payment id>: a retry
//     after a crash or a timeout sends the same key, and Stripe returns the
//     first charge instead of making a second one.
//  4. One transaction commits the payment row (SUCCEEDED, version 1), its
//     outbox row PaymentSucceeded, and the saved response of the key.
//
// A crash between 3 and 4 leaves the key claimed with no response: its
// lease expires (IDEMPOTENCY_LOCK_TIMEOUT) and the client's retry runs steps
// 3 and 4 again with the same payment id and Stripe key.
//
// Refunds follow the same steps with the Stripe key refund:<payment id>:
// the payment goes to REFUNDED at version 2 with a PaymentRefunded outbox
// row. A payment is refunded once: a later refund with a new key is 409
// payment_already_refunded (saved under that key like any other outcome).
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/payments/provider"
	"github.com/effectively-once/payments-cashback/services/payments/store"
)

// AfterChargeBeforeCommit is the failpoint between a successful Stripe
// charge and the commit of the payment (FAILPOINTS=after-charge-before-commit
// kills the process there; after-charge-before-commit=<user_id> only on that
// user's payment).
const AfterChargeBeforeCommit = "after-charge-before-commit"

// Gateway is the payment provider (provider.Stripe).
type Gateway interface {
	Charge(ctx context.Context, c provider.Charge) (intentID string, err error)
	Refund(ctx context.Context, paymentID, intentID string) (refundID string, err error)
}

// Needs are the roles the API's routes need: every route wants RolePay.
var Needs = []service.Role{service.RolePay}

// Server serves the API.
type Server struct {
	pool   *pgxpool.Pool
	keys   *httpidem.Store
	gw     Gateway
	log    *slog.Logger
	access service.Access
	wake   *outbox.Notifier // nil: the relays find new rows by polling

	created, refunded metric.Int64Counter
}

// WakeRelays makes every commit that wrote an outbox row ask n to wake the
// relays (outbox.Notifier). Without it they find the rows by polling.
func (s *Server) WakeRelays(n *outbox.Notifier) { s.wake = n }

// New returns the API on pool (migrated), keys and gw, open to the clients
// of access.
func New(pool *pgxpool.Pool, keys *httpidem.Store, gw Gateway, log *slog.Logger, access service.Access) (*Server, error) {
	if access.RateLimit <= 0 || access.RateWindow <= 0 || access.AddressRateLimit <= 0 {
		return nil, errors.New("api: RateLimit, AddressRateLimit and RateWindow must be positive")
	}
	if err := access.Keys.Need(Needs...); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	s := &Server{pool: pool, keys: keys, gw: gw, log: log, access: access}
	m := otel.Meter(otelScope)
	var err error
	if s.created, err = m.Int64Counter("payments_created_total", metric.WithDescription("Payments committed as SUCCEEDED.")); err != nil {
		return nil, err
	}
	if s.refunded, err = m.Int64Counter("payments_refunded_total", metric.WithDescription("Payments committed as REFUNDED.")); err != nil {
		return nil, err
	}
	return s, nil
}

// Routes adds the API's routes to r (a service.NewRouter). Every route
// counts against the caller's address's rate limit, needs a key of a
// client with RolePay and counts against that client's rate limit; all are
// checked before anything is read or written. A payment belongs to the
// client that made it: another client's GET or refund of it is 404, as for
// a payment that does not exist, and so is an id outside the id allowlist
// (events.ValidID), answered without a query. The router's server
// span (service.NewRouter) carries the caller's trace into the outbox row's
// traceparent, and from there to SQS.
func (s *Server) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		s.access.Protect(r)
		r.Use(service.RequireRole(service.RolePay))
		r.With(httpidem.RequireKey).Post("/v1/payments", s.create)
		r.Get("/v1/payments/{id}", s.get)
		r.With(httpidem.RequireKey).Post("/v1/payments/{id}/refund", s.refund)
	})
}

// scope is an idempotency key's scope: the client and the endpoint, so one
// client's key can never replay another client's response.
func scope(r *http.Request, endpoint string) string {
	return service.ClientOf(r.Context()) + " " + endpoint
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	req, bad := parseCreate(w, r)
	if bad != nil {
		bad.Write(w)
		return
	}
	s.keys.Handle(w, r, httpidem.Request{
		Scope:         scope(r, "POST /v1/payments"),
		Fingerprint:   req,
		NewResourceID: store.NewID, // the payment id, recorded with the key before Stripe is called
	}, func(ctx context.Context, a *httpidem.Attempt) error {
		return s.charge(ctx, a, req, service.ClientOf(r.Context()))
	})
}

// charge runs under the key's lease; a.ResourceID is the payment id.
func (s *Server) charge(ctx context.Context, a *httpidem.Attempt, req NewPayment, client string) error {
	intentID, err := s.gw.Charge(ctx, provider.Charge{
		PaymentID: a.ResourceID, UserID: req.UserID, AmountPaise: req.AmountPaise, Currency: req.Currency, Method: req.Method,
	})
	var declined *provider.DeclinedError
	if errors.As(err, &declined) {
		// Final: saved, so the same key replays the decline.
		return a.Save(ctx, s.pool, http.StatusPaymentRequired, errorBody(declineCode(declined.Code), "", "the payment method was declined; nothing was charged"))
	}
	if err != nil {
		return providerError(err, "nothing was charged")
	}
	if failpoint.HitFor(AfterChargeBeforeCommit, req.UserID) {
		return httpidem.ErrAbandon
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		p, err := store.InsertSucceeded(ctx, tx, store.Payment{
			ID: a.ResourceID, Client: client, UserID: req.UserID, AmountPaise: req.AmountPaise,
			Currency: req.Currency, Method: req.Method, ProviderRef: intentID,
		})
		if err != nil {
			return err
		}
		return a.Save(ctx, tx, http.StatusCreated, p)
	})
	if err != nil {
		return httpidem.Unrecorded(err) // the card is charged: Resume records it
	}
	s.wake.Notify()
	s.created.Add(ctx, 1)
	s.log.Info("payment succeeded", "payment_id", a.ResourceID, "provider_ref", intentID, "attempt", a.Number)
	return nil
}

// Resume finishes a payment or a refund whose attempt crashed before it
// was recorded, for httpidem.Store.Resume: the same Stripe call under the
// same key (pi:<payment id>, refund:<payment id>), which answers with the
// crashed call's result if it got through, then the same commit, as the
// client's retry would have done. The client is in the key's scope, the
// payment in its path, the payment's fields in the stored request.
func (s *Server) Resume(ctx context.Context, a *httpidem.Attempt, request []byte) error {
	client, endpoint, _ := strings.Cut(a.Scope(), " ")
	if endpoint == "POST /v1/payments" {
		var req NewPayment
		if err := json.Unmarshal(request, &req); err != nil {
			return fmt.Errorf("resume %s: stored request: %w", a.Scope(), err)
		}
		return s.charge(ctx, a, req, client)
	}
	if rest, ok := strings.CutPrefix(endpoint, "POST /v1/payments/"); ok {
		if id, ok := strings.CutSuffix(rest, "/refund"); ok && events.ValidID(id) {
			return s.refundPayment(ctx, a, client, id)
		}
	}
	return fmt.Errorf("resume: scope %q is no endpoint of this service", a.Scope())
}

// paymentID is the request's {id}, or "" when it cannot name a payment:
// one outside the id allowlist (events.ValidID), such as a NUL, bytes that
// are not UTF-8 or a bidi override, is answered 404 without a query.
func paymentID(r *http.Request) string { return service.IDParam(r, "id") }

func notFound(w http.ResponseWriter) {
	service.WriteError(w, http.StatusNotFound, "payment_not_found", "id", "no payment with this id")
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := paymentID(r)
	if id == "" {
		notFound(w)
		return
	}
	p, err := store.Get(r.Context(), s.pool, service.ClientOf(r.Context()), id)
	if errors.Is(err, store.ErrNotFound) {
		notFound(w)
		return
	}
	if err != nil {
		service.InternalError(w, r, s.log, "get payment", err)
		return
	}
	service.WriteJSON(w, http.StatusOK, p)
}

func (s *Server) refund(w http.ResponseWriter, r *http.Request) {
	id := paymentID(r)
	if id == "" {
		notFound(w)
		return
	}
	req, bad := parseRefund(w, r)
	if bad != nil {
		bad.Write(w)
		return
	}
	// An unknown payment is a bad request like any other: nothing written.
	client := service.ClientOf(r.Context())
	if _, err := store.Get(r.Context(), s.pool, client, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			notFound(w)
			return
		}
		service.InternalError(w, r, s.log, "get payment", err)
		return
	}
	s.keys.Handle(w, r, httpidem.Request{
		Scope:       scope(r, "POST /v1/payments/"+id+"/refund"),
		Fingerprint: req,
	}, func(ctx context.Context, a *httpidem.Attempt) error {
		return s.refundPayment(ctx, a, client, id)
	})
}

func (s *Server) refundPayment(ctx context.Context, a *httpidem.Attempt, client, id string) error {
	p, err := store.Get(ctx, s.pool, client, id) // read again under the key's lease
	if err != nil {
		return err
	}
	if p.Status != store.StatusSucceeded {
		return a.Save(ctx, s.pool, http.StatusConflict, alreadyRefunded)
	}
	refundID, err := s.gw.Refund(ctx, p.ID, p.ProviderRef)
	if err != nil {
		return providerError(err, "nothing was refunded")
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q, err := store.MarkRefunded(ctx, tx, p.ID, p.Version, refundID)
		if err != nil {
			return err
		}
		return a.Save(ctx, tx, http.StatusOK, q)
	})
	if errors.Is(err, store.ErrNotRefundable) {
		// A concurrent refund under another key committed first; Stripe saw
		// both under refund:<id>, so there is still one refund.
		return a.Save(ctx, s.pool, http.StatusConflict, alreadyRefunded)
	}
	if err != nil {
		return httpidem.Unrecorded(err) // the money is back with the customer: Resume records it
	}
	s.wake.Notify()
	s.refunded.Add(ctx, 1)
	s.log.Info("payment refunded", "payment_id", p.ID, "provider_refund_ref", refundID, "attempt", a.Number)
	return nil
}

var alreadyRefunded = errorBody("payment_already_refunded", "", "this payment has already been refunded")

// providerError answers a Stripe failure other than a decline. Nothing is
// saved: the client's retry (same Idempotency-Key) asks Stripe again under
// the same Stripe key. A refusal of an invalid call (*RejectedError) is
// 422, and says that nothing happened (done, "nothing was charged"). Any
// other failure is 502, and unless Stripe said it did not act on the call
// (provider.NotExecuted) its outcome is unknown: the card may have been
// charged, so the key is marked for Resume, which repeats the call one
// lease later if the client has not retried by then, and records what
// Stripe answers.
func providerError(err error, done string) error {
	var rej *provider.RejectedError
	if errors.As(err, &rej) {
		return &httpidem.Error{Status: http.StatusUnprocessableEntity, Code: "provider_rejected",
			Message: "the payment provider refused the request (" + safeCode(rej.Code) + "); " + done, Err: err}
	}
	return &httpidem.Error{Status: http.StatusBadGateway, Code: "provider_unavailable",
		Message: "the payment provider did not complete the request; retry with the same Idempotency-Key",
		Err:     err, OutcomeUnknown: !provider.NotExecuted(err)}
}

// safeCode is a provider's error code as it may appear in a response:
// lower-case letters, digits and underscores, at most 64 of them.
func safeCode(code string) string {
	if len(code) > 64 || strings.IndexFunc(code, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_'
	}) >= 0 {
		return "invalid_request"
	}
	return code
}

// declineCode is the code a decline is answered with: Stripe's decline
// code, unless it tells of fraud screening, which Stripe advises showing
// as generic_decline (so that whoever tries a stolen card learns nothing),
// or is not a plain code. Stripe's message is never passed on: it can name
// the screening rule that fired.
func declineCode(code string) string {
	switch code {
	case "fraudulent", "stolen_card", "lost_card", "merchant_blacklist", "pickup_card", "":
		return "generic_decline"
	}
	if safeCode(code) != code {
		return "generic_decline"
	}
	return code
}

func errorBody(code, field, message string) service.ErrorBody {
	return service.ErrorBody{Error: service.ErrorDetail{Code: code, Field: field, Message: message}}
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Server]().PkgPath()
