package terms

import (
	"encoding/json"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// FuzzDecodePayment: a payment event's payload, whatever a producer put in
// it, is either refused with an error (the message is parked: permanent)
// or accepted with every invariant the credit relies on; never a panic. A
// payment in any currency but INR is refused: cashback is computed in paise.
func FuzzDecodePayment(f *testing.F) {
	for _, seed := range []string{
		`{"payment_id":"pay_42","user_id":"u_17","amount_paise":120000,"currency":"INR"}`,
		`{"user_id":"u_17","amount_paise":120000,"currency":"inr","phone":"+919876543210"}`,
		`{"payment_id":"pay_other","user_id":"u_17","amount_paise":120000,"currency":"INR"}`,
		`{"user_id":"u_17","amount_paise":-1,"currency":"INR"}`,
		`{"user_id":"u_17","amount_paise":9223372036854775807,"currency":"INR"}`,
		`{"user_id":"u_17","amount_paise":"120000","currency":"INR"}`,
		`{"user_id":["u_17"],"amount_paise":1,"currency":"INR"}`,
		`{"user_id":"u_17'; DROP TABLE wallets;--","amount_paise":1,"currency":"INR"}`,
		"{\"user_id\":\"u_\xff\",\"amount_paise\":1,\"currency\":\"INR\"}",
		`{}`, `[]`, `null`, `{"amount_paise":1e400}`,
		`{"user_id":"u_17","amount_paise":120000,"currency":"USD"}`,
		`{"user_id":"u_17","amount_paise":120000,"currency":"INR "}`,
		`{"user_id":"u_17","amount_paise":120000,"currency":"İNR"}`,
		`{"user_id":"u_17","amount_paise":120000}`,
	} {
		f.Add([]byte(seed), true)
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, payload []byte, needAmount bool) {
		e := events.Envelope{EventType: contract.PaymentSucceeded, AggregateID: "pay_42", Payload: json.RawMessage(payload)}
		p, err := decodePayment(e, needAmount)
		var raw struct {
			Currency *string `json:"currency"`
		}
		refused := json.Unmarshal(payload, &raw) == nil && (raw.Currency == nil || !asciiINR(*raw.Currency))
		if err != nil {
			return
		}
		if needAmount && refused {
			t.Fatalf("accepted a payment in a refused currency: %q", payload)
		}
		if p.PaymentID != "pay_42" {
			t.Fatalf("accepted payment_id %q for aggregate pay_42", p.PaymentID)
		}
		if !needAmount {
			return
		}
		if p.UserID == "" || p.AmountPaise <= 0 || !asciiINR(p.Currency) {
			t.Fatalf("accepted an unusable payment %+v", p)
		}
		for _, rate := range []int{0, 1, 200, MaxRateBP} {
			c, err := Amount(p.AmountPaise, rate)
			if err != nil || c < 0 || c > p.AmountPaise {
				t.Fatalf("Amount(%d, %d) = %d, %v: want 0 <= cashback <= amount", p.AmountPaise, rate, c, err)
			}
		}
	})
}

// asciiINR is the property's own spelling of the one accepted currency: the
// three ASCII letters I, N, R in any case, and nothing else.
func asciiINR(s string) bool {
	return len(s) == 3 && s[0]|0x20 == 'i' && s[1]|0x20 == 'n' && s[2]|0x20 == 'r'
}
