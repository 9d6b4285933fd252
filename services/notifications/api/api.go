// Package api is the notifications service's HTTP read API.
package api

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Notification is one notifications row as the API shows it.
type Notification struct {
	ID                int64      `json:"id"`
	EventID           uuid.UUID  `json:"event_id"`
	EventType         string     `json:"event_type"`
	Channel           string     `json:"channel"`
	Kind              string     `json:"kind"`
	Recipient         string     `json:"recipient"`
	Body              string     `json:"body"`
	Status            string     `json:"status"`
	IdempotencyKey    string     `json:"idempotency_key"`
	ProviderMessageID *string    `json:"provider_message_id"`
	Attempts          int        `json:"attempts"`
	NextAttemptAt     time.Time  `json:"next_attempt_at"`
	SendingSince      *time.Time `json:"sending_since,omitempty"`
	LastError         *string    `json:"last_error,omitempty"`
	FailureReason     *string    `json:"failure_reason,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
	UpdatedAt         time.Time  `json:"updated_at"`
	SentAt            *time.Time `json:"sent_at,omitempty"`
}

// Statuses are the states a notification can be in (the notifications
// table's CHECK): the only values ?status= takes.
var Statuses = []string{"PENDING", "SENDING", "SENT", "FAILED"}

// Needs are the roles the routes need: the service refuses to start
// without a client for each.
var Needs = []service.Role{service.RoleRead}

// Routes mounts, on r, behind the caller's address's rate limit, a key of
// a client with the role read (401 without a key, 403 without the role)
// and that client's rate limit:
//
//	GET /v1/notifications?event_id=<uuid>[&status=SENT][&limit=100]
//	    {"notifications":[...]}: the rows of that event (one per channel),
//	    or, without event_id, the most recent ones (newest first).
//	    A parameter of the wrong shape (an event_id that is no UUID, a
//	    status not in Statuses, a limit outside 1..1000) is 400 naming it,
//	    answered without a query.
//
// Rows hold phone numbers: that is why reading them needs a key.
func Routes(r chi.Router, pool *pgxpool.Pool, log *slog.Logger, access service.Access) error {
	if err := access.Keys.Need(Needs...); err != nil {
		return fmt.Errorf("notifications api: %w", err)
	}
	r.Group(func(r chi.Router) {
		access.Protect(r)
		r.With(service.RequireRole(service.RoleRead)).Get("/v1/notifications", list(pool, log))
	})
	return nil
}

func list(pool *pgxpool.Pool, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		var eventID *uuid.UUID
		if s := q.Get("event_id"); s != "" {
			id, err := uuid.Parse(s)
			if err != nil {
				service.WriteError(w, http.StatusBadRequest, "invalid", "event_id", "event_id must be a UUID")
				return
			}
			eventID = &id
		}
		var status *string
		if s := q.Get("status"); s != "" {
			if !slices.Contains(Statuses, s) {
				service.WriteError(w, http.StatusBadRequest, "invalid", "status", "status must be one of "+strings.Join(Statuses, ", "))
				return
			}
			status = &s
		}
		limit := 100
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 1000 {
				service.WriteError(w, http.StatusBadRequest, "invalid", "limit", "limit must be 1..1000")
				return
			}
			limit = n
		}
		rows, err := pool.Query(req.Context(), `SELECT id, event_id, event_type, channel, kind, recipient, body, status,
			idempotency_key, provider_message_id, attempts, next_attempt_at, sending_since, last_error, failure_reason,
			created_at, updated_at, sent_at
			FROM notifications
			WHERE ($1::uuid IS NULL OR event_id = $1) AND ($2::text IS NULL OR status = $2)
			ORDER BY id DESC LIMIT $3`, eventID, status, limit)
		if err == nil {
			var list []Notification
			if list, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Notification]); err == nil {
				if list == nil {
					list = []Notification{}
				}
				service.WriteJSON(w, http.StatusOK, map[string]any{"notifications": list})
				return
			}
		}
		service.InternalError(w, req, log, "list notifications", err)
	}
}
