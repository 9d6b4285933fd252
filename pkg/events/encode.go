package events

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/google/uuid"
)

// AppendJSON appends the envelope's wire body to dst: byte for byte what
// json.Marshal(e) produces (a fuzz test holds it to that, so a body does not
// change with the encoder that wrote it), at a fraction of its cost: the
// relay encodes every row it publishes. Like json.Marshal it compacts the
// payload and fails on a payload that is not valid JSON; unlike Marshal it
// does not Validate the envelope.
func (e Envelope) AppendJSON(dst []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, `{"event_id":"`...)
	dst = appendUUID(dst, e.EventID)
	dst = append(dst, `","event_type":`...)
	dst = appendString(dst, e.EventType)
	dst = append(dst, `,"aggregate_id":`...)
	dst = appendString(dst, e.AggregateID)
	dst = append(dst, `,"aggregate_version":`...)
	dst = strconv.AppendInt(dst, e.AggregateVersion, 10)
	dst = append(dst, `,"occurred_at":"`...)
	t, err := e.OccurredAt.AppendText(dst)
	if err != nil {
		// A time json.Marshal refuses too (a year past 9999): its error.
		return e.appendMarshal(dst[:start])
	}
	dst = append(t, `","payload":`...)
	p := len(dst)
	buf := bytes.NewBuffer(dst)
	if json.Compact(buf, e.Payload) != nil {
		// Nil (json.Marshal writes null) or invalid (its error).
		return e.appendMarshal(dst[:start])
	}
	dst = buf.Bytes()
	if needsHTMLEscape(dst[p:]) {
		// json.Marshal escapes <, >, & and U+2028/9 in the payload's strings.
		return e.appendMarshal(dst[:start])
	}
	return append(dst, '}'), nil
}

// appendMarshal is AppendJSON by reflection, for the inputs its fast path
// leaves to encoding/json.
func (e Envelope) appendMarshal(dst []byte) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendUUID appends u as json.Marshal writes it (through its MarshalText),
// without the string.
func appendUUID(dst []byte, u uuid.UUID) []byte {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return append(dst, b[:]...)
}

// appendString appends s as a JSON string. A string of printable ASCII that
// json.Marshal writes unescaped (event types, aggregate ids) is copied as
// it is; any other goes through json.Marshal, whose escaping (control
// characters, HTML characters, invalid UTF-8, U+2028/9) it must match.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// needsHTMLEscape reports whether compact JSON holds what json.Marshal
// escapes in it: <, >, & or U+2028/9.
func needsHTMLEscape(b []byte) bool {
	return bytes.ContainsAny(b, "<>&") || bytes.Contains(b, []byte("\u2028")) || bytes.Contains(b, []byte("\u2029"))
}
