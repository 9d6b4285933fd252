package events_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/events"
)

// FuzzDecode: whatever arrives on a queue, Decode never panics; it either
// returns an envelope that re-encodes and decodes to the same event (same
// id, same content hash), or a *DecodeError naming the field, so the
// subscriber can park the message with a reason.
func FuzzDecode(f *testing.F) {
	valid, err := events.New("PaymentSucceeded", "pay_42", 1,
		map[string]any{"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 120000, "currency": "INR"})
	if err != nil {
		f.Fatal(err)
	}
	good, err := valid.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	id := valid.EventID.String()
	for _, seed := range []string{
		string(good),
		``, `{}`, `null`, `[]`, `"x"`, `{"event_id":`,
		strings.Replace(string(good), id, "not-a-uuid", 1),
		strings.Replace(string(good), id, "6ba7b810-9dad-11d1-80b4-00c04fd430c8", 1), // v1
		strings.Replace(string(good), `"aggregate_version":1`, `"aggregate_version":99999999999999999999`, 1),
		strings.Replace(string(good), `"aggregate_version":1`, `"aggregate_version":-1`, 1),
		strings.Replace(string(good), `"pay_42"`, "\"pay_\xff\xfe\"", 1),
		strings.Replace(string(good), `"pay_42"`, `"pay_42'; DROP TABLE cashback_credits;--"`, 1),
		strings.Replace(string(good), `{"amount_paise"`, `[{"amount_paise"`, 1),
		string(good) + `{}`, string(good) + `}`,
		strings.Replace(string(good), `"event_type"`, `"EVENT_ID":"`+id+`","event_type"`, 1),
		strings.Replace(string(good), `"currency":"INR"`, `"currency":"\u0000","note":"\ud83d\ude00\ud800"`, 1),
		`{"event_id":"` + id + `","event_id":"` + id + `"}`,
		`{"event_id":"` + id + `","event_type":"X","aggregate_id":"a","aggregate_version":0,"occurred_at":"yesterday","payload":{}}`,
		`{"event_id":"` + id + `","event_type":"X","aggregate_id":"a","aggregate_version":0,"occurred_at":"2026-12-02T10:00:00Z","payload":{},"extra":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := events.Decode(body)
		if err != nil {
			if !events.IsDecodeError(err) {
				t.Fatalf("Decode(%q): untyped error %T: %v", body, err, err)
			}
			return
		}
		again, err := e.Marshal()
		if err != nil {
			t.Fatalf("decoded envelope %+v does not re-encode: %v", e, err)
		}
		e2, err := events.Decode(again)
		if err != nil {
			t.Fatalf("re-encoded envelope %q does not decode: %v", again, err)
		}
		if e2.EventID != e.EventID || e2.EventType != e.EventType || e2.AggregateID != e.AggregateID ||
			e2.AggregateVersion != e.AggregateVersion || !e2.OccurredAt.Equal(e.OccurredAt) || !bytes.Equal(e2.Hash(), e.Hash()) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", e, e2)
		}
	})
}

// DuplicateField's scan gives the tokenizer's answer for every well-formed
// body, and never reports a name the tokenizer would not.
func FuzzDuplicateField(f *testing.F) {
	for _, seed := range []string{
		`{"a":1,"b":2}`, `{"a":1,"a":2}`, ` { "a" : [1,{"a":2}] , "b":"}\"a" , "a" : null } `,
		`{"a":{"b":1,"b":2}}`, `{"a\u0062":1,"ab":2}`, `{"\"":1,"\"":2}`, `{"a":"x\\","a":1}`,
		`{}`, `[]`, `{"a":}`, `{"a":1,}`, `{"a":1}{"a":2}`, `{"a":1,"a":2`, `{"a":[1,2,"a"],"b":{"c":{}},"b":0}`,
		`{"a":1 ,"b" :2,  "a":3}`, "{\"a\":1,\n\t\"a\":2}", `{"a":true,"c":false,"a":null}`, "{\"\xf5\":0,\"\xe8\":0}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		name, dup := events.DuplicateField(body)
		wantName, wantDup := events.DuplicateFieldByTokens(body)
		if dup && (name != wantName || !wantDup) {
			t.Fatalf("DuplicateField(%q) = %q, %v; the tokenizer says %q, %v", body, name, dup, wantName, wantDup)
		}
		if json.Valid(body) && (name != wantName || dup != wantDup) {
			t.Fatalf("DuplicateField(%q) = %q, %v; the tokenizer says %q, %v", body, name, dup, wantName, wantDup)
		}
	})
}
