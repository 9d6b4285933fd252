package events

import (
	"unicode/utf16"
	"unicode/utf8"
)

// EscapeForSQS returns the JSON body with every character that a queue
// may refuse written as a JSON \u escape: U+FFFE and U+FFFF, which SQS
// refuses in a message, and every character above U+FFFF (an emoji, say),
// which SQS accepts and some SQS-compatible servers refuse. The result is
// the same JSON (it decodes to the same values and has the same Hash), in
// characters every queue carries. body itself is returned when it holds
// none of them, as most do.
//
// body must be JSON: outside its strings it is ASCII, so each character
// escaped is inside a string, where an escape stands for that character.
func EscapeForSQS(body []byte) []byte {
	var out []byte
	done := 0 // body[:done] is in out
	for i := 0; i < len(body); {
		if body[i] < 0xEF { // U+F000 and above start with 0xEF or more
			i++
			continue
		}
		r, n := utf8.DecodeRune(body[i:])
		if QueueSafe(r) || n == 1 { // an invalid byte is left for the queue to refuse
			i += n
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(body)+32)
		}
		out = append(out, body[done:i]...)
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			out = appendEscape(appendEscape(out, hi), lo)
		} else {
			out = appendEscape(out, r)
		}
		i += n
		done = i
	}
	if out == nil {
		return body
	}
	return append(out, body[done:]...)
}

// QueueSafe reports whether every SQS server carries r as it is in a
// message or an attribute: SQS's characters (tab, line feed, carriage
// return, U+0020 to U+D7FF, U+E000 to U+FFFD) less those above U+FFFF.
func QueueSafe(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD)
}

func appendEscape(dst []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(dst, '\\', 'u', hex[r>>12&0xF], hex[r>>8&0xF], hex[r>>4&0xF], hex[r&0xF])
}
