// Package api is the rewards service's HTTP API: the read API of wallets
// and rates, and the rate schedule an operator uses to change the
// cashback rate.
package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/httpjson"
	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

// Needs are the roles the routes need: the service refuses to start
// without a client for each.
var Needs = []service.Role{service.RoleRead, service.RoleAdmin}

// Server serves the API.
type Server struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	access service.Access
	rules  cashback.RateRules
}

// New returns the API on pool, open to the clients of access, changing
// rates within rules.
func New(pool *pgxpool.Pool, log *slog.Logger, access service.Access, rules cashback.RateRules) (*Server, error) {
	if err := access.Keys.Need(Needs...); err != nil {
		return nil, fmt.Errorf("rewards api: %w", err)
	}
	if err := rules.Validate(); err != nil {
		return nil, fmt.Errorf("rewards api: %w", err)
	}
	return &Server{pool: pool, log: log, access: access, rules: rules}, nil
}

// Routes mounts, on r, behind the caller's address's rate limit, a
// client's key (401) and that client's rate limit:
//
//	GET  /v1/wallets/{user_id}  (read) balance_paise and one page of credits, newest
//	                            first: ?limit=1..1000 (100), ?before=<next_before>;
//	                            a user_id outside events.ValidID is 404 wallet_not_found,
//	                            answered without a query (a valid one without credits
//	                            has a balance of 0)
//	GET  /v1/cashback-rates     (read) the rate history, with who scheduled each
//	POST /v1/cashback-rates     (admin) {"rate_bp":300,"effective_from":"RFC 3339"}:
//	                            schedules a rate; effective_from defaults to now +
//	                            the minimum lead; 422 if it is sooner (no
//	                            retroactive rates) or rate_bp is above the ceiling;
//	                            the body is read by httpjson.Decode (400 naming the
//	                            field, 413 over 64 KiB), and a refused one writes nothing
//
// A key without the route's role is 403. A rate change is logged as one
// audit line: the client, the rate it replaces and the new one.
func (s *Server) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		s.access.Protect(r)
		r.With(service.RequireRole(service.RoleRead)).Get("/v1/wallets/{user_id}", s.wallet)
		r.With(service.RequireRole(service.RoleRead)).Get("/v1/cashback-rates", s.rates)
		r.With(service.RequireRole(service.RoleAdmin)).Post("/v1/cashback-rates", s.addRate)
	})
}

func (s *Server) wallet(w http.ResponseWriter, r *http.Request) {
	userID := service.IDParam(r, "user_id")
	if userID == "" {
		// No payment can carry such a user id (payments refuses it, and
		// so does every consumer), so no wallet has it: answered without
		// a query, and without repeating it.
		service.WriteError(w, http.StatusNotFound, "wallet_not_found", "user_id",
			fmt.Sprintf("no wallet for this user_id: user ids are 1 to %d of A-Z a-z 0-9 _ . : @ -", events.MaxIDLength))
		return
	}
	var page cashback.Page
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > cashback.MaxPageLimit {
			service.WriteError(w, http.StatusBadRequest, "invalid", "limit", fmt.Sprintf("limit must be 1..%d", cashback.MaxPageLimit))
			return
		}
		page.Limit = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			service.WriteError(w, http.StatusBadRequest, "invalid", "before", "before must be a next_before cursor of an earlier page")
			return
		}
		page.Before = n
	}
	wallet, _, err := cashback.LoadWallet(r.Context(), s.pool, userID, page)
	if err != nil {
		service.InternalError(w, r, s.log, "load wallet", err)
		return
	}
	service.WriteJSON(w, http.StatusOK, wallet)
}

func (s *Server) rates(w http.ResponseWriter, r *http.Request) {
	rates, err := cashback.Rates(r.Context(), s.pool)
	if err != nil {
		service.InternalError(w, r, s.log, "list rates", err)
		return
	}
	service.WriteJSON(w, http.StatusOK, map[string]any{"rates": rates})
}

func (s *Server) addRate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RateBP        *int       `json:"rate_bp"`
		EffectiveFrom *time.Time `json:"effective_from"`
	}
	if bad := httpjson.Decode(w, r, &body); bad != nil {
		bad.Write(w)
		return
	}
	if body.RateBP == nil || *body.RateBP < 0 {
		service.WriteError(w, http.StatusUnprocessableEntity, "invalid", "rate_bp", fmt.Sprintf("rate_bp is required, 0..%d", s.rules.MaxBP))
		return
	}
	if *body.RateBP > s.rules.MaxBP {
		service.WriteError(w, http.StatusUnprocessableEntity, "rate_above_ceiling", "rate_bp",
			fmt.Sprintf("rate_bp %d is above the ceiling of %d bp (REWARDS_MAX_RATE_BP)", *body.RateBP, s.rules.MaxBP))
		return
	}
	client := service.ClientOf(r.Context())
	rate, previous, err := cashback.AddRate(r.Context(), s.pool,
		cashback.RateChange{EffectiveFrom: body.EffectiveFrom, RateBP: *body.RateBP, Client: client}, s.rules)
	switch {
	case errors.Is(err, cashback.ErrRetroactiveRate):
		service.WriteError(w, http.StatusUnprocessableEntity, "retroactive_rate", "effective_from",
			fmt.Sprintf("effective_from must be at least %v from now (REWARDS_RATE_MIN_LEAD), so no payment already made sees its rate change", s.rules.MinLead))
	case errors.Is(err, cashback.ErrRateTooLate):
		service.WriteError(w, http.StatusUnprocessableEntity, "invalid", "effective_from", "effective_from must be before the year 10000 in UTC")
	case errors.Is(err, cashback.ErrRateExists):
		service.WriteError(w, http.StatusConflict, "rate_exists", "effective_from", "a rate already takes effect at that time")
	case err != nil:
		service.InternalError(w, r, s.log, "add rate", err)
	default:
		s.log.InfoContext(r.Context(), "audit: cashback rate changed", "client", client,
			"old_rate_bp", previous, "new_rate_bp", rate.RateBP, "effective_from", rate.EffectiveFrom)
		service.WriteJSON(w, http.StatusCreated, rate)
	}
}
