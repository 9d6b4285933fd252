package compose

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// FuzzBuild: a cashback event's payload becomes an SMS intent with a
// recipient, a body and the key sms:<event_id>, or a permanent error (the
// message is parked); never a panic, never an empty SMS. The amount the SMS
// states is exactly the payload's amount_paise, and a negative amount
// (min int64 included) is refused, never rendered.
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
		f.Add([]byte(seed), contract.CashbackCredited)
		f.Add([]byte(seed), contract.CashbackReversed)
	}
	f.Add([]byte(`{"user_id":"u_17","amount_paise":2400}`), contract.PaymentSucceeded)
	id := uuid.Must(uuid.NewV7())
	f.Fuzz(func(t *testing.T, payload []byte, eventType string) {
		e := events.Envelope{EventID: id, EventType: eventType, AggregateID: "pay_42", Payload: json.RawMessage(payload)}
		in, err := Build(e)
		if err != nil {
			if !errs.IsPermanent(err) {
				t.Fatalf("Build refused %q with a retryable error: %v", payload, err)
			}
			return
		}
		if in.Recipient == "" || (in.Body == "") == (in.NoSMS == "") || in.EventID != id || (in.Kind != KindCashback && in.Kind != KindCashbackReversed) {
			t.Fatalf("unusable intent %+v from %q", in, payload)
		}
		var p struct {
			AmountPaise *int64 `json:"amount_paise"`
		}
		if err := json.Unmarshal(payload, &p); err != nil {
			t.Fatalf("Build accepted %q, which does not decode: %v", payload, err)
		}
		if p.AmountPaise == nil || *p.AmountPaise < 0 {
			t.Fatalf("Build accepted a missing or negative amount: %q from %q", in.Body, payload)
		}
		if (*p.AmountPaise == 0) != (in.NoSMS != "") {
			t.Fatalf("Build of %q: NoSMS %q; want it exactly for 0 paise", payload, in.NoSMS)
		}
		if in.NoSMS != "" {
			return
		}
		m := statedAmount.FindStringSubmatch(in.Body)
		if m == nil {
			t.Fatalf("SMS body %q states no amount", in.Body)
		}
		whole, err := strconv.ParseInt(strings.ReplaceAll(m[1], ",", ""), 10, 64)
		frac, _ := strconv.ParseInt(m[2], 10, 64)
		if err != nil || whole != *p.AmountPaise/100 || frac != *p.AmountPaise%100 {
			t.Fatalf("SMS body %q states %s.%s rupees, want the credit of %d paise", in.Body, m[1], m[2], *p.AmountPaise)
		}
	})
}

// statedAmount is how an SMS body states an amount: ₹ then Indian-grouped
// rupees and two digits of paise.
var statedAmount = regexp.MustCompile(`(?:^|[^-0-9,])₹((?:[0-9]{1,2},)*(?:[0-9]{1,3},)?[0-9]{1,3})\.([0-9]{2})(?:[^0-9]|$)`)
