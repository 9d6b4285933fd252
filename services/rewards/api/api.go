// Package api is the rewards service's HTTP read API (and the rate
// schedule an operator or the e2e suite uses to change the cashback rate).
package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

// Routes mounts, on r:
//
//	GET  /v1/wallets/{user_id}  balance_paise and the credits list (200 with balance 0 for a user never credited)
//	GET  /v1/cashback-rates     the rate history
//	POST /v1/cashback-rates     {"rate_bp":300,"effective_from":"RFC 3339, optional, default now"}:
//	                            schedules a new rate; 422 if effective_from is in the past
func Routes(r chi.Router, pool *pgxpool.Pool) {
	r.Get("/v1/wallets/{user_id}", func(w http.ResponseWriter, req *http.Request) {
		wallet, _, err := cashback.LoadWallet(req.Context(), pool, chi.URLParam(req, "user_id"))
		if err != nil {
			service.WriteError(w, http.StatusInternalServerError, "internal", "", err.Error())
			return
		}
		service.WriteJSON(w, http.StatusOK, wallet)
	})
	r.Get("/v1/cashback-rates", func(w http.ResponseWriter, req *http.Request) {
		rates, err := cashback.Rates(req.Context(), pool)
		if err != nil {
			service.WriteError(w, http.StatusInternalServerError, "internal", "", err.Error())
			return
		}
		service.WriteJSON(w, http.StatusOK, map[string]any{"rates": rates})
	})
	r.Post("/v1/cashback-rates", func(w http.ResponseWriter, req *http.Request) {
		var body struct {
			RateBP        *int      `json:"rate_bp"`
			EffectiveFrom time.Time `json:"effective_from"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			service.WriteError(w, http.StatusBadRequest, "bad_request", "body", err.Error())
			return
		}
		if body.RateBP == nil || *body.RateBP < 0 || *body.RateBP > cashback.MaxRateBP {
			service.WriteError(w, http.StatusUnprocessableEntity, "invalid", "rate_bp", "rate_bp is required, 0..10000")
			return
		}
		rate, err := cashback.AddRate(req.Context(), pool, body.EffectiveFrom, *body.RateBP)
		switch {
		case errors.Is(err, cashback.ErrRetroactiveRate):
			service.WriteError(w, http.StatusUnprocessableEntity, "retroactive_rate", "effective_from", err.Error())
		case errors.Is(err, cashback.ErrRateExists):
			service.WriteError(w, http.StatusConflict, "rate_exists", "effective_from", err.Error())
		case err != nil:
			service.WriteError(w, http.StatusInternalServerError, "internal", "", err.Error())
		default:
			service.WriteJSON(w, http.StatusCreated, rate)
		}
	})
}
