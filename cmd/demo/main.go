// Command demo brings up the local stack's services and walks the design's
// story: u_17 pays ₹1,200 by UPI, the PaymentSucceeded event reaches
// Rewards three times (the relay's copy and two re-sends with the same
// event id, as a relay retry would produce), and exactly one ₹24 cashback,
// one wallet credit and one SMS come out. It prints a table of what
// happened, then keeps the stack up for exploring until Ctrl-C.
//
//	make demo                          (infrastructure, services, story, wait)
//	scripts/stack.sh with go run ./cmd/demo [-no-wait]
//
// It needs the infrastructure of scripts/stack.sh (PostgreSQL, fauxqs,
// stripe-mock; .stack/env) and starts the services itself (internal/stack).
// Databases are only read (read-only transactions). Exit status 1 if the
// story's numbers come out wrong.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/stack"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

// The story of docs/design.md ("The story").
const (
	userID        = "u_17"
	amountPaise   = 120000 // ₹1,200
	storyRateBP   = 200    // 2%, as migrations seed it
	resends       = 2
	paymentsQueue = "payments-events"
	rewardsQueue  = "rewards-events"
)

func main() {
	noWait := flag.Bool("no-wait", false, "exit after the table instead of keeping the stack up until Ctrl-C")
	timeout := flag.Duration("timeout", 90*time.Second, "how long each step of the story may take")
	flag.Parse()
	exitWithParent()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, *noWait, *timeout))
}

func say(format string, args ...any) { fmt.Printf("demo: "+format+"\n", args...) }

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "demo: error: "+format+"\n", args...)
	return 1
}

func run(ctx context.Context, noWait bool, timeout time.Duration) int {
	t0 := time.Now()
	root, err := stack.RepoRoot()
	if err != nil {
		return fail("%v", err)
	}
	env, err := stack.LoadEnv(root)
	if err != nil {
		return fail("%v\n  (make demo does this for you)", err)
	}
	say("infrastructure from .stack/env: PostgreSQL %s, SQS %s, stripe-mock %s",
		hostOf(env["PAYMENTS_DATABASE_URL"]), env["AWS_ENDPOINT_URL"], env["STRIPE_URL"])

	sq := sqsClient(env)
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	queueURL, _, err := sqstransport.EnsureQueue(qctx, sq, paymentsQueue, 5, 30*time.Second)
	if err == nil {
		_, _, err = sqstransport.EnsureQueue(qctx, sq, rewardsQueue, 5, 30*time.Second)
	}
	cancel()
	if err != nil {
		return fail("creating the queues: %v", err)
	}
	say("queues: %s, %s (each with a -dlq, maxReceiveCount 5)", paymentsQueue, rewardsQueue)

	say("building and starting smsprovider, payments, rewards, notifications (logs in .stack/logs/)")
	t1 := time.Now()
	l, err := stack.StartLocal(ctx, stack.Options{Root: root, Env: env})
	if err != nil {
		if ctx.Err() != nil {
			return fail("interrupted while starting")
		}
		return fail("%v", err)
	}
	defer func() {
		say("stopping the services")
		_ = l.Close()
	}()
	say("services up in %.1fs: payments %s, rewards %s, notifications %s, SMS provider %s",
		time.Since(t1).Seconds(), l.URL(stack.Payments), l.URL(stack.Rewards), l.URL(stack.Notifications), l.URL(stack.SMSProvider))

	d := &demo{l: l, env: env, sq: sq, queueURL: queueURL, timeout: timeout}
	res, err := d.story(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fail("interrupted")
		}
		return fail("%v", err)
	}
	fmt.Println()
	res.print(os.Stdout)
	fmt.Println()
	if problems := res.check(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "demo: WRONG:", p)
		}
		return fail("the story's numbers are wrong (see above and .stack/logs/*.log)")
	}
	say("story told in %.1fs; everything as designed: delivered %d times, applied once", time.Since(t0).Seconds(), res.delivered)
	if noWait {
		return 0
	}
	printTry(os.Stdout, l, res)
	<-ctx.Done()
	fmt.Println()
	return 0
}

type demo struct {
	l        *stack.Local
	env      map[string]string
	sq       *sqs.Client
	queueURL string
	timeout  time.Duration
}

// result is what the table shows.
type result struct {
	key                   string
	paymentID, status     string
	paymentAmount         int64
	eventID, cashbackID   uuid.UUID
	delivered, applied    int64
	duplicates            int64
	dedupeRows            int
	credits               int
	creditPaise, rateBP   int64
	rateInForce           int64 // bp, read just before the payment
	balanceBefore         int64
	balance, creditsSum   int64
	walletCredits         int
	smsRows               int
	smsStatus, smsBody    string
	providerDeliveries    int
	providerRequests      int
	providerKey           string
	providerDeliveredBody string
}

func (d *demo) story(ctx context.Context) (*result, error) {
	r := &result{key: fmt.Sprintf("demo-%d", time.Now().Unix())}
	payments, rewards, notifications, provider := d.l.URL(stack.Payments), d.l.URL(stack.Rewards),
		d.l.URL(stack.Notifications), d.l.URL(stack.SMSProvider)
	apiKeys = map[string]string{payments: d.l.APIKey(), rewards: d.l.Key("REWARDS_READ_KEY"),
		notifications: d.l.Key("NOTIFICATIONS_READ_KEY"), provider: d.l.Key("SMS_PROVIDER_READ_KEY")}

	var w wallet
	if _, err := getJSON(ctx, rewards+"/v1/wallets/"+userID+"?limit=1", &w); err != nil {
		return nil, err
	}
	r.balanceBefore = w.BalancePaise
	// The rate can have been changed by hand (README, "Trying it by
	// hand"), and the data outlives the stack: the cashback wanted is the
	// rate in force's, named in the table when it is not the story's.
	rate, err := rateInForce(ctx, rewards)
	if err != nil {
		return nil, err
	}
	r.rateInForce = rate

	// 1. The payment.
	var p payment
	body := fmt.Sprintf(`{"user_id":%q,"amount_paise":%d,"currency":"INR","method":"upi"}`, userID, amountPaise)
	code, err := doJSON(ctx, http.MethodPost, payments+"/v1/payments", map[string]string{"Idempotency-Key": r.key}, body, &p)
	if err != nil {
		return nil, err
	}
	if code != http.StatusCreated {
		return nil, fmt.Errorf("POST /v1/payments: %d, want 201", code)
	}
	say("POST /v1/payments (Idempotency-Key %s) → %d %s %s %s", r.key, code, p.ID, p.Status, inr(p.AmountPaise))
	r.paymentID = p.ID

	// 2. The relay publishes PaymentSucceeded; Rewards credits the cashback.
	t := time.Now()
	err = d.eventually(ctx, "the cashback credit of "+p.ID, func() (bool, error) {
		// Newest first: a new credit is on the first page.
		if _, err := getJSON(ctx, rewards+"/v1/wallets/"+userID, &w); err != nil {
			return false, err
		}
		return slices.ContainsFunc(w.Credits, func(c credit) bool { return c.PaymentID == p.ID }), nil
	})
	if err != nil {
		return nil, err
	}
	say("cashback credited %.1fs after the payment (relay → %s → rewards)", time.Since(t).Seconds(), paymentsQueue)

	// 3. Two more copies of the same event, as a relay that published but
	// crashed before marking the row would send: same body, same event_id.
	pdb, err := readOnly(ctx, d.env["PAYMENTS_DATABASE_URL"])
	if err != nil {
		return nil, err
	}
	defer pdb.Close(context.WithoutCancel(ctx))
	var (
		env     events.Envelope
		payload []byte
		headers map[string]string
	)
	env.EventType, env.AggregateID = contract.PaymentSucceeded, p.ID
	err = pdb.QueryRow(ctx, `SELECT id, aggregate_version, payload, headers, occurred_at FROM outbox
		WHERE aggregate_id = $1 AND event_type = $2`, p.ID, contract.PaymentSucceeded).
		Scan(&env.EventID, &env.AggregateVersion, &payload, &headers, &env.OccurredAt)
	if err != nil {
		return nil, fmt.Errorf("read the PaymentSucceeded outbox row of %s: %w", p.ID, err)
	}
	env.OccurredAt, env.Payload = env.OccurredAt.UTC(), payload
	r.eventID = env.EventID
	msg, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	attrs := map[string]types.MessageAttributeValue{
		"event_id":   {DataType: aws.String("String"), StringValue: aws.String(env.EventID.String())},
		"event_type": {DataType: aws.String("String"), StringValue: aws.String(env.EventType)},
	}
	if tp := headers["traceparent"]; tp != "" {
		attrs["traceparent"] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(tp)}
	}
	for range resends {
		if _, err := d.sq.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &d.queueURL, MessageBody: aws.String(string(msg)),
			MessageAttributes: attrs}); err != nil {
			return nil, fmt.Errorf("re-send to %s: %w", paymentsQueue, err)
		}
	}
	say("re-sent PaymentSucceeded %s to %s %d times (same body, same event_id)", env.EventID, paymentsQueue, resends)

	// 4. Wait until Rewards has handled all three copies of this event (its
	// own log lines, by event id: other payments made meanwhile, by a
	// curl in another shell say, do not count) and the queue is empty.
	rewardsLog := d.l.LogPath(stack.Rewards)
	err = d.eventually(ctx, "rewards to handle all 3 copies and "+paymentsQueue+" to drain", func() (bool, error) {
		if r.applied, r.duplicates, err = eventOutcomes(rewardsLog, env.EventID); err != nil {
			return false, err
		}
		if r.applied+r.duplicates < 1+resends {
			return false, nil
		}
		n, err := d.queueDepth(ctx)
		return n == 0, err
	})
	if err != nil {
		return nil, err
	}
	select { // anything late (a fourth copy?) would show up now
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	if r.applied, r.duplicates, err = eventOutcomes(rewardsLog, env.EventID); err != nil {
		return nil, err
	}
	r.delivered = r.applied + r.duplicates

	rdb, err := readOnly(ctx, d.env["REWARDS_DATABASE_URL"])
	if err != nil {
		return nil, err
	}
	defer rdb.Close(context.WithoutCancel(ctx))
	if err := rdb.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = 'rewards' AND message_id = $1`,
		env.EventID).Scan(&r.dedupeRows); err != nil {
		return nil, fmt.Errorf("read processed_messages: %w", err)
	}
	if err := rdb.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = $2 ORDER BY created_at LIMIT 1`,
		p.ID, contract.CashbackCredited).Scan(&r.cashbackID); err != nil {
		return nil, fmt.Errorf("read the CashbackCredited outbox row of %s: %w", p.ID, err)
	}

	// 5. The SMS for the CashbackCredited event.
	var ns notificationList
	err = d.eventually(ctx, "the SMS for CashbackCredited "+r.cashbackID.String()+" to be SENT", func() (bool, error) {
		if _, err := getJSON(ctx, notifications+"/v1/notifications?event_id="+r.cashbackID.String(), &ns); err != nil {
			return false, err
		}
		return len(ns.Notifications) > 0 && ns.Notifications[0].Status == "SENT", nil
	})
	if err != nil {
		return nil, err
	}
	r.smsRows = len(ns.Notifications)
	r.smsStatus, r.smsBody = ns.Notifications[0].Status, ns.Notifications[0].Body

	r.providerKey = "sms:" + r.cashbackID.String()
	var dl deliveries
	if _, err := getJSON(ctx, provider+"/v1/deliveries?idempotency_key_prefix="+url.QueryEscape(r.providerKey), &dl); err != nil {
		return nil, err
	}
	for _, x := range dl.Deliveries {
		if x.IdempotencyKey == r.providerKey {
			r.providerDeliveries++
			r.providerRequests += x.Requests
			r.providerDeliveredBody = x.Body
		}
	}

	// 6. The end state.
	if _, err := getJSON(ctx, payments+"/v1/payments/"+p.ID, &p); err != nil {
		return nil, err
	}
	r.status, r.paymentAmount = p.Status, p.AmountPaise
	all, balance, err := allCredits(ctx, rewards+"/v1/wallets/"+userID)
	if err != nil {
		return nil, err
	}
	r.balance, r.walletCredits = balance, len(all)
	for _, c := range all {
		if c.Status == "CREDITED" {
			r.creditsSum += c.AmountPaise
		}
		if c.PaymentID == p.ID && c.Status == "CREDITED" {
			r.credits++
			r.creditPaise, r.rateBP = c.AmountPaise, int64(c.RateBP)
		}
	}
	return r, nil
}

func (r *result) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, "  "+strings.Join(cells, "\t")) }
	row("", "THIS PAYMENT", "FROM")
	row("payment", fmt.Sprintf("%s %s %s (Idempotency-Key %s)", r.paymentID, r.status, inr(r.paymentAmount), r.key), "payments")
	row("PaymentSucceeded", fmt.Sprintf("event %s", r.eventID), "payments outbox")
	row("copies", fmt.Sprintf("delivered: %d, applied: %d (%d duplicates acked; %d dedupe row)", r.delivered, r.applied, r.duplicates, r.dedupeRows), "rewards")
	row("cashback credits", fmt.Sprintf("%d × %s (%s of %s)", r.credits, inr(r.creditPaise), pct(r.rateBP), inr(r.paymentAmount)), "rewards")
	row("wallet "+userID, fmt.Sprintf("this payment: +%s; total: %s (%s)", inr(r.balance-r.balanceBefore), inr(r.balance), plural(r.walletCredits, "credit")), "rewards")
	row("SMS sent", fmt.Sprintf("%d (%s, CashbackCredited %s)", r.smsRows, r.smsStatus, r.cashbackID), "notifications")
	row("SMS delivered", fmt.Sprintf("%d (key %s, %s)", r.providerDeliveries, r.providerKey, plural(r.providerRequests, "send request")), "SMS provider")
	tw.Flush()
	fmt.Fprintf(w, "\n  the SMS: %q\n", r.smsBody)
	if r.rateInForce != storyRateBP {
		fmt.Fprintf(w, "  the rate in force is %s, not the story's %s: a rate change made by hand outlives the stack\n"+
			"  (POST {\"rate_bp\":%d} to /v1/cashback-rates puts it back, `make clean` starts the data afresh)\n",
			pct(r.rateInForce), pct(storyRateBP), storyRateBP)
	}
}

// check lists what differs from the story.
func (r *result) check() []string {
	var bad []string
	want := func(ok bool, format string, args ...any) {
		if !ok {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	want(r.status == "SUCCEEDED", "payment status %s, want SUCCEEDED", r.status)
	want(r.delivered >= 1+resends, "rewards received %d copies, want %d", r.delivered, 1+resends)
	want(r.applied == 1, "rewards applied the event %d times, want 1", r.applied)
	want(r.dedupeRows == 1, "%d processed_messages rows for the event, want 1", r.dedupeRows)
	want(r.credits == 1, "%d cashback credits for %s, want 1", r.credits, r.paymentID)
	cashback, err := terms.Amount(amountPaise, int(r.rateInForce))
	want(err == nil, "the rate in force, %d bp, gives no cashback: %v", r.rateInForce, err)
	want(r.rateBP == r.rateInForce, "credited at %s, but %s was in force", pct(r.rateBP), pct(r.rateInForce))
	want(r.creditPaise == cashback, "cashback %s, want %s", inr(r.creditPaise), inr(cashback))
	want(r.balance == r.creditsSum, "wallet balance %s but its credits add up to %s", inr(r.balance), inr(r.creditsSum))
	want(r.balance-r.balanceBefore == cashback, "the wallet moved by %s during the story, want +%s", inr(r.balance-r.balanceBefore), inr(cashback))
	want(r.smsRows == 1 && r.smsStatus == "SENT", "%d notifications (%s) for the cashback event, want 1 SENT", r.smsRows, r.smsStatus)
	want(r.providerDeliveries == 1, "the SMS provider delivered %d messages under %s, want 1", r.providerDeliveries, r.providerKey)
	return bad
}

func printTry(w io.Writer, l *stack.Local, r *result) {
	p, rw, n, s := l.URL(stack.Payments), l.URL(stack.Rewards), l.URL(stack.Notifications), l.URL(stack.SMSProvider)
	key := fmt.Sprintf("try-%d", time.Now().Unix())
	body := fmt.Sprintf(`{"user_id":%q,"amount_paise":50000,"currency":"INR","method":"upi"}`, userID)
	other := fmt.Sprintf(`{"user_id":%q,"amount_paise":60000,"currency":"INR","method":"upi"}`, userID)
	post := func(path, key, body string) string {
		s := fmt.Sprintf(`curl -si -X POST %s%s -H "Authorization: Bearer $PAYMENTS_API_KEY" -H 'Idempotency-Key: %s'`, p, path, key)
		if body != "" {
			s += " -H 'Content-Type: application/json' -d '" + body + "'"
		}
		return s
	}
	fmt.Fprintf(w, `The stack stays up for exploring; Ctrl-C stops everything this run started.
In another shell, first: . .stack/env   (the endpoints, and a dev key per service and role:
PAYMENTS_API_KEY; REWARDS_READ_KEY, REWARDS_ADMIN_KEY; NOTIFICATIONS_READ_KEY; SMS_PROVIDER_READ_KEY)

  # a payment of ₹500 (201; ₹10 cashback and an SMS follow)
  %s
  # the same key and body again: the saved response replayed, no second charge
  %s
  # the same key with another body: 422
  %s
  # refund the demo's payment: PaymentRefunded → the cashback is reversed, an SMS says so
  %s
  # u_17's wallet, the SMS of the demo's cashback, what the provider delivered
  curl -s %s/v1/wallets/%s -H "Authorization: Bearer $REWARDS_READ_KEY"
  curl -s '%s/v1/notifications?event_id=%s' -H "Authorization: Bearer $NOTIFICATIONS_READ_KEY"
  curl -s %s/v1/deliveries -H "Authorization: Bearer $SMS_PROVIDER_READ_KEY"
  # the dedupe at work
  curl -s %s/metrics | grep -E '^(idempotent_messages_total|rewards_events_total|sqs_messages_received_total)'

  logs (JSON): .stack/logs/{payments,rewards,notifications,smsprovider}.log; endpoints: .stack/env

`, post("/v1/payments", key, body), post("/v1/payments", key, body), post("/v1/payments", key, other),
		post("/v1/payments/"+r.paymentID+"/refund", "refund-"+r.paymentID, ""),
		rw, userID, n, r.cashbackID, s, rw)
}

// ---------------------------------------------------------------------------
// helpers

// Log lines of rewards' processor (cashback.Processor): one per copy of
// an event it handled.
const (
	logApplied   = "payment event applied"
	logDuplicate = "duplicate copy acked: already applied"
)

// eventOutcomes counts, in the rewards log at path, the copies of event
// that were applied and those acked as duplicates: this event's own lines,
// whatever else the service handled meanwhile.
func eventOutcomes(path string, event uuid.UUID) (applied, duplicates int64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	id := event.String()
	for _, line := range bytes.Split(b, []byte("\n")) {
		if !bytes.Contains(line, []byte(id)) {
			continue
		}
		var rec struct {
			Msg     string `json:"msg"`
			EventID string `json:"event_id"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.EventID != id {
			continue
		}
		switch rec.Msg {
		case logApplied:
			applied++
		case logDuplicate:
			duplicates++
		}
	}
	return applied, duplicates, nil
}

// allCredits reads every page of a wallet (GET url, next_before) and
// returns the credits and the balance.
// rateInForce is the cashback rate (bp) in force now, by this clock, from
// rewards' rate history.
func rateInForce(ctx context.Context, rewards string) (int64, error) {
	var list struct {
		Rates []struct {
			EffectiveFrom time.Time `json:"effective_from"`
			RateBP        int64     `json:"rate_bp"`
		} `json:"rates"`
	}
	if _, err := getJSON(ctx, rewards+"/v1/cashback-rates", &list); err != nil {
		return 0, err
	}
	var at time.Time
	bp := int64(-1)
	for _, x := range list.Rates {
		if !x.EffectiveFrom.After(time.Now()) && (bp < 0 || x.EffectiveFrom.After(at)) {
			at, bp = x.EffectiveFrom, x.RateBP
		}
	}
	if bp < 0 {
		return 0, errors.New("rewards has no cashback rate in force")
	}
	return bp, nil
}

func allCredits(ctx context.Context, url string) ([]credit, int64, error) {
	var all []credit
	var balance int64
	for before := int64(0); ; {
		u := url + "?limit=1000"
		if before > 0 {
			u += "&before=" + strconv.FormatInt(before, 10)
		}
		var w wallet
		if _, err := getJSON(ctx, u, &w); err != nil {
			return nil, 0, err
		}
		if before == 0 {
			balance = w.BalancePaise
		}
		all = append(all, w.Credits...)
		if w.NextBefore == 0 {
			return all, balance, nil
		}
		before = w.NextBefore
	}
}

func (d *demo) queueDepth(ctx context.Context) (int, error) {
	out, err := d.sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &d.queueURL,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, fmt.Errorf("%s attributes: %w", paymentsQueue, err)
	}
	visible, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inFlight, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible + inFlight, nil
}

// eventually polls cond until it is true, for up to d.timeout.
func (d *demo) eventually(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(d.timeout)
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("waited %v for %s: %w", d.timeout, what, last)
			}
			return fmt.Errorf("waited %v for %s; see .stack/logs/*.log", d.timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func sqsClient(env map[string]string) *sqs.Client {
	region := env["AWS_REGION"]
	if region == "" {
		region = sqstransport.DefaultRegion
	}
	id, secret := env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
	if id == "" {
		id, secret = "test", "test"
	}
	endpoint := env["AWS_ENDPOINT_URL_SQS"]
	if endpoint == "" {
		endpoint = env["AWS_ENDPOINT_URL"]
	}
	return sqs.New(sqs.Options{Region: region, BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(id, secret, ""), HTTPClient: sqstransport.NewHTTPClient()})
}

// readOnly connects with every transaction read-only: the demo looks, never
// touches.
func readOnly(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Database, err)
	}
	return conn, nil
}

func hostOf(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Host != "" {
		return u.Host
	}
	return "?"
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func getJSON(ctx context.Context, u string, out any) (int, error) {
	code, err := doJSON(ctx, http.MethodGet, u, nil, "", out)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s: %d", u, code)
	}
	return code, err
}

// apiKeys are the dev keys the story sends, by service base URL: the
// payments client's, and the readers' of rewards, notifications and the
// SMS provider.
var apiKeys map[string]string

func doJSON(ctx context.Context, method, u string, headers map[string]string, body string, out any) (int, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for base, key := range apiKeys {
		if key != "" && strings.HasPrefix(u, base+"/") {
			req.Header.Set("Authorization", "Bearer "+key)
		}
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode < 300 && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %w: %s", method, u, err, bytes.TrimSpace(b))
		}
	} else if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, bytes.TrimSpace(b))
	}
	return resp.StatusCode, nil
}

// inr formats paise as rupees with Indian digit grouping: ₹1,20,000.00.
func inr(paise int64) string {
	sign := ""
	if paise < 0 {
		sign, paise = "-", -paise
	}
	rupees := strconv.FormatInt(paise/100, 10)
	if len(rupees) > 3 {
		head, tail := rupees[:len(rupees)-3], rupees[len(rupees)-3:]
		var groups []string
		for len(head) > 2 {
			groups = append([]string{head[len(head)-2:]}, groups...)
			head = head[:len(head)-2]
		}
		groups = append([]string{head}, groups...)
		rupees = strings.Join(groups, ",") + "," + tail
	}
	return fmt.Sprintf("%s₹%s.%02d", sign, rupees, paise%100)
}

func pct(bp int64) string { return fmt.Sprintf("%d.%02d%%", bp/100, bp%100) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// JSON shapes of the services' answers (the fields the demo reads).
type payment struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	AmountPaise int64  `json:"amount_paise"`
}

type wallet struct {
	BalancePaise int64    `json:"balance_paise"`
	Credits      []credit `json:"credits"`
	NextBefore   int64    `json:"next_before"`
}

type credit struct {
	PaymentID   string `json:"payment_id"`
	AmountPaise int64  `json:"amount_paise"`
	RateBP      int    `json:"rate_bp"`
	Status      string `json:"status"`
}

type notificationList struct {
	Notifications []struct {
		Status string `json:"status"`
		Body   string `json:"body"`
	} `json:"notifications"`
}

type deliveries struct {
	Deliveries []struct {
		IdempotencyKey string `json:"idempotency_key"`
		Body           string `json:"body"`
		Requests       int    `json:"requests"`
	} `json:"deliveries"`
}
