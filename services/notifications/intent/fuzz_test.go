package intent

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// FuzzBuild: a cashback event's payload becomes an SMS intent with a
// recipient, a body and the key sms:<event_id>, or a permanent error (the
// message is parked); never a panic, never an empty SMS.
func FuzzBuild(f *testing.F) {
	for _, seed := range []string{
		`{"payment_id":"pay_42","user_id":"u_17","amount_paise":2400,"recipient":"+919876543210"}`,
		`{"user_id":"u_17","amount_paise":2400}`,
		`{"amount_paise":2400}`,
		`{"user_id":"u_17","amount_paise":-9223372036854775808}`,
		`{"user_id":"u_17","amount_paise":9223372036854775807}`,
		`{"user_id":17,"amount_paise":2400}`,
		`{"recipient":"+91\u202e9876543210","amount_paise":2400}`,
		"{\"recipient\":\"\xff\xfe\",\"amount_paise\":1}",
		`{}`, `null`, `"x"`,
	} {
		f.Add([]byte(seed), events.CashbackCredited)
		f.Add([]byte(seed), events.CashbackReversed)
	}
	f.Add([]byte(`{"user_id":"u_17","amount_paise":2400}`), events.PaymentSucceeded)
	id := uuid.Must(uuid.NewV7())
	f.Fuzz(func(t *testing.T, payload []byte, eventType string) {
		e := events.Envelope{EventID: id, EventType: eventType, AggregateID: "pay_42", Payload: json.RawMessage(payload)}
		in, err := Build(e)
		if err != nil {
			if !sqstransport.IsPermanent(err) {
				t.Fatalf("Build refused %q with a retryable error: %v", payload, err)
			}
			return
		}
		if in.Recipient == "" || in.Body == "" || in.EventID != id || (in.Kind != KindCashback && in.Kind != KindCashbackReversed) {
			t.Fatalf("unusable intent %+v from %q", in, payload)
		}
		if !strings.Contains(in.Body, "₹") {
			t.Fatalf("SMS body %q names no amount", in.Body)
		}
	})
}
