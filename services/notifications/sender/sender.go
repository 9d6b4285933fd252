// Package sender drives notifications rows through
// PENDING → SENDING → SENT (or FAILED), calling the SMS provider with the
// row's idempotency key (sms:<event_id>).
//
// The loop (Run) keeps up to Concurrency provider calls in flight:
//
//  1. Claim: one autocommitted UPDATE moves as many due PENDING rows as
//     there are free call slots to SENDING (FOR UPDATE SKIP LOCKED, so
//     replicas never wait on each other), stamping each with a fresh
//     claim_id and sending_since: the lease. The SENDING state is durable
//     BEFORE the provider is called. A slot is freed as soon as its call
//     is recorded, and the next claim refills it: one slow call holds one
//     slot, never the others.
//  2. Send: each claimed row is sent with its idempotency key, bounded by
//     SendTimeout (the provider hanging costs one timeout, never the loop).
//     failpoint.HitFor(InSending, recipient) runs right after the call returns,
//     before anything is recorded: the crash window the reconciler covers.
//  3. Record, fenced by claim_id (a sender that lost its lease changes
//     nothing): accepted → SENT with the provider's message id; rejected →
//     FAILED; retryable → PENDING with next_attempt_at backed off, or
//     FAILED once MaxAttempts calls have been made; unknown outcome
//     (timeout, connection lost) → resolved as below, at once. A failure
//     that a probe of the provider confirms as its outage (Config.Gate)
//     pauses the claims until the provider answers, and a message known
//     not to be accepted goes back to PENDING with the attempt not
//     counted, so an outage never uses up MaxAttempts. The SENT
//     marks of calls that finish together are written by one statement
//     (a group commit: while one mark is being written, the next ones
//     queue and go in the following statement), each still fenced by its
//     own claim_id: a row taken over meanwhile is left as its new owner
//     has it.
//
// Reconcile: a row still SENDING after Lease belongs to a sender that died
// between steps 1 and 3. The reconciler takes over its lease and resolves
// the unknown outcome:
//
//   - the provider can look messages up by key (sms.Looker): found → SENT
//     with that message id, no second send; not found → PENDING, resent
//     with the same key; lookup failed → left SENDING for the next lease;
//   - it cannot: the row's kind decides (Policies, explicit per kind):
//     PolicyResend → PENDING, resent with the same key (a provider that
//     honours keys delivers once; one that does not may deliver twice);
//     PolicySkip → FAILED, reason "unknown outcome" (maybe never delivered,
//     never delivered twice).
//
// Lease must exceed SendTimeout (New enforces twice as much), so a live
// sender always finishes or times out before a reconciler can take its row.
package sender

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/retry"
	"github.com/effectively-once/payments-cashback/pkg/worker"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// Policy says what to do with a message whose send outcome is unknown when
// the provider cannot be asked.
type Policy string

const (
	// PolicyResend sends it again with the same idempotency key.
	PolicyResend Policy = "resend"
	// PolicySkip gives up: FAILED with reason "unknown outcome".
	PolicySkip Policy = "skip"
)

// ParsePolicy accepts "resend" and "skip".
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyResend, PolicySkip:
		return p, nil
	}
	return "", fmt.Errorf("sending policy %q: want resend or skip", s)
}

// ReasonUnknownOutcome is the failure_reason of a row skipped by PolicySkip.
const ReasonUnknownOutcome = "unknown outcome"

// Config tunes a Sender. Zero values take the defaults in brackets.
type Config struct {
	// Concurrency is how many provider calls are in flight at once, and
	// the most rows one claim takes [16].
	Concurrency int
	// PollInterval is the pause when there is nothing due [250ms].
	PollInterval time.Duration
	// SendTimeout bounds one provider call (and one lookup, and one
	// claim) [10s].
	SendTimeout time.Duration
	// Lease is how long a row may stay SENDING before the reconciler treats
	// its sender as dead [60s]; at least 2×SendTimeout.
	Lease time.Duration
	// MaxAttempts is how many provider calls a message gets before it is
	// FAILED [8].
	MaxAttempts int
	// RetryBase and RetryMax bound the backoff after a failed call [1s, 5m]:
	// next_attempt_at = now + min(RetryMax, RetryBase·2^(attempts-1)), ±25 %.
	RetryBase, RetryMax time.Duration
	// Policies is the unknown-outcome policy per message kind, used when the
	// provider has no Lookup; kinds not listed get DefaultPolicy [resend].
	Policies      map[string]Policy
	DefaultPolicy Policy
	// Wake, when set, ends the sender's sleep at once: notified when new
	// rows are committed (idempotent.ProcessorConfig.Committed), so a
	// notification does not wait for PollInterval.
	Wake *worker.Signal
	// Gate, when set, holds the sender back while the provider is down
	// (an outage.Gate probing it, e.g. with sms.Pinger's Ping). A call
	// that failed for want of the provider (unreachable, 5xx, 429) is
	// confirmed by a probe; if the probe fails too, Run claims nothing more
	// until a probe succeeds, and a message the provider is known not to
	// have accepted goes back to PENDING, due at once, with that attempt
	// not counted. Without a gate, an outage longer than the retry
	// schedule (MaxAttempts calls) fails its messages for good.
	Gate   *outage.Gate
	Logger *slog.Logger
}

// ConcurrencyDefault is Config.Concurrency's default: enough calls in
// flight that a provider answering in a few milliseconds is not what
// bounds the drain, and no more than the HTTP client keeps idle
// connections for (sms.NewHTTPProvider), so calls reuse connections.
const ConcurrencyDefault = 16

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = ConcurrencyDefault
	}
	def(&c.PollInterval, 250*time.Millisecond)
	def(&c.SendTimeout, 10*time.Second)
	def(&c.Lease, 60*time.Second)
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 8
	}
	def(&c.RetryBase, retry.BaseDefault)
	def(&c.RetryMax, retry.MaxDefault)
	if c.DefaultPolicy == "" {
		c.DefaultPolicy = PolicyResend
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Sender sends the notifications of one database.
type Sender struct {
	pool     *pgxpool.Pool
	provider sms.Provider
	looker   sms.Looker // nil: the provider cannot look messages up
	cfg      Config
	log      *slog.Logger

	outcomes, calls, reconciled metric.Int64Counter

	marks markQueue // SENT marks waiting for the next group statement
}

// New returns a Sender calling provider. If provider also implements
// sms.Looker, unknown outcomes are resolved by lookup; otherwise by policy.
func New(pool *pgxpool.Pool, provider sms.Provider, cfg Config) (*Sender, error) {
	cfg.defaults()
	if cfg.Lease < 2*cfg.SendTimeout {
		return nil, fmt.Errorf("sender: lease %v must be at least twice the send timeout %v", cfg.Lease, cfg.SendTimeout)
	}
	for kind, p := range cfg.Policies {
		if _, err := ParsePolicy(string(p)); err != nil {
			return nil, fmt.Errorf("sender: kind %s: %w", kind, err)
		}
	}
	s := &Sender{pool: pool, provider: provider, cfg: cfg, log: cfg.Logger}
	s.looker, _ = provider.(sms.Looker)
	m := otel.Meter(meterName)
	var err error
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&s.outcomes, "notifications_transitions_total", "Notification state changes made by the sender, by new status and reason."},
		{&s.calls, "notifications_provider_calls_total", "Provider send calls, by result (accepted, rejected, retryable, unknown)."},
		{&s.reconciled, "notifications_reconciled_total", "SENDING rows with an unknown outcome resolved, by how (lookup_found, lookup_missing, lookup_failed, resend, skip)."},
	} {
		if *c.dst, err = m.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// CanLookup reports whether unknown outcomes are resolved by lookup.
func (s *Sender) CanLookup() bool { return s.looker != nil }

// PolicyFor is the unknown-outcome policy of a message kind.
func (s *Sender) PolicyFor(kind string) Policy {
	if p, ok := s.cfg.Policies[kind]; ok {
		return p
	}
	return s.cfg.DefaultPolicy
}

// Run sends and reconciles until ctx is cancelled. Calls in flight when
// ctx ends are finished (each is bounded by SendTimeout) and recorded, and
// so are those of a claim ctx ended during (the claim is not cancelled
// with ctx, and bounded by SendTimeout too), so a clean shutdown leaves no
// row SENDING. It returns nil on cancellation.
// Its loop is a pkg/worker loop named "sms-sender": each pass waits for a
// free call slot, claims as many rows as there are free slots and starts
// their calls without waiting for them; a pass that filled every free slot
// is followed at once by the next, otherwise the loop sleeps until Wake or
// PollInterval. Rows past their lease are looked for every PollInterval
// (at most Lease/4 apart), not on every pass.
func (s *Sender) Run(ctx context.Context) error {
	slots := worker.NewSlots(s.cfg.Concurrency) // one per call in flight
	var calls sync.WaitGroup
	defer calls.Wait() // the rows are ours: their calls finish and are recorded
	wctx := context.WithoutCancel(ctx)
	// A busy loop makes a pass per group of finished calls; looking for
	// stale leases on each would cost a statement per pass for rows that
	// can only appear once per Lease. Often enough: every PollInterval, at
	// most a quarter of the Lease apart.
	reconcileEvery := min(s.cfg.PollInterval, s.cfg.Lease/4)
	var reconciled time.Time
	return worker.Run(ctx, worker.Config{Name: "sms-sender", PollInterval: s.cfg.PollInterval, Wake: s.cfg.Wake, Logger: s.log},
		func(ctx context.Context, _ int) (int, bool, error) {
			if time.Since(reconciled) >= reconcileEvery {
				reconciled = time.Now()
				if _, err := s.ReconcileOnce(ctx); err != nil && ctx.Err() == nil {
					s.log.ErrorContext(ctx, "notifications reconcile failed", "error", err)
				}
			}
			// Nothing is claimed while the provider is down: the rows wait
			// in PENDING, their attempts unspent.
			if s.cfg.Gate.Wait(ctx) != nil {
				return 0, false, nil // ctx ended
			}
			// Wait for one free slot, then take every other free one.
			free := slots.Take(ctx, s.cfg.Concurrency)
			if free == 0 {
				return 0, false, nil
			}
			// The claimed rows are sent even if ctx ended during the claim
			// (claim: its UPDATE outlives ctx), and awaited by calls.Wait.
			claimed, err := s.claim(ctx, free)
			if ctx.Err() != nil {
				err = nil // shutting down: not a failed pass
			}
			slots.Release(free - len(claimed))
			for _, r := range claimed {
				calls.Go(func() {
					defer slots.Release(1)
					s.send(wctx, r)
				})
			}
			return len(claimed), err == nil && len(claimed) == free, err
		})
}

// row is a claimed notification.
type row struct {
	ID        int64
	EventID   uuid.UUID
	Kind      string
	Recipient string
	Body      string
	Key       string
	Attempts  int
	ClaimID   uuid.UUID
	// Traceparent continues the trace that recorded the intent.
	Traceparent *string
}

// InSending is the failpoint between the provider's answer and the SENT
// mark: the row is SENDING and the provider has the message
// (FAILPOINTS=in-sending kills the process there; in-sending=<recipient>
// only on that recipient's SMS).
const InSending = "in-sending"

// meterName names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var meterName = reflect.TypeFor[Sender]().PkgPath()

const returning = `RETURNING id, event_id, kind, recipient, body, idempotency_key, attempts, claim_id, traceparent`

// SendOnce claims up to Concurrency due PENDING rows, sends them, records
// the outcomes and returns how many it claimed. Run does the same with
// its call slots refilled as calls finish. Once claimed, rows are sent and
// recorded even if ctx ends meanwhile; if ctx has ended before, nothing is
// claimed.
func (s *Sender) SendOnce(ctx context.Context) (int, error) {
	claimed, err := s.claim(ctx, s.cfg.Concurrency)
	if err != nil {
		return 0, err
	}
	s.each(ctx, claimed, s.send)
	return len(claimed), nil
}

// claim moves up to limit due PENDING rows to SENDING under fresh claims,
// and claims nothing once ctx has ended. The UPDATE itself does not end
// with ctx: a cancel that reaches the server too late to stop it (the
// statement done, its commit under way) would leave the rows committed
// SENDING while claim reports an error, and nobody would send them. It is
// bounded by SendTimeout instead, so a shutdown waits for it as it waits
// for a call, and the caller sends whatever it returns, ctx ended or not
// (a claim and its call then take at most 2×SendTimeout, within the Lease).
// (A claim still running after SendTimeout is given up; should it commit
// even so, its rows are the reconciler's after the lease, as after a crash.)
// A row waits while an older version of its payment is still PENDING or
// SENDING (rule 5): the reversal's SMS is not sent before the credit's,
// even when the credit's is backing off or in another sender's hands. A
// SENT or FAILED row never reopens, so a claim that saw the older row
// open cannot race past it.
func (s *Sender) claim(ctx context.Context, limit int) ([]row, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sender: claim: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.SendTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `
		UPDATE notifications SET status = 'SENDING', attempts = attempts + 1,
		       claim_id = gen_random_uuid(), sending_since = now(), updated_at = now()
		WHERE id IN (
			SELECT id FROM notifications n
			WHERE status = 'PENDING' AND next_attempt_at <= now()
			  AND NOT EXISTS (
				SELECT 1 FROM notifications older
				WHERE older.aggregate_id = n.aggregate_id AND older.aggregate_version < n.aggregate_version
				  AND older.status IN ('PENDING', 'SENDING'))
			ORDER BY next_attempt_at, id
			LIMIT $1
			FOR UPDATE SKIP LOCKED)
		`+returning, limit)
	if err != nil {
		return nil, fmt.Errorf("sender: claim: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, fmt.Errorf("sender: claim: %w", err)
	}
	return claimed, nil
}

// each runs f for every row concurrently and waits. The rows are ours
// (SENDING, leased), so their work finishes even if ctx is cancelled.
func (s *Sender) each(ctx context.Context, rs []row, f func(context.Context, row)) {
	wctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { f(wctx, r) })
	}
	wg.Wait()
}

// send makes one provider call for a claimed row and records its outcome.
func (s *Sender) send(ctx context.Context, r row) {
	if r.Traceparent != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": *r.Traceparent})
	}
	ctx, span := otel.Tracer(meterName).Start(ctx, "sms send", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int64("notification_id", r.ID), attribute.String("event_id", r.EventID.String()),
			attribute.String("idempotency_key", r.Key), attribute.Int("attempt", r.Attempts)))
	defer span.End()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
	receipt, err := s.provider.Send(cctx, sms.Message{IdempotencyKey: r.Key, To: r.Recipient, Body: r.Body})
	cancel()
	if err != nil {
		span.RecordError(err)
	}
	if failpoint.HitFor(InSending, r.Recipient) {
		// Armed in-process: behave like a crash here, recording nothing.
		// The row stays SENDING until the reconciler's lease check.
		return
	}
	log := s.log.With("notification_id", r.ID, "event_id", r.EventID, "idempotency_key", r.Key, "attempt", r.Attempts,
		"to", contract.MaskPhone(r.Recipient))
	if err == nil {
		s.calls.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "accepted")))
		s.markSent(ctx, r, receipt.MessageID, log)
		return
	}
	class := sms.Classify(err)
	s.calls.Add(ctx, 1, metric.WithAttributes(attribute.String("result", class.String())))
	// An outage, confirmed by the gate's probe, closes the gate. A message
	// known not to be accepted then waits for the provider without its
	// attempt counted; one whose outcome is unknown is resolved as ever
	// (looked up, or by its kind's policy), since it may have been sent.
	if class == sms.Retryable && errors.Is(err, sms.ErrCredential) {
		// The key, not the message: counting the call would turn every
		// message FAILED while an operator fixes the key.
		log.ErrorContext(ctx, "provider refused this service's credential: check SMS_PROVIDER_API_KEY; the message waits, this call not counted as an attempt",
			"error", err, "retry_in", s.cfg.RetryMax)
		s.uncounted(ctx, r, s.cfg.RetryMax, "credential_refused", err.Error(), log)
		return
	}
	down := class != sms.Rejected && s.cfg.Gate.Suspect(ctx, err)
	if down && class == sms.Retryable {
		log.WarnContext(ctx, "provider unreachable: the message waits for it, this call not counted as an attempt", "error", err)
		s.uncounted(ctx, r, 0, "provider_unreachable", err.Error(), log)
		return
	}
	switch class {
	case sms.Rejected:
		log.ErrorContext(ctx, "provider rejected the message: FAILED", "error", err)
		s.markFailed(ctx, r, "rejected by provider: "+err.Error(), log)
	case sms.Retryable:
		log.WarnContext(ctx, "provider call failed: retrying later with the same key", "error", err)
		s.retryLater(ctx, r, err.Error(), log)
	default:
		log.WarnContext(ctx, "provider call outcome unknown: reconciling", "error", err)
		s.resolveUnknown(ctx, r, err.Error(), log)
	}
}

// ReconcileOnce takes over rows left SENDING longer than Lease (their
// sender died mid-call) and resolves each one's unknown outcome. It
// returns how many it took over.
func (s *Sender) ReconcileOnce(ctx context.Context) (int, error) {
	rows, err := s.pool.Query(ctx, `
		UPDATE notifications SET claim_id = gen_random_uuid(), sending_since = now(), updated_at = now()
		WHERE id IN (
			SELECT id FROM notifications
			WHERE status = 'SENDING' AND sending_since < now() - $1::interval
			ORDER BY sending_since
			LIMIT $2
			FOR UPDATE SKIP LOCKED)
		`+returning, s.cfg.Lease, s.cfg.Concurrency)
	if err != nil {
		return 0, fmt.Errorf("sender: reconcile claim: %w", err)
	}
	stuck, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return 0, fmt.Errorf("sender: reconcile claim: %w", err)
	}
	s.each(ctx, stuck, func(ctx context.Context, r row) {
		log := s.log.With("notification_id", r.ID, "event_id", r.EventID, "idempotency_key", r.Key, "attempt", r.Attempts,
			"to", contract.MaskPhone(r.Recipient))
		log.WarnContext(ctx, "notification found SENDING past its lease (sender crashed mid-call): reconciling")
		s.resolveUnknown(ctx, r, "found SENDING after a crash", log)
	})
	return len(stuck), nil
}

// resolveUnknown decides a leased row whose last call may or may not have
// been accepted: by lookup where the provider can, else by the kind's policy.
func (s *Sender) resolveUnknown(ctx context.Context, r row, why string, log *slog.Logger) {
	if s.looker != nil {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
		receipt, found, err := s.looker.Lookup(lctx, r.Key)
		cancel()
		switch {
		case err != nil:
			// Still unknown. The row stays SENDING under our lease; once the
			// lease runs out the reconciler asks again.
			s.reconciled.Add(ctx, 1, metric.WithAttributes(attribute.String("how", "lookup_failed")))
			log.WarnContext(ctx, "provider lookup failed: row left SENDING until its lease expires", "error", err, "lease", s.cfg.Lease)
		case found:
			s.reconciled.Add(ctx, 1, metric.WithAttributes(attribute.String("how", "lookup_found")))
			log.InfoContext(ctx, "provider had accepted it: SENT without sending again", "provider_message_id", receipt.MessageID)
			s.markSent(ctx, r, receipt.MessageID, log)
		default:
			s.reconciled.Add(ctx, 1, metric.WithAttributes(attribute.String("how", "lookup_missing")))
			log.InfoContext(ctx, "provider never accepted it: resending with the same key")
			s.retryLater(ctx, r, why+"; provider has no message under the key", log)
		}
		return
	}
	switch p := s.PolicyFor(r.Kind); p {
	case PolicySkip:
		s.reconciled.Add(ctx, 1, metric.WithAttributes(attribute.String("how", "skip")))
		log.ErrorContext(ctx, "outcome unknown and the provider cannot be asked; policy skip: FAILED", "kind", r.Kind)
		s.markFailed(ctx, r, ReasonUnknownOutcome, log)
	default:
		s.reconciled.Add(ctx, 1, metric.WithAttributes(attribute.String("how", "resend")))
		log.WarnContext(ctx, "outcome unknown and the provider cannot be asked; policy resend: sending again with the same key", "kind", r.Kind)
		s.retryLater(ctx, r, why+"; resent by policy", log)
	}
}

// errLostLease: the row is no longer ours (another sender took it over).
var errLostLease = errors.New("lease lost: the row was taken over, outcome not recorded by this sender")

// fenced runs an UPDATE that only applies while r is still SENDING under
// r's claim.
func (s *Sender) fenced(ctx context.Context, r row, set string, args ...any) error {
	args = append([]any{r.ID, r.ClaimID}, args...)
	tag, err := s.pool.Exec(ctx, `UPDATE notifications SET `+set+`, claim_id = NULL, sending_since = NULL, updated_at = now()
		WHERE id = $1 AND status = 'SENDING' AND claim_id = $2`, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLostLease
	}
	return nil
}

func (s *Sender) transition(ctx context.Context, status, reason string) {
	s.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("status", status), attribute.String("reason", reason)))
}

func (s *Sender) markSent(ctx context.Context, r row, messageID string, log *slog.Logger) {
	if err := s.marks.mark(ctx, s.pool, r, messageID); err != nil {
		// Not recorded: the row stays SENDING and is reconciled (looked up,
		// or resent with the same key), never lost.
		log.ErrorContext(ctx, "could not mark SENT", "error", err, "provider_message_id", messageID)
		return
	}
	s.transition(ctx, "SENT", "accepted")
	log.InfoContext(ctx, "notification SENT", "provider_message_id", messageID)
}

func (s *Sender) markFailed(ctx context.Context, r row, reason string, log *slog.Logger) {
	if err := s.fenced(ctx, r, `status = 'FAILED', failure_reason = $3, last_error = coalesce(last_error, $3)`, reason); err != nil {
		log.ErrorContext(ctx, "could not mark FAILED", "error", err)
		return
	}
	s.transition(ctx, "FAILED", reason)
}

// uncounted puts r back to PENDING, due after wait, and takes back the
// attempt its claim counted: the call was refused for something other than
// the message (the provider down: wait 0, the gate decides when it is
// claimed again; this service's credential refused: RetryMax). reason is
// the transition's metric label.
func (s *Sender) uncounted(ctx context.Context, r row, wait time.Duration, reason, lastErr string, log *slog.Logger) {
	if err := s.fenced(ctx, r, `status = 'PENDING', attempts = attempts - 1, next_attempt_at = now() + $3::interval, last_error = $4`,
		wait, lastErr); err != nil {
		log.ErrorContext(ctx, "could not put back to PENDING", "error", err)
		return
	}
	s.transition(ctx, "PENDING", reason)
}

// retryLater puts r back to PENDING with a backoff, or FAILED when it has
// had MaxAttempts calls.
func (s *Sender) retryLater(ctx context.Context, r row, lastErr string, log *slog.Logger) {
	if r.Attempts >= s.cfg.MaxAttempts {
		reason := fmt.Sprintf("gave up after %d attempts", r.Attempts)
		log.ErrorContext(ctx, "notification FAILED: attempts exhausted", "last_error", lastErr)
		if err := s.fenced(ctx, r, `status = 'FAILED', failure_reason = $3, last_error = $4`, reason, lastErr); err != nil {
			log.ErrorContext(ctx, "could not mark FAILED", "error", err)
			return
		}
		s.transition(ctx, "FAILED", "attempts_exhausted")
		return
	}
	delay := retry.Policy{Base: s.cfg.RetryBase, Max: s.cfg.RetryMax, Jitter: retry.JitterDefault}.Delay(r.Attempts)
	if err := s.fenced(ctx, r, `status = 'PENDING', next_attempt_at = now() + $3::interval, last_error = $4`, delay, lastErr); err != nil {
		log.ErrorContext(ctx, "could not reschedule", "error", err)
		return
	}
	s.transition(ctx, "PENDING", "retry")
	log.InfoContext(ctx, "notification rescheduled", "retry_in", delay)
}
