package events_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
)

// AppendJSON writes exactly json.Marshal's bytes for the bodies the relay
// builds from outbox rows: a payload as a jsonb column prints it (spaces
// after ':' and ','), compacted, and a prefix already in dst kept.
func TestAppendJSONWritesWhatJSONMarshalWrites(t *testing.T) {
	e := events.Envelope{EventID: uuid.Must(uuid.NewV7()), EventType: "PaymentSucceeded", AggregateID: "pay_42", AggregateVersion: 3,
		OccurredAt: time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC),
		Payload:    json.RawMessage(`{"user_id": "u_17", "amount_paise": 120000, "tags": ["a", "b"], "note": "ünï"}`)}
	want, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.AppendJSON([]byte("prefix:"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "prefix:"+string(want) {
		t.Fatalf("AppendJSON:\n got %s\nwant prefix:%s", got, want)
	}
	if !bytes.Contains(got, []byte(`"payload":{"user_id":"u_17","amount_paise":120000,"tags":["a","b"],"note":"ünï"}}`)) {
		t.Fatalf("payload not compacted: %s", got)
	}
}

// FuzzAppendJSON: for any envelope, AppendJSON returns json.Marshal's bytes,
// or fails when json.Marshal fails, leaving what dst held before intact.
func FuzzAppendJSON(f *testing.F) {
	id := uuid.Must(uuid.NewV7())
	f.Add(id[:], "PaymentSucceeded", "pay_42", int64(1), int64(1764669600123456000), "Asia/Kolkata", []byte(`{"a": 1}`))
	f.Add(id[:], "X<&>", "pay_\xff\u2028\"\\\n", int64(-1), int64(0), "UTC", []byte(`{"a": "<b>&\u2029", "c": [1, 2.50, {}]}`))
	f.Add(id[:], "", "", int64(0), int64(-62135596800000000000/10), "", []byte(nil))
	f.Add(id[:], "T", "a", int64(9), int64(253402300800000000000/1000), "UTC", []byte(`{"a":`))
	f.Add(id[:], "T", "a", int64(9), int64(1), "UTC", []byte("  {\"é\": \"\xff\"} "))
	f.Fuzz(func(t *testing.T, idb []byte, typ, agg string, ver, nanos int64, zone string, payload []byte) {
		var u uuid.UUID
		copy(u[:], idb)
		loc, err := time.LoadLocation(zone)
		if err != nil {
			loc = time.FixedZone("odd", int(nanos%100000))
		}
		// Seconds far out of range, too, for the years json.Marshal refuses.
		at := time.Unix(nanos/10, nanos%1000).In(loc)
		e := events.Envelope{EventID: u, EventType: typ, AggregateID: agg, AggregateVersion: ver, OccurredAt: at, Payload: payload}
		want, werr := json.Marshal(e)
		got, gerr := e.AppendJSON([]byte("x"))
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("json.Marshal error %v, AppendJSON error %v", werr, gerr)
		}
		if werr != nil {
			if string(got) != "x" {
				t.Fatalf("AppendJSON failed but changed dst: %q", got)
			}
			return
		}
		if string(got) != "x"+string(want) {
			t.Fatalf("AppendJSON:\n got %q\nwant x%q", got, want)
		}
	})
}
