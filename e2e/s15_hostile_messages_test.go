package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/google/uuid"
)

// Scenario 15. Hostile messages: a corpus of bodies a buggy or malicious
// producer could put on either queue. Each is parked in its queue's DLQ
// with a reason (one at SQS's size limit parks without attributes, its
// reason logged), none crashes a consumer or leaves half an effect, and a
// good event sent after them is applied.
func TestHostileMessagesAreParkedWithAReasonAndNothingIsHalfApplied(t *testing.T) {
	tok := id("hostile")
	type hostile struct {
		name, queue string // "pay" (payments-events → rewards) or "rew" (rewards-events → notifications)
		body        string
		reason      string // park_reason prefix; "" = parked without attributes
	}
	// envelope returns a well-formed envelope of the given type as a map,
	// its aggregate (and payment) id carrying the corpus token and n, for
	// mutate to spoil one thing of.
	envelope := func(n int, eventType string, payload map[string]any, mutate func(map[string]any)) string {
		agg := fmt.Sprintf("%s_%02d", tok, n)
		if _, ok := payload["payment_id"]; !ok {
			payload["payment_id"] = agg
		}
		m := map[string]any{"event_id": uuid.Must(uuid.NewV7()).String(), "event_type": eventType,
			"aggregate_id": agg, "aggregate_version": 1, "occurred_at": time.Now().UTC().Format(time.RFC3339Nano), "payload": payload}
		if mutate != nil {
			mutate(m)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	pay := func(user any, amount any) map[string]any {
		return map[string]any{"user_id": user, "amount_paise": amount, "currency": "INR", "status": "SUCCEEDED"}
	}
	cashback := func(recipient any, amount any) map[string]any {
		return map[string]any{"user_id": "u_17", "recipient": recipient, "amount_paise": amount}
	}
	raw := func(b string, old, new string) string { return strings.Replace(b, old, new, 1) }
	big := envelope(2, contract.PaymentSucceeded, map[string]any{"user_id": "u_17", "amount_paise": -1, "currency": "INR", "pad": ""}, nil)
	big = raw(big, `"pad":""`, `"pad":"`+strings.Repeat("x", 256*1024-len(big))+`"`)

	corpus := []hostile{
		{"user_id whose bytes were not UTF-8 (arrives as U+FFFD)", "pay", envelope(1, contract.PaymentSucceeded, pay("u_\xff\xfe", 120000), nil), "refused: "},
		{"a body of exactly 256 KiB", "pay", big, ""},
		{"aggregate_version as a string", "pay", raw(envelope(3, contract.PaymentSucceeded, pay("u_17", 120000), nil), `"aggregate_version":1`, `"aggregate_version":"1"`), "undecodable: events: invalid aggregate_version"},
		{"aggregate_version beyond int64", "pay", raw(envelope(4, contract.PaymentSucceeded, pay("u_17", 120000), nil), `"aggregate_version":1`, `"aggregate_version":92233720368547758070`), "undecodable: events: invalid aggregate_version"},
		{"no payload", "pay", envelope(5, contract.PaymentSucceeded, pay("u_17", 1), func(m map[string]any) { delete(m, "payload") }), "undecodable: events: invalid payload"},
		{"payload is an array", "pay", envelope(6, contract.PaymentSucceeded, pay("u_17", 1), func(m map[string]any) { m["payload"] = []int{1} }), "undecodable: events: invalid payload"},
		{"event id is a UUIDv4", "pay", envelope(7, contract.PaymentSucceeded, pay("u_17", 1), func(m map[string]any) { m["event_id"] = uuid.NewString() }), "undecodable: events: invalid event_id"},
		{"two event ids", "pay", raw(envelope(8, contract.PaymentSucceeded, pay("u_17", 1), nil), `"event_id":`, `"event_id":"`+uuid.Must(uuid.NewV7()).String()+`","event_id":`), "undecodable: events: invalid event_id"},
		{"SQL in user_id", "pay", envelope(9, contract.PaymentSucceeded, pay("u_17'; DROP TABLE wallets;--", 120000), nil), "refused: "},
		{"SQL in event_type", "pay", envelope(10, "PaymentSucceeded'; DELETE FROM processed_messages;--", pay("u_17", 1), nil), "refused: "},
		{"negative amount", "pay", envelope(11, contract.PaymentSucceeded, pay("u_17", -120000), nil), "refused: "},
		{"amount as a string", "pay", envelope(12, contract.PaymentSucceeded, pay("u_17", "120000"), nil), "refused: "},
		{"payment_id is not the aggregate", "pay", envelope(13, contract.PaymentSucceeded, map[string]any{"payment_id": tok + "_someone_else", "user_id": "u_17", "amount_paise": 1, "currency": "INR"}, nil), "refused: "},
		{"a malformed phone", "pay", envelope(14, contract.PaymentSucceeded, map[string]any{"user_id": "u_17", "amount_paise": 1, "currency": "INR", "phone": "+91 98765'--"}, nil), "refused: "},
		{"recipient carrying SQL", "rew", envelope(15, contract.CashbackCredited, cashback("+91'; DROP TABLE notifications;--", 2400), nil), "refused: "},
		{"no recipient and no user_id", "rew", envelope(16, contract.CashbackCredited, map[string]any{"amount_paise": 2400}, nil), "refused: "},
		{"cashback amount as a string", "rew", envelope(17, contract.CashbackCredited, cashback("+919876543210", "2400"), nil), "refused: "},
		{"recipient whose bytes were not UTF-8", "rew", envelope(18, contract.CashbackCredited, cashback("+91\xff\xfe", 2400), nil), "refused: "},
		{"cashback with a UUIDv4 event id", "rew", envelope(19, contract.CashbackCredited, cashback("+919876543210", 2400), func(m map[string]any) { m["event_id"] = uuid.NewString() }), "undecodable: events: invalid event_id"},
	}
	if n := len(big); n != 256*1024 {
		t.Fatalf("the big body is %d bytes, want %d", n, 256*1024)
	}
	// The log outlives one suite run (make test runs this scenario on two
	// SQS servers against one stack): count only the lines this run adds.
	const tooBig = "parking without attributes: body and reason exceed the SQS message size"
	tooBig0 := len(logLines(t, "rewards", tooBig))
	for _, h := range corpus {
		q := s.payQ
		if h.queue == "rew" {
			q = s.rewQ
		}
		sendRaw(t, q, h.body, nil)
	}
	// A good event behind the corpus flows through to its SMS.
	user, payID := id("u_e2e15"), id("pay_e2e15")
	send(t, s.payQ, paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1))
	pipelineOnce(t, payID, 2400)

	inCorpus := func(m types.Message) bool { return strings.Contains(aws.ToString(m.Body), tok) }
	byBody := map[string]types.Message{}
	for _, dlq := range []string{s.payDLQ, s.rewDLQ} {
		want := 0
		for _, h := range corpus {
			if (h.queue == "pay") == (dlq == s.payDLQ) {
				want++
			}
		}
		var got []types.Message
		eventually(t, 60*time.Second, func() (bool, string) {
			got = peek(t, dlq, inCorpus)
			return len(got) == want, fmt.Sprintf("%d of the %d hostile messages in %s", len(got), want, dlq)
		})
		for _, m := range got {
			byBody[aws.ToString(m.Body)] = m
		}
		t.Cleanup(func() { take(t, dlq, inCorpus) })
	}
	for _, h := range corpus {
		m, ok := byBody[h.body]
		if !ok {
			t.Errorf("%s: not parked with its body intact", h.name)
			continue
		}
		reason := attr(m, "park_reason")
		switch {
		case h.reason == "" && len(m.MessageAttributes) != 0:
			t.Errorf("%s: parked with attributes %v, want none (no room under the size limit)", h.name, m.MessageAttributes)
		case h.reason != "" && !strings.HasPrefix(reason, h.reason):
			t.Errorf("%s: park_reason %q, want it to start with %q", h.name, reason, h.reason)
		}
	}
	waitLog(t, "rewards", tooBig0+1, tooBig)

	// Nothing of the corpus was applied, stored or sent; the consumers live.
	// A dedupe row without its effect would be the worst of these: a good
	// copy of that event would be taken for a duplicate and lost.
	var ids []uuid.UUID
	for _, h := range corpus {
		var m map[string]any
		if json.Unmarshal([]byte(h.body), &m) == nil {
			if s, ok := m["event_id"].(string); ok {
				if id, err := uuid.Parse(s); err == nil {
					ids = append(ids, id)
				}
			}
		}
	}
	if len(ids) < len(corpus)-2 {
		t.Fatalf("only %d event ids read back from the %d hostile bodies", len(ids), len(corpus))
	}
	for _, c := range []struct {
		what string
		n    int64
	}{
		{"rewards dedupe rows", count(t, s.rewDB, `SELECT count(*) FROM processed_messages WHERE message_id = ANY($1)`, ids)},
		{"notifications dedupe rows", count(t, s.notDB, `SELECT count(*) FROM processed_messages WHERE message_id = ANY($1)`, ids)},
		{"notifications inbox rows by event id", count(t, s.notDB, `SELECT count(*) FROM inbox WHERE message_id = ANY($1)`, ids)},
		{"cashback credits", count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id LIKE $1`, tok+"%")},
		{"payment versions", count(t, s.rewDB, `SELECT count(*) FROM payment_versions WHERE payment_id LIKE $1`, tok+"%")},
		{"rewards outbox rows", count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id LIKE $1`, tok+"%")},
		{"inbox rows", count(t, s.notDB, `SELECT count(*) FROM inbox WHERE aggregate_id LIKE $1`, tok+"%")},
		{"notifications", count(t, s.notDB, `SELECT count(*) FROM notifications WHERE body LIKE $1`, "%"+tok+"%")},
	} {
		if c.n != 0 {
			t.Errorf("%d %s for the hostile corpus, want 0", c.n, c.what)
		}
	}
	for _, u := range []string{s.rewardsURL, s.notificationsURL} {
		if code, _, b := do(t, http.MethodGet, u+"/readyz", nil, nil); code != http.StatusOK {
			t.Errorf("%s/readyz after the corpus: %d %s", u, code, b)
		}
	}
}
