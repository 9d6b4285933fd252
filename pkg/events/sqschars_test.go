package events_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/effectively-once/payments-cashback/pkg/events"
)

// sqsAllowed is SQS's character set for a message body, less the
// characters above U+FFFF that SQS allows and some SQS servers refuse.
func sqsAllowed(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD)
}

// EscapeForSQS writes every character a queue may refuse (U+FFFE, U+FFFF,
// and everything above U+FFFF: an emoji) as a JSON escape, so the body is
// the same JSON, decodes to the same values and hashes the same, and holds
// only characters every SQS server accepts. A body with none is returned
// as it is.
func TestEscapeForSQSKeepsTheJSONAndLeavesNoCharacterAQueueRefuses(t *testing.T) {
	for _, in := range []string{
		`{"name":"Asha 😀","note":"x\uffffy\ufffez","😀":["𝄞",1e3,"é€\ufffd"]}`,
		`{"plain":"ascii and é and € and \u2028"}`,
		"{\"raw\":\"\U0001F600\uFFFF\uFFFE\U0010FFFF\"}",
	} {
		got := events.EscapeForSQS([]byte(in))
		for i, r := range string(got) {
			if !sqsAllowed(r) {
				t.Fatalf("EscapeForSQS(%q) = %q: %U at byte %d is not a character every queue accepts", in, got, r, i)
			}
		}
		var a, b any
		if err := json.Unmarshal([]byte(in), &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &b); err != nil {
			t.Fatalf("EscapeForSQS(%q) = %q: not JSON: %v", in, got, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("EscapeForSQS(%q) decodes to %v, want %v", in, b, a)
		}
		e, err := events.New("PaymentSucceeded", "pay_1", 1, json.RawMessage(in))
		if err != nil {
			t.Fatal(err)
		}
		body, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		d, err := events.Decode(events.EscapeForSQS(body))
		if err != nil {
			t.Fatalf("Decode of the escaped body: %v", err)
		}
		if string(d.Hash()) != string(e.Hash()) {
			t.Fatalf("the escaped body of %q hashes apart from the event", in)
		}
		if !strings.ContainsAny(in, "😀\uffff\U0001F600") && string(got) != in {
			t.Fatalf("EscapeForSQS changed %q, which needs nothing, to %q", in, got)
		}
	}
	if !utf8.ValidString(string(events.EscapeForSQS([]byte(`{"a":"😀"}`)))) {
		t.Fatal("not UTF-8")
	}
}

// An event type is also an SQS attribute, which no escape can mend:
// Validate refuses one with a character a queue may refuse.
func TestValidateRefusesAnEventTypeNoQueueCarries(t *testing.T) {
	for _, typ := range []string{"Paid😀", "Paid\uffff", "Paid\x01"} {
		e, err := events.New(typ, "pay_1", 1, map[string]int{"a": 1})
		if err == nil {
			err = e.Validate()
		}
		if !events.IsDecodeError(err) || !strings.Contains(err.Error(), "event_type") {
			t.Errorf("event type %q: %v, want a *DecodeError naming event_type", typ, err)
		}
	}
}
