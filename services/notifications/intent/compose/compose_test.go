package compose

import (
	"math"
	"strings"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

func TestRupees(t *testing.T) {
	for paise, want := range map[int64]string{2400: "₹24.00", 5: "₹0.05", 12345678: "₹1,23,456.78", 100000: "₹1,000.00", 1234567890: "₹1,23,45,678.90", -250: "-₹2.50",
		math.MinInt64: "-₹92,23,37,20,36,85,47,758.08"} {
		if got := Rupees(paise); got != want {
			t.Errorf("Rupees(%d) = %q, want %q", paise, got, want)
		}
	}
}

func TestBuild(t *testing.T) {
	e, _ := events.New(contract.CashbackCredited, "pay_42", 1, map[string]any{"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 2400})
	in, err := Build(e)
	if err != nil || in.Kind != KindCashback || in.Recipient != "u_17" || !strings.Contains(in.Body, "₹24.00") {
		t.Errorf("Build = %+v, %v", in, err)
	}
	if Key(e.EventID) != "sms:"+e.EventID.String() {
		t.Errorf("Key = %q", Key(e.EventID))
	}
	for _, bad := range []events.Envelope{
		must(events.New(contract.PaymentSucceeded, "pay_42", 1, map[string]any{"user_id": "u_17"})),
		must(events.New(contract.CashbackCredited, "pay_42", 1, map[string]any{"amount_paise": 2400})),
		must(events.New(contract.CashbackCredited, "pay_42", 1, map[string]any{"user_id": "u_17"})),
		must(events.New(contract.CashbackCredited, "pay_42", 1, map[string]any{"user_id": "u_17", "amount_paise": nil})),
	} {
		if _, err := Build(bad); !errs.IsPermanent(err) {
			t.Errorf("Build(%s %s) = %v, want a permanent error", bad.EventType, bad.Payload, err)
		}
	}
}

// A credit or reversal of 0 paise (a payment under 50 paise at 2%, or
// every payment while the rate is 0) asks for no SMS: "You got ₹0.00
// cashback. It is in your wallet." tells the customer nothing true.
func TestACashbackOfZeroPaiseAsksForNoSMS(t *testing.T) {
	for _, typ := range []string{contract.CashbackCredited, contract.CashbackReversed} {
		e := must(events.New(typ, "pay_42", 1, map[string]any{"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 0}))
		in, err := Build(e)
		if err != nil || in.NoSMS == "" || in.Body != "" {
			t.Errorf("Build(%s of 0 paise) = %+v, %v; want no SMS and a reason", typ, in, err)
		}
	}
}

func must(e events.Envelope, err error) events.Envelope {
	if err != nil {
		panic(err)
	}
	return e
}
