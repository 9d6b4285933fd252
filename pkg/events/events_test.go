package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func validBody(t *testing.T) []byte {
	t.Helper()
	e, err := New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	e, err := New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000, "user_id": "u_17"})
	if err != nil {
		t.Fatal(err)
	}
	if e.EventID.Version() != 7 {
		t.Fatalf("event id version = %d, want 7", e.EventID.Version())
	}
	b, _ := e.Marshal()
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != e.EventID || got.EventType != e.EventType || got.AggregateID != "pay_42" ||
		got.AggregateVersion != 1 || !got.OccurredAt.Equal(e.OccurredAt) || !bytes.Equal(got.Hash(), e.Hash()) {
		t.Fatalf("round trip changed the envelope: %+v vs %+v", got, e)
	}
	if d := time.Since(IDTime(e.EventID)); d < 0 || d > time.Minute {
		t.Fatalf("IDTime = %v, want about now", IDTime(e.EventID))
	}
}

func TestDecodeRejects(t *testing.T) {
	var base map[string]any
	if err := json.Unmarshal(validBody(t), &base); err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(m map[string]any)) []byte {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	cases := []struct {
		name  string
		body  []byte
		field string
	}{
		{"missing event_id", mutate(func(m map[string]any) { delete(m, "event_id") }), "event_id"},
		{"event_id not a uuid", mutate(func(m map[string]any) { m["event_id"] = "e-91" }), "event_id"},
		{"event_id v4", mutate(func(m map[string]any) { m["event_id"] = uuid.New().String() }), "event_id"},
		{"event_id wrong type", mutate(func(m map[string]any) { m["event_id"] = 42 }), "event_id"},
		{"unknown field", mutate(func(m map[string]any) { m["extra"] = true }), "extra"},
		{"bad time", mutate(func(m map[string]any) { m["occurred_at"] = "yesterday" }), "occurred_at"},
		{"date only", mutate(func(m map[string]any) { m["occurred_at"] = "2026-12-02" }), "occurred_at"},
		{"payload array", mutate(func(m map[string]any) { m["payload"] = []int{1} }), "payload"},
		{"payload string", mutate(func(m map[string]any) { m["payload"] = "x" }), "payload"},
		{"payload null", mutate(func(m map[string]any) { m["payload"] = nil }), "payload"},
		{"missing payload", mutate(func(m map[string]any) { delete(m, "payload") }), "payload"},
		{"missing type", mutate(func(m map[string]any) { delete(m, "event_type") }), "event_type"},
		{"empty aggregate", mutate(func(m map[string]any) { m["aggregate_id"] = "" }), "aggregate_id"},
		{"negative version", mutate(func(m map[string]any) { m["aggregate_version"] = -1 }), "aggregate_version"},
		{"malformed json", []byte(`{"event_id":`), "body"},
		{"not an object", []byte(`[1,2]`), "body"},
		{"trailing data", append(validBody(t), []byte(` {}`)...), "body"},
		{"too big", mutate(func(m map[string]any) { m["payload"] = map[string]string{"pad": strings.Repeat("x", MaxBodyBytes)} }), "body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.body)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(%s) error = %v, want *DecodeError", c.body[:min(len(c.body), 80)], err)
			}
			if de.Field != c.field {
				t.Fatalf("field = %q (%v), want %q", de.Field, err, c.field)
			}
		})
	}
}

func TestHashIgnoresWhitespaceButNotContent(t *testing.T) {
	e, _ := New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000})
	spaced := e
	spaced.Payload = json.RawMessage(`{ "amount_paise" : 120000 }`)
	if !bytes.Equal(e.Hash(), spaced.Hash()) {
		t.Fatal("whitespace changed the hash")
	}
	reordered := e
	reordered.Payload = json.RawMessage(`{"b": 1, "amount_paise": 120000}`)
	withB := e
	withB.Payload = json.RawMessage(`{"amount_paise":120000,"b":1}`)
	if !bytes.Equal(reordered.Hash(), withB.Hash()) {
		t.Fatal("key order (as jsonb re-encodes it) changed the hash")
	}
	changed := e
	changed.Payload = json.RawMessage(`{"amount_paise":180000}`)
	if bytes.Equal(e.Hash(), changed.Hash()) {
		t.Fatal("a different payload has the same hash")
	}
	later := e
	later.AggregateVersion = 2
	if bytes.Equal(e.Hash(), later.Hash()) {
		t.Fatal("a different version has the same hash")
	}
}

func TestDecodeRefusesDuplicateFieldsAndBytesThatAreNotUTF8(t *testing.T) {
	e, err := New("PaymentSucceeded", "pay_42", 1, map[string]any{"user_id": "u_17"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.Marshal()
	other := "01938f6e-0000-7000-8000-000000000001"
	for _, c := range []struct {
		name, body, field string
	}{
		{"two event ids", strings.Replace(string(b), `"event_id":`, `"event_id":"`+other+`","event_id":`, 1), "event_id"},
		{"two payloads", strings.Replace(string(b), `"payload":`, `"payload":{},"payload":`, 1), "payload"},
		{"invalid UTF-8", strings.Replace(string(b), "pay_42", "pay_\xff42", 1), "body"},
	} {
		_, err := Decode([]byte(c.body))
		var de *DecodeError
		if !errors.As(err, &de) || de.Field != c.field {
			t.Errorf("%s: Decode = %v, want a DecodeError on %s", c.name, err, c.field)
		}
	}
	if _, dup := DuplicateField([]byte(`{"a":{"b":1,"b":2},"c":[1,1]}`)); dup {
		t.Error("DuplicateField looked inside nested values")
	}
}

// Names are compared as encoding/json decodes them: two names whose bytes
// differ but are not valid UTF-8 both decode to U+FFFD, the same name, as
// an escaped name and its plain spelling do.
func TestDuplicateFieldComparesDecodedNames(t *testing.T) {
	for _, body := range []string{"{\"\xf5\":0,\"\xe8\":0}", `{"a\u0062":1,"ab":2}`} {
		want, wantDup := DuplicateFieldByTokens([]byte(body))
		if got, dup := DuplicateField([]byte(body)); !wantDup || got != want || !dup {
			t.Errorf("DuplicateField(%q) = %q, %v; want %q, true", body, got, dup, want)
		}
	}
}

// A body with very many fields is scanned in linear time: 100,000 distinct
// names, then a repeat of the first, are found in well under a second
// (a pairwise comparison would take minutes).
func TestDuplicateFieldStaysLinearInTheNumberOfFields(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := range 100000 {
		fmt.Fprintf(&b, `"f%d":%d,`, i, i)
	}
	b.WriteString(`"f0":1}`)
	start := time.Now()
	name, dup := DuplicateField([]byte(b.String()))
	if !dup || name != "f0" {
		t.Fatalf("DuplicateField = %q, %v; want f0, true", name, dup)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("DuplicateField took %v over 100,000 fields", el)
	}
}

// Validate refuses an occurred_at the JSON envelope cannot carry (a year
// outside 0..9999, in its own zone or in UTC, where the relay encodes it),
// so Add never stores a row the relay cannot send; the ends of the range
// still encode.
func TestValidateRefusesAnOccurredAtTheEnvelopeCannotCarry(t *testing.T) {
	e, err := New("PaymentSucceeded", "pay_42", 1, map[string]any{"amount_paise": 120000})
	if err != nil {
		t.Fatal(err)
	}
	east := time.FixedZone("UTC+1", 3600)
	for _, c := range []struct {
		at time.Time
		ok bool
	}{
		{time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), true},
		{time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC), false},
		{time.Date(10000, 1, 1, 0, 30, 0, 0, east), false},                             // 9999 in UTC, 10000 as written
		{time.Date(0, 1, 1, 0, 30, 0, 0, east), false},                                 // year -1 in UTC
		{time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("UTC-1", -3600)), false}, // 10000 in UTC
	} {
		e.OccurredAt = c.at
		err := e.Validate()
		var de *DecodeError
		if c.ok {
			if err != nil {
				t.Errorf("Validate(occurred_at %v) = %v, want nil", c.at, err)
				continue
			}
			if _, err := e.Marshal(); err != nil {
				t.Errorf("Marshal(occurred_at %v) = %v after Validate passed it", c.at, err)
			}
			if _, err := (Envelope{EventID: e.EventID, EventType: e.EventType, AggregateID: e.AggregateID,
				OccurredAt: c.at.UTC(), Payload: e.Payload}).AppendJSON(nil); err != nil {
				t.Errorf("AppendJSON(occurred_at %v in UTC) = %v after Validate passed it", c.at, err)
			}
			continue
		}
		if !errors.As(err, &de) || de.Field != "occurred_at" {
			t.Errorf("Validate(occurred_at %v) = %v, want a *DecodeError on occurred_at", c.at, err)
		}
	}
}
