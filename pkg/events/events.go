// Package events defines the envelope every message on the wire carries, and
// the strict decoder that turns an SQS body back into one.
//
// The envelope's EventID is the dedupe key for every consumer: it is assigned
// once by the producer (it equals the outbox row id) and survives relay
// resends, visibility-timeout redeliveries and DLQ redrives unchanged, unlike
// the SQS MessageId. Event ids are UUIDv7, so they are time-ordered: dedupe
// indexes stay append-mostly and processed_messages can be partitioned by the
// id's own timestamp.
package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxBodyBytes is the largest body SQS accepts (256 KiB); Decode refuses
// anything bigger before parsing it.
const MaxBodyBytes = 256 * 1024

// Envelope is the JSON body of every SQS message.
type Envelope struct {
	EventID          uuid.UUID       `json:"event_id"`
	EventType        string          `json:"event_type"`
	AggregateID      string          `json:"aggregate_id"`
	AggregateVersion int64           `json:"aggregate_version"`
	OccurredAt       time.Time       `json:"occurred_at"`
	Payload          json.RawMessage `json:"payload"`
}

// New builds an envelope with a fresh UUIDv7 event id and occurred_at = now
// (UTC, microsecond precision so it survives a PostgreSQL round trip
// unchanged). payload is marshalled to JSON and must encode as an object.
func New(eventType, aggregateID string, aggregateVersion int64, payload any) (Envelope, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Envelope{}, fmt.Errorf("events: new event id: %w", err)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return Envelope{}, fmt.Errorf("events: marshal payload: %w", err)
	}
	e := Envelope{
		EventID:          id,
		EventType:        eventType,
		AggregateID:      aggregateID,
		AggregateVersion: aggregateVersion,
		OccurredAt:       time.Now().UTC().Truncate(time.Microsecond),
		Payload:          raw,
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// DecodeError says which field of a body was wrong and why. Decode returns
// it for every malformed input, so callers can park the message with a
// reason a human can act on.
type DecodeError struct {
	Field  string // JSON field name, or "body" for the document as a whole
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("events: invalid %s: %s", e.Field, e.Reason)
}

// IsDecodeError reports whether err (or anything it wraps) is a *DecodeError.
func IsDecodeError(err error) bool {
	var de *DecodeError
	return errors.As(err, &de)
}

// wire mirrors Envelope with every field optional, so that Decode can tell
// "missing" from "zero" and name the field in its error.
type wire struct {
	EventID          *string         `json:"event_id"`
	EventType        *string         `json:"event_type"`
	AggregateID      *string         `json:"aggregate_id"`
	AggregateVersion *int64          `json:"aggregate_version"`
	OccurredAt       *string         `json:"occurred_at"`
	Payload          json.RawMessage `json:"payload"`
}

// Decode parses and validates an SQS body. It rejects, with a *DecodeError
// naming the field: bodies over MaxBodyBytes or not UTF-8, malformed JSON, unknown
// top-level fields, a missing or non-UUIDv7 event_id, missing event_type or
// aggregate_id, a negative aggregate_version, an occurred_at that is not
// RFC 3339, and a payload that is not a JSON object. It does not judge the
// event type: which types a consumer accepts is the consumer's business.
func Decode(body []byte) (Envelope, error) {
	if len(body) > MaxBodyBytes {
		return Envelope{}, &DecodeError{"body", fmt.Sprintf("%d bytes exceeds the %d byte limit", len(body), MaxBodyBytes)}
	}
	if !utf8.Valid(body) {
		// encoding/json would quietly turn the bad bytes into U+FFFD.
		return Envelope{}, &DecodeError{"body", "not valid UTF-8"}
	}
	if name, dup := DuplicateField(body); dup {
		// encoding/json would keep the last one: which event_id is meant?
		return Envelope{}, &DecodeError{name, "appears more than once"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w wire
	if err := dec.Decode(&w); err != nil {
		return Envelope{}, wireError(err)
	}
	if dec.More() {
		return Envelope{}, &DecodeError{"body", "trailing data after the JSON object"}
	}
	var e Envelope
	if w.EventID == nil {
		return Envelope{}, &DecodeError{"event_id", "missing"}
	}
	id, err := uuid.Parse(*w.EventID)
	if err != nil {
		return Envelope{}, &DecodeError{"event_id", "not a UUID"}
	}
	e.EventID = id
	if w.EventType == nil {
		return Envelope{}, &DecodeError{"event_type", "missing"}
	}
	e.EventType = *w.EventType
	if w.AggregateID == nil {
		return Envelope{}, &DecodeError{"aggregate_id", "missing"}
	}
	e.AggregateID = *w.AggregateID
	if w.AggregateVersion == nil {
		return Envelope{}, &DecodeError{"aggregate_version", "missing"}
	}
	e.AggregateVersion = *w.AggregateVersion
	if w.OccurredAt == nil {
		return Envelope{}, &DecodeError{"occurred_at", "missing"}
	}
	t, err := time.Parse(time.RFC3339Nano, *w.OccurredAt)
	if err != nil {
		return Envelope{}, &DecodeError{"occurred_at", "not an RFC 3339 timestamp"}
	}
	e.OccurredAt = t.UTC()
	e.Payload = w.Payload
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// DuplicateField reports the first top-level field name that appears more
// than once in the JSON object body (encoding/json silently keeps the last
// value). It reports nothing for a body that is not a well-formed object.
//
// Every message is checked, so the common case is a single pass over the
// bytes that allocates only for the names; a name seen twice (or an
// escaped name or one that is not UTF-8, which only a decoder can compare)
// is confirmed by encoding/json's tokenizer, whose answer is the one
// returned.
func DuplicateField(body []byte) (string, bool) {
	if !mayRepeatField(body) {
		return "", false
	}
	return duplicateFieldByTokens(body)
}

// mayRepeatField scans the top-level object of body and reports whether a
// name appears twice, is escaped or is not UTF-8; false also for what it
// cannot parse (Decode then rejects the body as malformed).
func mayRepeatField(b []byte) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	// Envelopes and request bodies have a handful of fields, compared in a
	// slice; a body with many (hostile, say) moves to a map, so the scan
	// stays linear.
	var seen []string
	var many map[string]bool
	for i++; ; {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] == '}' {
			return false
		}
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end, escaped := stringEnd(b, i)
		if end < 0 {
			return false
		}
		// An escape, or bytes that are not UTF-8 (decoded as U+FFFD, so two
		// different ones are one name), is compared only by a decoder.
		if escaped || !utf8.Valid(b[i+1:end-1]) {
			return true
		}
		name := string(b[i+1 : end-1])
		if many != nil {
			if many[name] {
				return true
			}
			many[name] = true
		} else {
			if slices.Contains(seen, name) {
				return true
			}
			if seen = append(seen, name); len(seen) > 16 {
				many = make(map[string]bool, 2*len(seen))
				for _, n := range seen {
					many[n] = true
				}
			}
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		if i = valueEnd(b, skipSpace(b, i+1)); i < 0 {
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i] ('"'),
// and whether it holds an escape; -1 if it does not end.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, false
}

// valueEnd returns the index of the ',' or '}' that ends the JSON value
// starting at b[i], or -1. Nested objects and arrays are skipped by depth,
// strings by their quotes; what is inside is not checked (Decode does).
func valueEnd(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			end, _ := stringEnd(b, i)
			if end < 0 {
				return -1
			}
			i = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// duplicateFieldByTokens is DuplicateField by encoding/json's tokenizer.
func duplicateFieldByTokens(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := tok.(string)
		if seen[name] {
			return name, true
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

func wireError(err error) error {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) && ute.Field != "" {
		return &DecodeError{ute.Field, "wrong JSON type " + ute.Value}
	}
	msg := err.Error()
	const unknown = "json: unknown field "
	if len(msg) > len(unknown) && msg[:len(unknown)] == unknown {
		return &DecodeError{msg[len(unknown)+1 : len(msg)-1], "unknown top-level field"}
	}
	return &DecodeError{"body", "malformed JSON: " + msg}
}

// Validate checks the invariants Decode enforces; producers call it (New
// does) so that nothing undecodable is ever written to an outbox. It also
// refuses an occurred_at whose year, as written or in UTC, is outside
// 0..9999: JSON (time.Time.MarshalJSON) cannot carry it, so the envelope
// could be stored but never sent.
func (e Envelope) Validate() error {
	switch {
	case e.EventID == uuid.Nil:
		return &DecodeError{"event_id", "missing"}
	case e.EventID.Version() != 7:
		return &DecodeError{"event_id", fmt.Sprintf("must be a UUIDv7, got version %d", e.EventID.Version())}
	case e.EventType == "":
		return &DecodeError{"event_type", "empty"}
	case strings.IndexFunc(e.EventType, func(r rune) bool { return !QueueSafe(r) }) >= 0:
		// It is a message attribute too, where no JSON escape helps.
		return &DecodeError{"event_type", "holds a character a queue may refuse (a control character, U+FFFE or U+FFFF, or one above U+FFFF)"}
	case e.AggregateID == "":
		return &DecodeError{"aggregate_id", "empty"}
	case e.AggregateVersion < 0:
		return &DecodeError{"aggregate_version", "negative"}
	case e.OccurredAt.IsZero():
		return &DecodeError{"occurred_at", "missing"}
	case !encodableYear(e.OccurredAt.Year()) || !encodableYear(e.OccurredAt.UTC().Year()):
		// json refuses it (time.Time.MarshalJSON), as written or in UTC,
		// where the relay encodes a stored row: a row no relay could send.
		return &DecodeError{"occurred_at", fmt.Sprintf("year of %s outside 0..9999, which JSON cannot carry", e.OccurredAt.Format(time.RFC3339Nano))}
	}
	p := bytes.TrimSpace(e.Payload)
	if len(p) == 0 || p[0] != '{' || !json.Valid(p) {
		return &DecodeError{"payload", "must be a JSON object"}
	}
	return nil
}

// encodableYear reports whether time.Time.MarshalJSON encodes a time of
// year y (RFC 3339 has four digits for it).
func encodableYear(y int) bool { return y >= 0 && y <= 9999 }

// Marshal encodes the envelope as the wire body.
func (e Envelope) Marshal() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e.AppendJSON(nil)
}

// Hash is a digest of everything in the envelope but its id. Consumers store
// it beside the dedupe key: a later copy with the same event_id and a
// different Hash is a conflict (a buggy producer reusing an id), not a
// duplicate. The payload is canonicalised first (object keys sorted,
// whitespace dropped, numbers kept digit for digit), so the same JSON
// re-encoded, e.g. by a jsonb column that reorders keys, hashes the same.
func (e Envelope) Hash() []byte {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(e.EventType))
	field([]byte(e.AggregateID))
	binary.BigEndian.PutUint64(n[:], uint64(e.AggregateVersion))
	h.Write(n[:])
	field([]byte(e.OccurredAt.UTC().Format(time.RFC3339Nano)))
	field(canonical(e.Payload))
	return h.Sum(nil)
}

// canonical re-encodes JSON with sorted keys (encoding/json sorts map keys)
// and json.Number for numbers; invalid JSON is hashed as it is.
func canonical(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// IDTime is the creation time encoded in a UUIDv7 event id (millisecond
// precision). processed_messages is partitioned by it.
func IDTime(id uuid.UUID) time.Time {
	sec, nsec := id.Time().UnixTime()
	return time.Unix(sec, nsec).UTC()
}
