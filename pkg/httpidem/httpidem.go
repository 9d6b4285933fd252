// Package httpidem gives an HTTP API Stripe-style Idempotency-Key semantics,
// backed by PostgreSQL (table idempotency_keys, created by Migrate).
//
// For every (scope, key) — scope is the caller, the endpoint and the path,
// so two clients, or a refund and a payment, may send equal keys — the
// first request claims the key
// with an INSERT ... ON CONFLICT DO NOTHING before anything else happens.
// Then, for any later request with the same key:
//
//   - a different request body (by hash) is refused with 422, checked before
//     anything is replayed;
//   - a finished operation has its saved response (status and body, errors
//     included) replayed byte for byte, with the header Idempotent-Replayed;
//   - an operation still running is refused with 409 (Retry-After);
//   - an operation whose attempt ended without a response is run again: at
//     once if the attempt failed cleanly (it releases its lease), after the
//     lock timeout if it crashed (its lease expires). The retry gets the same
//     Attempt.ResourceID the first attempt was given, so an external call
//     keyed on it (a Stripe idempotency key) is the same call, not a new one.
//
// The response is saved by the operation itself, with Attempt.Save inside
// the transaction that commits its effect: the effect and "this key is done"
// commit together or not at all. Save is fenced by the attempt's lease, so
// an attempt that outlived its lease and was taken over cannot commit too.
//
// An attempt that crashed and whose client never retries is finished by
// Store.Resume (RunResume, a service task): it takes the key over after the
// lease, as a retry would, and runs the operation with the stored request.
// So is one that failed with an outcome it could not know (an *Error with
// OutcomeUnknown: a provider call that timed out may have charged the card).
//
// Keys are kept for Config.Retention (24 h, as Stripe does) and then deleted
// by Cleanup; a retry after that is a new request.
//
// Request validation happens BEFORE Handle: a malformed request writes
// nothing and is not saved, so a client can fix it and retry with the same
// key (Stripe does the same).
package httpidem

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
)

// Header names.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
	MaxKeyLen      = 255
)

//go:embed migrations/*.sql
var migrations embed.FS

// VersionTable is the goose version table of this package's schema.
const VersionTable = "httpidem_schema_version"

// Migrate creates or upgrades the idempotency_keys table. Safe to run from
// several replicas at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	return migrate.Up(ctx, pool, sub, VersionTable)
}

// Errors of this package. Handle turns each into its HTTP answer.
var (
	// ErrKeyMissing and ErrKeyInvalid: 400, nothing written.
	ErrKeyMissing = errors.New("the Idempotency-Key header is required")
	ErrKeyInvalid = fmt.Errorf("the Idempotency-Key header must be 1 to %d printable ASCII characters", MaxKeyLen)
	// ErrKeyRepeated: the header came more than once (400, code
	// idempotency_key_invalid): which of them is the key is not guessed.
	ErrKeyRepeated = errors.New("the Idempotency-Key header was sent more than once; send exactly one")
	// ErrMismatch: the key was used with a different request: 422.
	ErrMismatch = errors.New("this Idempotency-Key was already used with a different request")
	// ErrInFlight: another request with the key is running: 409.
	ErrInFlight = errors.New("a request with this Idempotency-Key is still in progress; retry later")
	// ErrLockLost: Save found that another attempt took the key over (this
	// one outlived its lease). The caller must roll its transaction back.
	ErrLockLost = errors.New("httpidem: the attempt's lease was taken over by a retry")
	// ErrAbandon, returned by an operation, makes Handle behave as a
	// crashed process would: the connection is dropped and the lease is left
	// to expire (no release). For crash tests (see pkg/failpoint).
	ErrAbandon = errors.New("httpidem: attempt abandoned (simulated crash)")
)

// Error is an operation failure that is NOT saved: the attempt's lease is
// released and the client may retry with the same key, which runs the
// operation again with the same ResourceID. Use it for transient failures
// (a provider that is down, a database error).
type Error struct {
	Status  int
	Code    string
	Message string
	Err     error
	// OutcomeUnknown says the operation may have taken effect: an external
	// call that timed out, or was answered with a server error, may have
	// been carried out. The key is released for the client's retry as for
	// any Error, and if no attempt has finished it one LockTimeout later,
	// Resume runs the operation again without the client, as it does a
	// crashed attempt's. Leave it false only when the call is known to have
	// done nothing (refused before it ran: its credentials rejected, the
	// request invalid): an operation resumed then would act for the first
	// time, for a client that may have given up.
	OutcomeUnknown bool
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err) }

// Unrecorded is err, the failure to record an external call that took
// effect (the commit after a provider charged a card, say), as an
// OutcomeUnknown Error: the client gets a 500 that asks it to retry with
// the same key, and if it never does, Resume runs the operation again one
// LockTimeout later, whose repeat of the call (under the provider's own
// idempotency key) answers with the first call's result and records it.
// Returned as a plain error, the key would be released as if nothing had
// happened, and the effect left with no record. nil, ErrLockLost (another
// attempt owns the key) and ErrAbandon pass through; an *Error is marked
// OutcomeUnknown.
func Unrecorded(err error) error {
	var e *Error
	switch {
	case err == nil, errors.Is(err, ErrLockLost), errors.Is(err, ErrAbandon):
		return err
	case errors.As(err, &e):
		marked := *e
		marked.OutcomeUnknown = true
		return &marked
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal",
		Message: "internal error; retry with the same Idempotency-Key", Err: err, OutcomeUnknown: true}
}
func (e *Error) Unwrap() error { return e.Err }

// Config tunes a Store. Zero values take the defaults in brackets.
type Config struct {
	// LockTimeout is the lease of a running attempt [1m]. A request that
	// crashed mid-operation blocks its key (409) this long; then a retry
	// takes over. The operation runs with a deadline of 3/4 of it, so a live
	// attempt has ended before its lease can be taken over.
	LockTimeout time.Duration
	// Retention is how long keys are kept [24h]; CleanupInterval is how
	// often RunCleanup deletes older ones [10m].
	Retention, CleanupInterval time.Duration
	Logger                     *slog.Logger
}

func (c *Config) defaults() {
	if c.LockTimeout <= 0 {
		c.LockTimeout = time.Minute
	}
	if c.Retention <= 0 {
		c.Retention = 24 * time.Hour
	}
	if c.CleanupInterval <= 0 {
		c.CleanupInterval = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Store keeps idempotency keys in PostgreSQL.
type Store struct {
	pool     *pgxpool.Pool
	cfg      Config
	log      *slog.Logger
	outcomes metric.Int64Counter
}

// New returns a Store on pool (whose database has been migrated).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("httpidem: New needs a pool")
	}
	cfg.defaults()
	c, err := otel.Meter(otelScope).Int64Counter(
		"http_idempotency_requests_total",
		metric.WithDescription("Requests carrying an Idempotency-Key, by outcome: executed, retried, replayed, in_flight, mismatch, released, lock_lost; and resumed: a crashed attempt taken over by Resume."))
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: cfg, log: cfg.Logger, outcomes: c}, nil
}

// Request describes one idempotent operation.
type Request struct {
	// Scope names the authenticated caller, the endpoint and the resource,
	// e.g. "client_a POST /v1/payments" or "client_a POST
	// /v1/payments/pay_1/refund". Keys are unique per scope. Clients pick
	// their keys, so two of them can send the same one: leave the caller
	// out and the second is replayed the first one's response, its data
	// included.
	Scope string
	// Fingerprint is the validated request (a struct): its JSON encoding is
	// hashed, so the same request with other whitespace or field order is
	// the same request, and a different one is a 422.
	Fingerprint any
	// NewResourceID, if set, is called on the first attempt; its result is
	// stored with the key BEFORE the operation runs and given to every
	// attempt, so retries act on the same resource (the same payment id, the
	// same provider idempotency key).
	NewResourceID func() string
}

// Attempt is the right to run an operation once: at most one request holds
// it per key at a time.
type Attempt struct {
	ResourceID string // from Request.NewResourceID, the same for every attempt
	Number     int    // 1, or more when an unfinished attempt is retried

	scope, key string
	token      uuid.UUID
	status     int
	body       []byte
}

// Scope is the Request.Scope of the key this attempt holds: what a Resume
// operation reads to know which endpoint (and, in the scope, which client)
// it is finishing.
func (a *Attempt) Scope() string { return a.scope }

// DB is what Save writes through: a pgx.Tx (normally) or a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Save records the operation's final response, status and JSON-encoded
// body, through db: pass the transaction that commits the operation's
// effect, so the two commit together. (For an outcome with no effect, such
// as a declined card, pass the pool.) It returns ErrLockLost if a retry has
// taken this key over; the caller must then roll back. After Save, the
// operation returns nil once its transaction has committed, and Handle
// writes the saved response.
func (a *Attempt) Save(ctx context.Context, db DB, status int, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("httpidem: encode response: %w", err)
	}
	b = append(b, '\n')
	tag, err := db.Exec(ctx, `UPDATE idempotency_keys
		SET response_code = $3, response_body = $4, locked_at = NULL, lock_token = NULL, completed_at = now()
		WHERE scope = $1 AND key = $2 AND lock_token = $5 AND response_code IS NULL`,
		a.scope, a.key, status, b, a.token)
	if err != nil {
		return fmt.Errorf("httpidem: save response: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLockLost
	}
	a.status, a.body = status, b
	return nil
}

// RequireKey is middleware that answers 400 to a request without a valid
// Idempotency-Key header, before its body is even read.
func RequireKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := KeyFrom(r); err != nil {
			writeKeyError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// KeyFrom returns the request's Idempotency-Key: 1 to 255 printable ASCII
// characters.
func KeyFrom(r *http.Request) (string, error) {
	vals := r.Header.Values(HeaderKey)
	if len(vals) == 0 || vals[0] == "" {
		return "", ErrKeyMissing
	}
	if len(vals) > 1 {
		return "", ErrKeyRepeated
	}
	k := vals[0]
	if len(k) > MaxKeyLen {
		return "", ErrKeyInvalid
	}
	for _, c := range k {
		if c > unicode.MaxASCII || !unicode.IsPrint(c) {
			return "", ErrKeyInvalid
		}
	}
	return k, nil
}

func writeKeyError(w http.ResponseWriter, err error) {
	code := "idempotency_key_missing"
	if errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrKeyRepeated) {
		code = "idempotency_key_invalid"
	}
	errs.Write(w, http.StatusBadRequest, code, HeaderKey, err.Error())
}

// Handle runs op at most once to completion for the request's key and
// writes the response: the one op saved, a replay of it, or an error.
//
// op runs with a context that is not cancelled when the client goes away
// (a charge in progress should be recorded, not dropped) but has a deadline
// of 3/4 of the lock timeout. op must either Save and commit, then return
// nil; or return an error, which releases the lease without saving: an
// *Error chooses the status, anything else is a 500; ErrLockLost is a 409;
// ErrAbandon drops the connection and leaves the lease to expire.
func (s *Store) Handle(w http.ResponseWriter, r *http.Request, req Request, op func(ctx context.Context, a *Attempt) error) {
	key, err := KeyFrom(r)
	if err != nil {
		writeKeyError(w, err)
		return
	}
	fp, err := json.Marshal(req.Fingerprint)
	if err != nil {
		s.log.Error("idempotency: fingerprint", "scope", req.Scope, "error", err)
		errs.Write(w, http.StatusInternalServerError, "internal", "", "internal error")
		return
	}
	hash := sha256.Sum256(fp)
	ctx := r.Context()
	a, saved, err := s.begin(ctx, req, key, fp, hash[:])
	switch {
	case errors.Is(err, ErrMismatch):
		s.count(ctx, "mismatch")
		errs.Write(w, http.StatusUnprocessableEntity, "idempotency_key_reused", HeaderKey, err.Error())
		return
	case errors.Is(err, ErrInFlight):
		s.count(ctx, "in_flight")
		w.Header().Set("Retry-After", "1")
		errs.Write(w, http.StatusConflict, "idempotency_key_in_use", HeaderKey, err.Error())
		return
	case err != nil:
		s.log.Error("idempotency: claim key", "scope", req.Scope, "error", err)
		errs.Write(w, http.StatusInternalServerError, "internal", "", "internal error")
		return
	case saved != nil:
		s.count(ctx, "replayed")
		w.Header().Set(HeaderReplayed, "true")
		writeRaw(w, saved.status, saved.body)
		return
	}
	if a.Number > 1 {
		s.count(ctx, "retried")
		s.log.Info("idempotency: retrying an unfinished attempt", "scope", req.Scope, "attempt", a.Number, "resource_id", a.ResourceID)
	} else {
		s.count(ctx, "executed")
	}

	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LockTimeout*3/4)
	defer cancel()
	err = op(opCtx, a)
	switch {
	case err == nil && a.body == nil:
		err = errors.New("operation returned without saving a response")
	case err == nil:
		writeRaw(w, a.status, a.body)
		return
	case errors.Is(err, ErrAbandon):
		panic(http.ErrAbortHandler) // as a crash: no response, no release
	case errors.Is(err, ErrLockLost):
		s.count(ctx, "lock_lost")
		s.log.Warn("idempotency: attempt outlived its lease and was taken over", "scope", req.Scope, "attempt", a.Number)
		errs.Write(w, http.StatusConflict, "idempotency_key_in_use", HeaderKey, "this request was taken over by a retry with the same Idempotency-Key")
		return
	}
	var e *Error
	isErr := errors.As(err, &e)
	s.release(a, isErr && e.OutcomeUnknown)
	if isErr {
		s.log.Warn("idempotency: attempt failed, key released for a retry", "scope", req.Scope, "attempt", a.Number, "code", e.Code, "error", e.Err)
		errs.Write(w, e.Status, e.Code, "", e.Message)
		return
	}
	s.log.Error("idempotency: attempt failed, key released for a retry", "scope", req.Scope, "attempt", a.Number, "error", err)
	errs.Write(w, http.StatusInternalServerError, "internal", "", "internal error; retry with the same Idempotency-Key")
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

type savedResponse struct {
	status int
	body   []byte
}

// begin claims the key (INSERT first), or explains why not: a saved
// response, ErrMismatch, ErrInFlight; or takes over an unfinished attempt.
func (s *Store) begin(ctx context.Context, req Request, key string, fingerprint, hash []byte) (*Attempt, *savedResponse, error) {
	for range 5 {
		token := uuid.New()
		var resource *string
		if req.NewResourceID != nil {
			id := req.NewResourceID()
			resource = &id
		}
		tag, err := s.pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, request, resource_id, lock_token, locked_at)
			VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (scope, key) DO NOTHING`,
			req.Scope, key, hash, fingerprint, resource, token)
		if err != nil {
			return nil, nil, err
		}
		if tag.RowsAffected() == 1 {
			return &Attempt{ResourceID: deref(resource), Number: 1, scope: req.Scope, key: key, token: token}, nil, nil
		}

		var (
			gotHash  []byte
			gotRes   *string
			code     *int
			body     []byte
			held     bool
			attempts int
		)
		err = s.pool.QueryRow(ctx, `SELECT request_hash, resource_id, response_code, response_body,
				locked_at IS NOT NULL AND locked_at > now() - $3::interval, attempts
			FROM idempotency_keys WHERE scope = $1 AND key = $2`,
			req.Scope, key, s.cfg.LockTimeout).Scan(&gotHash, &gotRes, &code, &body, &held, &attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // deleted by the cleanup just now: claim it afresh
		}
		if err != nil {
			return nil, nil, err
		}
		// The hash first (lesson 6): a changed request never sees a replay.
		if string(gotHash) != string(hash) {
			return nil, nil, ErrMismatch
		}
		if code != nil {
			return nil, &savedResponse{status: *code, body: body}, nil
		}
		if held {
			return nil, nil, ErrInFlight
		}
		// Unfinished and not running: released by a failed attempt, or the
		// lease of a crashed one expired. Take it over, fencing the old one.
		tag, err = s.pool.Exec(ctx, `UPDATE idempotency_keys
			SET lock_token = $3, locked_at = now(), attempts = attempts + 1
			WHERE scope = $1 AND key = $2 AND response_code IS NULL
			  AND (locked_at IS NULL OR locked_at <= now() - $4::interval)`,
			req.Scope, key, token, s.cfg.LockTimeout)
		if err != nil {
			return nil, nil, err
		}
		if tag.RowsAffected() == 1 {
			return &Attempt{ResourceID: deref(gotRes), Number: attempts + 1, scope: req.Scope, key: key, token: token}, nil, nil
		}
		// Another retry took it over, or it just finished: look again.
	}
	return nil, nil, ErrInFlight
}

// release ends a failed attempt without a response, so that a retry may run
// at once; with resume, Resume finishes it one lease later unless an
// attempt has by then. A no-op if the attempt had saved (and committed)
// after all.
func (s *Store) release(a *Attempt, resume bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = NULL, lock_token = NULL,
		    resume_after = CASE WHEN $4 THEN now() + $5::interval ELSE resume_after END
		WHERE scope = $1 AND key = $2 AND lock_token = $3 AND response_code IS NULL`, a.scope, a.key, a.token, resume, s.cfg.LockTimeout)
	if err != nil {
		// The lease then expires after LockTimeout instead.
		s.log.Warn("idempotency: release key", "scope", a.scope, "error", err)
		return
	}
	s.count(ctx, "released")
}

func (s *Store) count(ctx context.Context, outcome string) {
	s.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// Cleanup deletes keys older than Retention, in chunks, and returns how
// many it deleted. A key whose operation never finished is logged as it
// goes: its external call (keyed on its resource id) may have happened
// without being recorded, which is for reconciliation to look at.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		rows, err := s.pool.Query(ctx, `DELETE FROM idempotency_keys WHERE (scope, key) IN (
				SELECT scope, key FROM idempotency_keys WHERE created_at < now() - $1::interval LIMIT 1000)
			RETURNING scope, resource_id, response_code IS NULL, attempts`, s.cfg.Retention)
		if err != nil {
			return total, fmt.Errorf("httpidem: cleanup: %w", err)
		}
		var n int64
		for rows.Next() {
			var (
				scope      string
				resource   *string
				unfinished bool
				attempts   int
			)
			if err := rows.Scan(&scope, &resource, &unfinished, &attempts); err != nil {
				rows.Close()
				return total, err
			}
			n++
			if unfinished {
				s.log.Warn("idempotency: expired key of an operation that never finished; reconcile its resource",
					"scope", scope, "resource_id", deref(resource), "attempts", attempts)
			}
		}
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("httpidem: cleanup: %w", err)
		}
		total += n
		if n < 1000 {
			return total, nil
		}
	}
}

// Resume finishes, without their clients, the operations whose attempt
// crashed: no response saved and a lease that expired without being
// released (the process died, or hung past its lease, mid-operation). Each
// is taken over as a client's retry would take it (fenced: a stale attempt
// that wakes up cannot Save, and of several Resume calls, in this process
// or another, one gets each key) and op runs with the same Attempt a retry
// would get, the same ResourceID, and the request the first attempt was
// given (Request.Fingerprint's JSON). op saves and commits as in Handle; the
// client's retry, whenever it comes, is then a replay.
//
// This is what closes a crash between an external call and the commit of
// its effect (a card charged, no payment recorded) when the client never
// retries: op repeats the call under the same provider key, which answers
// with the first call's result, and records it. Keys older than maxAge are
// left alone: pass the provider's own key window, less a margin (Stripe
// keeps keys 24 h), since a call repeated after it would be a new one.
//
// A key whose attempt failed with an *Error marked OutcomeUnknown is
// resumed the same way, one lease after that failure, unless an attempt has
// finished it since. A key whose attempt failed cleanly (any other error:
// the call known to have done nothing, the lease released, its client told
// to retry) is the client's to retry, and is not resumed. An op that
// fails with an *Error releases the key as Handle does (resumed again one
// lease later only if OutcomeUnknown); one that fails otherwise keeps the
// lease until it expires, as a crash would: the next Resume tries again,
// and a client's retry meanwhile gets 409. Resume runs every key due when
// it reaches it, in the order they fell due, a hundred read at a time, and
// returns how many operations it finished; op runs with the deadline Handle
// gives it, and is not cancelled with ctx.
func (s *Store) Resume(ctx context.Context, maxAge time.Duration, op func(ctx context.Context, a *Attempt, request []byte) error) (int, error) {
	finished := 0
	for ctx.Err() == nil {
		keys, err := s.dueKeys(ctx, maxAge)
		if err != nil {
			return finished, err
		}
		n, err := s.resumeKeys(ctx, keys, op)
		finished += n
		if err != nil || len(keys) < resumeBatch {
			return finished, err
		}
	}
	return finished, nil
}

// resumeBatch is how many keys Resume reads at a time.
const resumeBatch = 100

type scopedKey struct{ Scope, Key string }

// dueKeys returns the keys due for Resume in the order they fell due: a
// crashed attempt's when its lease ran out, a failed one's at its
// resume_after. A key run and released again falls due a lease later, so
// older keys whose outcome stays unknown take their turn after the keys
// that fell due before them: they never keep a newer crash out of a round.
func (s *Store) dueKeys(ctx context.Context, maxAge time.Duration) ([]scopedKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT scope, key FROM idempotency_keys
		WHERE response_code IS NULL AND request IS NOT NULL AND created_at > now() - $2::interval
		  AND (locked_at <= now() - $1::interval OR locked_at IS NULL AND resume_after <= now())
		ORDER BY CASE WHEN locked_at IS NULL THEN resume_after ELSE locked_at + $1::interval END, created_at
		LIMIT $3`, s.cfg.LockTimeout, maxAge, resumeBatch)
	if err != nil {
		return nil, fmt.Errorf("httpidem: resume: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[scopedKey])
	if err != nil {
		return nil, fmt.Errorf("httpidem: resume: %w", err)
	}
	return keys, nil
}

// resumeKeys takes each of keys over, unless it has been finished, retried
// or resumed since dueKeys read it, and runs op for it.
func (s *Store) resumeKeys(ctx context.Context, keys []scopedKey, op func(ctx context.Context, a *Attempt, request []byte) error) (int, error) {
	finished := 0
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		token := uuid.New()
		var (
			resource *string
			attempts int
			request  []byte
		)
		err := s.pool.QueryRow(ctx, `UPDATE idempotency_keys
			SET lock_token = $3, locked_at = now(), attempts = attempts + 1
			WHERE scope = $1 AND key = $2 AND response_code IS NULL
			  AND (locked_at <= now() - $4::interval OR locked_at IS NULL AND resume_after <= now())
			RETURNING resource_id, attempts, request`,
			k.Scope, k.Key, token, s.cfg.LockTimeout).Scan(&resource, &attempts, &request)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // finished, retried or resumed elsewhere since the SELECT
		}
		if err != nil {
			return finished, fmt.Errorf("httpidem: resume: %w", err)
		}
		a := &Attempt{ResourceID: deref(resource), Number: attempts, scope: k.Scope, key: k.Key, token: token}
		s.count(ctx, "resumed")
		log := s.log.With("scope", k.Scope, "attempt", a.Number, "resource_id", a.ResourceID)
		log.Warn("idempotency: resuming an operation whose attempt crashed, without its client")
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LockTimeout*3/4)
		err = op(opCtx, a, request)
		cancel()
		switch {
		case err == nil && a.body == nil:
			log.Error("idempotency: resumed operation returned without saving a response; tried again after the lease")
		case err == nil:
			finished++
			log.Info("idempotency: resumed operation finished", "status", a.status)
		default:
			var e *Error
			if errors.As(err, &e) {
				// Released as Handle releases it: for the client's retry at
				// once, and resumed again only if the outcome is unknown.
				s.release(a, e.OutcomeUnknown)
				log.Warn("idempotency: resumed operation failed", "code", e.Code, "outcome_unknown", e.OutcomeUnknown, "error", e.Err)
				continue
			}
			log.Warn("idempotency: resumed operation failed; tried again after the lease", "error", err)
		}
	}
	return finished, nil
}

// RunResume runs Resume(maxAge, op) every LockTimeout until ctx ends; it
// returns nil then (a service.Task).
func (s *Store) RunResume(maxAge time.Duration, op func(ctx context.Context, a *Attempt, request []byte) error) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTicker(s.cfg.LockTimeout)
		defer t.Stop()
		for {
			if _, err := s.Resume(ctx, maxAge, op); err != nil && ctx.Err() == nil {
				s.log.Error("idempotency: resume failed", "error", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

// RunCleanup runs Cleanup every CleanupInterval until ctx ends; it returns
// nil then (a service.Task).
func (s *Store) RunCleanup(ctx context.Context) error {
	t := time.NewTicker(s.cfg.CleanupInterval)
	defer t.Stop()
	for {
		if n, err := s.Cleanup(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("idempotency key cleanup failed", "error", err)
		} else if n > 0 {
			s.log.Info("idempotency key cleanup", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Config]().PkgPath()
