package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/stack"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// ---------------------------------------------------------------------------
// waiting

// eventually polls cond until it reports true, failing the test with cond's
// last explanation once timeout has passed. Correctness never rests on a
// sleep: every wait in the suite is for an observable state.
func eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	delay := 20 * time.Millisecond
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not so after %v: %s", timeout, why)
		}
		time.Sleep(delay)
		delay = min(delay*2, 250*time.Millisecond)
	}
}

func bg() context.Context { return context.Background() }

// ---------------------------------------------------------------------------
// ids

// id returns a name unique to this run: "<prefix>_<run>_<64 random bits>".
func id(prefix string) string { return prefix + "_" + s.run + "_" + randomHex(8) }

// oldEventID is a UUIDv7 whose embedded time is at: what a producer would
// have assigned then.
func oldEventID(at time.Time) uuid.UUID {
	u := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[0:6], ms[2:8]) // the first 48 bits are the unix time in ms
	return u
}

// ---------------------------------------------------------------------------
// HTTP

var client = &http.Client{Timeout: 30 * time.Second}

// do sends a JSON request and returns the status, headers and body.
func do(t testing.TB, method, url string, headers map[string]string, body any) (int, http.Header, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	authorize(req)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, b
}

// authorize adds the stack's dev key for the service and role a request
// needs: the payments client; rewards' and the SMS provider's operator for
// a POST (rate changes, fault injection), their reader otherwise; the
// notifications reader.
func authorize(req *http.Request) {
	u, post := req.URL.String(), req.Method == http.MethodPost
	key := ""
	switch {
	case strings.HasPrefix(u, s.paymentsURL):
		key = s.apiKey
	case strings.HasPrefix(u, s.rewardsURL) && post:
		key = s.keys["REWARDS_ADMIN_KEY"]
	case strings.HasPrefix(u, s.rewardsURL):
		key = s.keys["REWARDS_READ_KEY"]
	case strings.HasPrefix(u, s.notificationsURL):
		key = s.keys["NOTIFICATIONS_READ_KEY"]
	case strings.HasPrefix(u, s.smsURL) && post:
		key = s.keys["SMS_PROVIDER_ADMIN_KEY"]
	case strings.HasPrefix(u, s.smsURL):
		key = s.keys["SMS_PROVIDER_READ_KEY"]
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// payment is the Payments API's payment.
type payment struct {
	ID          string `json:"id"`
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Status      string `json:"status"`
	Version     int64  `json:"version"`
}

type cart struct {
	UserID      string `json:"user_id"`
	AmountPaise int64  `json:"amount_paise"`
	Currency    string `json:"currency"`
	Method      string `json:"method"`
}

func upi(user string, amount int64) cart {
	return cart{UserID: user, AmountPaise: amount, Currency: "INR", Method: "upi"}
}

// pay creates a payment under a fresh Idempotency-Key and requires 201.
func pay(t testing.TB, user string, amount int64) payment {
	t.Helper()
	key := id("k")
	code, _, b := do(t, http.MethodPost, s.paymentsURL+"/v1/payments", map[string]string{"Idempotency-Key": key}, upi(user, amount))
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/payments: %d %s", code, b)
	}
	return decode[payment](t, b)
}

func refund(t testing.TB, paymentID string) payment {
	t.Helper()
	code, _, b := do(t, http.MethodPost, s.paymentsURL+"/v1/payments/"+paymentID+"/refund",
		map[string]string{"Idempotency-Key": id("r")}, map[string]any{})
	if code != http.StatusOK {
		t.Fatalf("POST refund %s: %d %s", paymentID, code, b)
	}
	return decode[payment](t, b)
}

func walletBalance(t testing.TB, user string) int64 {
	t.Helper()
	code, _, b := do(t, http.MethodGet, s.rewardsURL+"/v1/wallets/"+user, nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET wallet %s: %d %s", user, code, b)
	}
	return decode[struct {
		BalancePaise int64 `json:"balance_paise"`
	}](t, b).BalancePaise
}

// ---------------------------------------------------------------------------
// events and queues

// paymentEvent builds a payment event as the payments service would (or a
// buggy upstream: any event id, any time).
func paymentEvent(t testing.TB, eventType, paymentID, user string, amount int64, version int64) events.Envelope {
	t.Helper()
	status := "SUCCEEDED"
	if eventType == contract.PaymentRefunded {
		status = "REFUNDED"
	}
	e, err := events.New(eventType, paymentID, version, map[string]any{
		"payment_id": paymentID, "user_id": user, "amount_paise": amount, "currency": "INR", "status": status})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func body(t testing.TB, e events.Envelope) string {
	t.Helper()
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func strAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// send puts one copy of e on queueURL with the attributes the relay sets,
// and returns its SQS MessageId.
func send(t testing.TB, queueURL string, e events.Envelope) string {
	t.Helper()
	return sendRaw(t, queueURL, body(t, e), map[string]string{"event_id": e.EventID.String(), "event_type": e.EventType})
}

func sendRaw(t testing.TB, queueURL, b string, attrs map[string]string) string {
	t.Helper()
	ma := map[string]types.MessageAttributeValue{}
	for k, v := range attrs {
		ma[k] = strAttr(v)
	}
	out, err := s.sqs.SendMessage(bg(), &sqs.SendMessageInput{QueueUrl: &queueURL, MessageBody: &b, MessageAttributes: ma})
	if err != nil {
		t.Fatalf("send to %s: %v", queueURL, err)
	}
	return aws.ToString(out.MessageId)
}

// sendMany sends the bodies (each with its event_id / event_type attributes)
// in batches of 10, 8 batches in flight.
func sendMany(t testing.TB, queueURL string, es []events.Envelope) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	batches := make(chan []events.Envelope)
	for range 8 {
		wg.Go(func() {
			for batch := range batches {
				entries := make([]types.SendMessageBatchRequestEntry, len(batch))
				for i, e := range batch {
					b, _ := e.Marshal()
					entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(b)),
						MessageAttributes: map[string]types.MessageAttributeValue{"event_id": strAttr(e.EventID.String()), "event_type": strAttr(e.EventType)}}
				}
				out, err := s.sqs.SendMessageBatch(bg(), &sqs.SendMessageBatchInput{QueueUrl: &queueURL, Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := 0; i < len(es); i += 10 {
		batches <- es[i:min(i+10, len(es))]
	}
	close(batches)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("send batch to %s: %v", queueURL, errors.Join(errs...))
	}
}

// peek reads every message currently visible in queueURL, makes them all
// visible again at once, and returns those match accepts. Use it on a queue
// nobody consumes (a DLQ, or a source queue whose consumer is stopped).
func peek(t testing.TB, queueURL string, match func(types.Message) bool) []types.Message {
	t.Helper()
	return scan(t, queueURL, match, false)
}

// take is peek that also deletes the matching messages (a scenario
// removing what it parked, so the DLQ is left as it was found).
func take(t testing.TB, queueURL string, match func(types.Message) bool) []types.Message {
	t.Helper()
	return scan(t, queueURL, match, true)
}

func scan(t testing.TB, queueURL string, match func(types.Message) bool, del bool) []types.Message {
	t.Helper()
	var all, matched []types.Message
	defer func() {
		// Release what was received and not deleted.
		for _, m := range all {
			_, _ = s.sqs.ChangeMessageVisibility(bg(), &sqs.ChangeMessageVisibilityInput{QueueUrl: &queueURL,
				ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
		}
	}()
	for {
		out, err := s.sqs.ReceiveMessage(bg(), &sqs.ReceiveMessageInput{QueueUrl: &queueURL, MaxNumberOfMessages: 10,
			VisibilityTimeout: 20, WaitTimeSeconds: 0, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatalf("receive from %s: %v", queueURL, err)
		}
		if len(out.Messages) == 0 {
			return matched
		}
		for _, m := range out.Messages {
			if !match(m) {
				all = append(all, m)
				continue
			}
			matched = append(matched, m)
			if !del {
				all = append(all, m)
				continue
			}
			if _, err := s.sqs.DeleteMessage(bg(), &sqs.DeleteMessageInput{QueueUrl: &queueURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Errorf("delete from %s: %v", queueURL, err)
			}
		}
	}
}

// withEventID matches messages whose body carries one of the event ids.
func withEventID(ids ...uuid.UUID) func(types.Message) bool {
	return func(m types.Message) bool {
		for _, e := range ids {
			if strings.Contains(aws.ToString(m.Body), e.String()) {
				return true
			}
		}
		return false
	}
}

func attr(m types.Message, k string) string {
	if v, ok := m.MessageAttributes[k]; ok {
		return aws.ToString(v.StringValue)
	}
	return ""
}

// depth is ApproximateNumberOfMessages + ...NotVisible of a queue.
func depth(t testing.TB, queueURL string) int {
	t.Helper()
	out, err := s.sqs.GetQueueAttributes(bg(), &sqs.GetQueueAttributesInput{QueueUrl: &queueURL, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	b, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return a + b
}

// redrive runs the project's redrive command and returns how many it moved.
func redrive(t testing.TB, args ...string) int {
	t.Helper()
	cmd := exec.Command(s.redriveBin, args...)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redrive %v: %v\n%s", args, err, out)
	}
	var n int
	if _, err := fmt.Sscanf(string(out), "moved %d", &n); err != nil {
		t.Fatalf("redrive %v: unexpected output %q", args, out)
	}
	t.Logf("redrive %s: %s", strings.Join(args, " "), bytes.TrimSpace(out))
	return n
}

// ---------------------------------------------------------------------------
// databases (read only)

func count(t testing.TB, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(bg(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// processed is how many dedupe rows the rewards consumer holds for e.
func processed(t testing.TB, e uuid.UUID) int64 {
	return count(t, s.rewDB, `SELECT count(*) FROM processed_messages WHERE consumer = 'rewards' AND message_id = $1`, e)
}

// credit is a cashback_credits row.
type credit struct {
	PaymentID   string
	UserID      string
	AmountPaise int64
	RateBP      int
	EventID     uuid.UUID
	Status      string
	CreditedAt  time.Time
}

func credits(t testing.TB, where string, args ...any) []credit {
	t.Helper()
	return query(t, s.rewDB, pgx.RowToStructByPos[credit], `SELECT payment_id, user_id, amount_paise, rate_bp, event_id, status, credited_at
		FROM cashback_credits WHERE `+where+` ORDER BY id`, args...)
}

// query runs sql on db and collects its rows with to, failing the test on
// any error.
func query[T any](t testing.TB, db *pgxpool.Pool, to pgx.RowToFunc[T], sql string, args ...any) []T {
	t.Helper()
	rows, err := db.Query(bg(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, to)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// waitCredits waits until the payment has n credits and returns them.
func waitCredits(t testing.TB, paymentID string, n int) []credit {
	t.Helper()
	var cs []credit
	eventually(t, 30*time.Second, func() (bool, string) {
		cs = credits(t, "payment_id = $1", paymentID)
		return len(cs) == n, fmt.Sprintf("payment %s has %d cashback credits, want %d", paymentID, len(cs), n)
	})
	return cs
}

// outboxEventID is the id of the payment's (or cashback's) event of that
// type in a producer's outbox.
func outboxEventID(t testing.TB, db *pgxpool.Pool, aggregateID, eventType string) uuid.UUID {
	t.Helper()
	var e uuid.UUID
	eventually(t, 30*time.Second, func() (bool, string) {
		err := db.QueryRow(bg(), `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = $2`, aggregateID, eventType).Scan(&e)
		if err == nil {
			return true, ""
		}
		return false, fmt.Sprintf("no %s outbox row for %s: %v", eventType, aggregateID, err)
	})
	return e
}

// outboxEnvelope reads a payments outbox row back as the envelope the relay
// sends: the body of a redelivered copy.
func outboxEnvelope(t testing.TB, db *pgxpool.Pool, eventID uuid.UUID) events.Envelope {
	t.Helper()
	var e events.Envelope
	var payload []byte
	err := db.QueryRow(bg(), `SELECT id, event_type, aggregate_id, aggregate_version, occurred_at, payload FROM outbox WHERE id = $1`, eventID).
		Scan(&e.EventID, &e.EventType, &e.AggregateID, &e.AggregateVersion, &e.OccurredAt, &payload)
	if err != nil {
		t.Fatalf("outbox row %s: %v", eventID, err)
	}
	e.OccurredAt = e.OccurredAt.UTC()
	e.Payload = payload
	return e
}

// notification is a notifications row.
type notification struct {
	ID                int64
	Kind              string
	Status            string
	Key               string
	ProviderMessageID *string
	Attempts          int
}

func notificationOf(t testing.TB, eventID uuid.UUID) (notification, bool) {
	t.Helper()
	var n notification
	err := s.notDB.QueryRow(bg(), `SELECT id, kind, status, idempotency_key, provider_message_id, attempts
		FROM notifications WHERE event_id = $1`, eventID).Scan(&n.ID, &n.Kind, &n.Status, &n.Key, &n.ProviderMessageID, &n.Attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return n, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return n, true
}

// waitSent waits until the SMS of cashback event e is SENT.
func waitSent(t testing.TB, e uuid.UUID) notification {
	t.Helper()
	var n notification
	eventually(t, 30*time.Second, func() (bool, string) {
		var ok bool
		n, ok = notificationOf(t, e)
		return ok && n.Status == "SENT", fmt.Sprintf("notification of %s: found %v, %+v", e, ok, n)
	})
	return n
}

// ---------------------------------------------------------------------------
// the dev SMS provider

type delivery struct {
	IdempotencyKey string `json:"idempotency_key"`
	MessageID      string `json:"message_id"`
	To             string `json:"to"`
	Requests       int    `json:"requests"`
}

// deliveries lists what the provider delivered under keys starting with prefix.
func deliveries(t testing.TB, prefix string) []delivery {
	t.Helper()
	code, _, b := do(t, http.MethodGet, s.smsURL+"/v1/deliveries?idempotency_key_prefix="+prefix, nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET deliveries: %d %s", code, b)
	}
	return decode[struct {
		Deliveries []delivery `json:"deliveries"`
	}](t, b).Deliveries
}

// smsOnce asserts that the provider delivered exactly one SMS under
// sms:<e>, after exactly `requests` send requests, and returns it.
func smsOnce(t testing.TB, e uuid.UUID, requests int) delivery {
	t.Helper()
	ds := deliveries(t, "sms:"+e.String())
	if len(ds) != 1 {
		t.Fatalf("provider delivered %d SMS under sms:%s, want 1: %+v", len(ds), e, ds)
	}
	if ds[0].Requests != requests {
		t.Errorf("provider saw %d send requests under sms:%s, want %d", ds[0].Requests, e, requests)
	}
	return ds[0]
}

// smsControl posts fault injection to the provider.
func smsControl(t testing.TB, c map[string]any) {
	t.Helper()
	if code, _, b := do(t, http.MethodPost, s.smsURL+"/v1/control", nil, c); code != http.StatusOK {
		t.Fatalf("POST /v1/control: %d %s", code, b)
	}
}

// pipelineOnce asserts the whole downstream of one payment: exactly one
// credit of want paise, one CashbackCredited in the rewards outbox, one
// notification SENT and one SMS delivered (after one request).
func pipelineOnce(t testing.TB, paymentID string, want int64) (credit, uuid.UUID) {
	t.Helper()
	cs := waitCredits(t, paymentID, 1)
	if cs[0].AmountPaise != want {
		t.Errorf("credit of %s is %d paise, want %d", paymentID, cs[0].AmountPaise, want)
	}
	if n := count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = 'CashbackCredited'`, paymentID); n != 1 {
		t.Errorf("rewards outbox has %d CashbackCredited for %s, want 1", n, paymentID)
	}
	ce := outboxEventID(t, s.rewDB, paymentID, contract.CashbackCredited)
	waitSent(t, ce)
	if n := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = $1`, ce); n != 1 {
		t.Errorf("%d notifications rows for %s, want 1", n, ce)
	}
	smsOnce(t, ce, 1)
	return cs[0], ce
}

// ---------------------------------------------------------------------------
// metrics

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// metric sums the samples of name on baseURL/metrics whose labels include
// every label given ("k", "v", ...). A series never incremented is 0.
func metric(t testing.TB, baseURL, name string, labels ...string) float64 {
	t.Helper()
	code, _, b := do(t, http.MethodGet, baseURL+"/metrics", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d", baseURL, code)
	}
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		got := map[string]string{}
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			for _, m := range labelRE.FindAllStringSubmatch(rest[1:end], -1) {
				got[m[1]] = m[2]
			}
			rest = rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && got[labels[i]] == labels[i+1]
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		total += v
	}
	return total
}

// ---------------------------------------------------------------------------
// processes and logs

// local skips the test unless the suite controls the processes.
func local(t testing.TB) *stack.Local {
	t.Helper()
	if s.local == nil {
		t.Skip("needs process control (E2E_STACK=local): this scenario restarts, kills or re-configures services")
	}
	return s.local
}

// restartWith restarts a service with test knobs for the rest of the test;
// when the test ends it runs again with its normal environment.
func restartWith(t testing.TB, name string, env ...string) {
	t.Helper()
	l := local(t)
	if err := l.Restart(name, env...); err != nil {
		t.Fatalf("restart %s %v: %v", name, env, err)
	}
	t.Cleanup(func() { restartPlain(t, name) })
}

// restartPlain brings a service back to its normal environment (stopping
// it first if it runs).
func restartPlain(t testing.TB, name string) {
	if err := s.local.Restart(name); err != nil {
		t.Errorf("restore %s: %v", name, err)
	}
}

// logLines returns the lines of the service's log that contain every one
// of subs (nil without a local stack: no logs to read, which the test's
// output says, so a check that did not run is not taken for a pass).
func logLines(t testing.TB, name string, subs ...string) []string {
	t.Helper()
	if s.local == nil {
		t.Logf("not checked (no local stack, no log to read): %s's log lines with %q", name, subs)
		return nil
	}
	f, err := os.Open(s.local.LogPath(name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(line, sub)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// waitLog waits until the service logged exactly n lines containing every
// one of subs (no-op without a local stack).
func waitLog(t testing.TB, name string, n int, subs ...string) []string {
	t.Helper()
	if s.local == nil {
		t.Logf("not checked (no local stack, no log to read): %s logged %d lines with %q", name, n, subs)
		return nil
	}
	var lines []string
	eventually(t, 30*time.Second, func() (bool, string) {
		lines = logLines(t, name, subs...)
		return len(lines) == n, fmt.Sprintf("%s logged %d lines with %q, want %d", name, len(lines), subs, n)
	})
	return lines
}
