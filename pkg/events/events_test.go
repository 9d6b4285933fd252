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
		// encoding/json matches names regardless of case (and folds ſ to
		// s): a second event_id in capitals would be the one it kept.
		{"event_id again in capitals", mutate(func(m map[string]any) { m["EVENT_ID"] = "01938f6e-0000-7000-8000-000000000001" }), "EVENT_ID"},
		{"only a case variant", mutate(func(m map[string]any) {
			m["Aggregate_Version"] = m["aggregate_version"]
			delete(m, "aggregate_version")
		}), "Aggregate_Version"},
		{"a name that folds to a field", mutate(func(m map[string]any) { m["aggregate_verſion"] = 9 }), "aggregate_verſion"},
		{"trailing brace", append(validBody(t), '}'), "body"},
		{"trailing brackets", append(validBody(t), []byte(" ]]]")...), "body"},
		{"event_id as a URN", mutate(func(m map[string]any) { m["event_id"] = "urn:uuid:" + m["event_id"].(string) }), "event_id"},
		{"event_id in braces", mutate(func(m map[string]any) { m["event_id"] = "{" + m["event_id"].(string) + "}" }), "event_id"},
		{"event_id without dashes", mutate(func(m map[string]any) { m["event_id"] = strings.ReplaceAll(m["event_id"].(string), "-", "") }), "event_id"},
		{"event_id of another variant", mutate(func(m map[string]any) { m["event_id"] = "01938f6e-0000-7f0b-0ec8-000000000001" }), "event_id"},
		{"aggregate_id with NUL", mutate(func(m map[string]any) { m["aggregate_id"] = "pay\x0042" }), "aggregate_id"},
		{"aggregate_id too long", mutate(func(m map[string]any) { m["aggregate_id"] = strings.Repeat("p", MaxAggregateIDBytes+1) }), "aggregate_id"},
		{"payload with an escaped NUL", []byte(strings.Replace(string(validBody(t)), `"amount_paise":120000`, `"amount_paise":120000,"note":"a\u0000b"`, 1)), "payload"},
		{"payload with a lone high surrogate", []byte(strings.Replace(string(validBody(t)), `"amount_paise":120000`, `"amount_paise":120000,"note":"\ud800"`, 1)), "payload"},
		{"payload with a lone low surrogate", []byte(strings.Replace(string(validBody(t)), `"amount_paise":120000`, `"amount_paise":120000,"note":"x\udc00"`, 1)), "payload"},
		{"a high surrogate before another escape", []byte(strings.Replace(string(validBody(t)), `"amount_paise":120000`, `"amount_paise":120000,"note":"\ud800\u0041"`, 1)), "payload"},
		{"time with a comma", mutate(func(m map[string]any) { m["occurred_at"] = "2026-12-02T10:00:00,5Z" }), "occurred_at"},
		{"offset of 24 hours", mutate(func(m map[string]any) { m["occurred_at"] = "2026-12-02T10:00:00+24:00" }), "occurred_at"},
		{"more than nanoseconds", mutate(func(m map[string]any) { m["occurred_at"] = "2026-12-02T10:00:00.1234567891Z" }), "occurred_at"},
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

// What Decode accepts PostgreSQL stores: the escapes jsonb refuses are
// refused, and the ones it takes (a surrogate pair, an escaped backslash
// before "u0000") still decode.
func TestDecodeKeepsWhatJSONBStores(t *testing.T) {
	for _, note := range []string{`"\ud83d\ude00"`, `"\\u0000"`, `"\\\ud83d\ude00"`, `"\u00e9"`} {
		body := strings.Replace(string(validBody(t)), `"amount_paise":120000`, `"amount_paise":120000,"note":`+note, 1)
		if _, err := Decode([]byte(body)); err != nil {
			t.Errorf("note %s: Decode = %v, want it accepted", note, err)
		}
	}
}

// Producers get the same answer as consumers: New refuses what Decode
// would refuse on the other side (bytes that are not UTF-8, which
// encoding/json would carry as U+FFFD, and what PostgreSQL cannot store),
// naming the field, instead of an outbox row that fails at the database or
// arrives changed.
func TestNewRefusesWhatDecodeRefuses(t *testing.T) {
	for _, c := range []struct {
		name, eventType, aggregate string
		payload                    any
		field                      string
	}{
		{"payload not UTF-8", "PaymentSucceeded", "pay_42", json.RawMessage("{\"a\":\"\xff\"}"), "payload"},
		{"payload with an escaped NUL", "PaymentSucceeded", "pay_42", json.RawMessage(`{"a":"\u0000"}`), "payload"},
		{"a NUL in a payload string", "PaymentSucceeded", "pay_42", map[string]string{"a": "x\x00"}, "payload"},
		{"event type not UTF-8", "Paid\xff", "pay_42", map[string]int{"a": 1}, "event_type"},
		{"aggregate not UTF-8", "PaymentSucceeded", "pay_\xfe", map[string]int{"a": 1}, "aggregate_id"},
		{"aggregate with NUL", "PaymentSucceeded", "pay\x0042", map[string]int{"a": 1}, "aggregate_id"},
		{"aggregate too long", "PaymentSucceeded", strings.Repeat("p", MaxAggregateIDBytes+1), map[string]int{"a": 1}, "aggregate_id"},
	} {
		_, err := New(c.eventType, c.aggregate, 1, c.payload)
		var de *DecodeError
		if !errors.As(err, &de) || de.Field != c.field {
			t.Errorf("%s: New = %v, want a DecodeError on %s", c.name, err, c.field)
		}
	}
	if _, err := New("PaymentSucceeded", strings.Repeat("p", MaxAggregateIDBytes), 1, map[string]string{"a": "é😀"}); err != nil {
		t.Errorf("the longest aggregate id and a payload of non-ASCII text: %v", err)
	}
}
