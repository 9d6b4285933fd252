package events_test

import (
	"fmt"

	"github.com/effectively-once/payments-cashback/pkg/events"
)

// A producer makes an envelope (its EventID, a UUIDv7, is the dedupe key of
// every consumer); a consumer decodes the body strictly, and a malformed one
// is refused with the field named.
func ExampleDecode() {
	e, _ := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000})
	body, _ := e.Marshal()
	back, err := events.Decode(body)
	fmt.Println(back.EventType, back.AggregateID, back.EventID == e.EventID, err)

	_, err = events.Decode([]byte(`{"event_id":"not-a-uuid","event_type":"PaymentSucceeded"}`))
	fmt.Println("decode error:", events.IsDecodeError(err))
	// Output:
	// PaymentSucceeded pay_42 true <nil>
	// decode error: true
}
