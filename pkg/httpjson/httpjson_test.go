package httpjson_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/httpjson"
)

type request struct {
	To     string    `json:"to"`
	Amount *int64    `json:"amount"`
	At     time.Time `json:"at"`
	Tags   []string  `json:"tags"`
	Inner  *struct {
		N int `json:"n"`
	} `json:"inner"`
	hidden string // unexported: never a JSON field
}

// serve decodes body as a handler would and returns the answer written.
func serve(t *testing.T, body string, optional bool) (*httptest.ResponseRecorder, request) {
	t.Helper()
	var got request
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		decode := httpjson.Decode
		if optional {
			decode = httpjson.DecodeOptional
		}
		if bad := decode(w, r, &got); bad != nil {
			bad.Write(w)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)))
	return w, got
}

// Every refusal is one errs.Body naming the field, in the package's own
// words: never encoding/json's text, Go type or struct names.
func TestEveryRefusalNamesTheFieldInItsOwnWordsAndNeverTheDecodersText(t *testing.T) {
	cases := []struct {
		name, body  string
		status      int
		code, field string
		message     string
	}{
		{"empty", ``, 400, "malformed_json", "body", "body is empty: send a JSON object"},
		{"not JSON", `xyz`, 400, "malformed_json", "body", "body is not valid JSON (at byte 1)"},
		{"bad syntax inside", `{"to":"a",}`, 400, "malformed_json", "body", "body is not valid JSON (at byte 11)"},
		{"cut short", `{"to":`, 400, "malformed_json", "body", "body ends early"},
		{"an array", `[1,2]`, 400, "malformed_json", "body", "body must be a JSON object"},
		{"a string", `"pay me"`, 400, "malformed_json", "body", "body must be a JSON object"},
		{"null", `null`, 400, "malformed_json", "body", "body must be a JSON object, not null"},
		{"trailing object", `{"to":"a"}{}`, 400, "malformed_json", "body", "data after the JSON object"},
		{"trailing garbage", `{"to":"a"} x`, 400, "malformed_json", "body", "data after the JSON object"},
		{"too deep", `{"tags":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, 400, "malformed_json", "body", "body nests too deep"},
		{"30,000 arrays", strings.Repeat("[", 30000) + strings.Repeat("]", 30000), 400, "malformed_json", "body", "body nests too deep"},
		{"duplicate", `{"to":"a","to":"b"}`, 400, "duplicate_field", "to", `field "to" given twice`},
		{"unknown", `{"to":"a","fail_nex":1}`, 400, "unknown_field", "fail_nex", `unknown field "fail_nex"`},
		{"other case", `{"TO":"a"}`, 400, "unknown_field", "TO", `unknown field "TO"`},
		{"unexported name", `{"hidden":"a"}`, 400, "unknown_field", "hidden", `unknown field "hidden"`},
		{"number for a string", `{"to":17}`, 400, "invalid_type", "to", `field "to" must be a string, not a number`},
		{"string for an integer", `{"amount":"5"}`, 400, "invalid_type", "amount", `field "amount" must be an integer, not a string`},
		{"fraction", `{"amount":1.5}`, 400, "invalid_type", "amount",
			`field "amount" must be an integer: a number in range, written without a fraction or an exponent`},
		{"beyond int64", `{"amount":9223372036854775808}`, 400, "invalid_type", "amount",
			`field "amount" must be an integer: a number in range, written without a fraction or an exponent`},
		{"exponent", `{"amount":12e4}`, 400, "invalid_type", "amount",
			`field "amount" must be an integer: a number in range, written without a fraction or an exponent`},
		{"bool for an integer", `{"amount":true}`, 400, "invalid_type", "amount", `field "amount" must be an integer, not true or false`},
		{"not a time", `{"at":"tomorrow"}`, 400, "invalid_type", "at", `field "at" must be an RFC 3339 time`},
		{"object for an array", `{"tags":{}}`, 400, "invalid_type", "tags", `field "tags" must be an array, not an object`},
		{"nested wrong type", `{"inner":{"n":"x"}}`, 400, "invalid_type", "inner.n", `field "inner.n" must be an integer, not a string`},
		{"nested unknown", `{"inner":{"m":1}}`, 400, "invalid_type", "inner", `field "inner" must be an object`},
		{"over 64 KiB", `{"to":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "body_too_large", "body", "body over 64 KiB"},
	}
	leaks := []string{"json:", "invalid character", "unexpected EOF", "unmarshal", "Go ", "struct", "request body too large",
		"exceeded max depth", "httpjson", "time.Time", "int64", "parsing time"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, _ := serve(t, c.body, false)
			var b errs.Body
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
				t.Fatalf("answer %d %q is no errs.Body: %v", w.Code, w.Body, err)
			}
			if w.Code != c.status || b.Error.Code != c.code || b.Error.Field != c.field || b.Error.Message != c.message {
				t.Errorf("got %d %+v\nwant %d {Code:%s Field:%s Message:%s}", w.Code, b.Error, c.status, c.code, c.field, c.message)
			}
			for _, l := range leaks {
				if strings.Contains(b.Error.Message, l) {
					t.Errorf("message %q carries %q", b.Error.Message, l)
				}
			}
		})
	}
}

func TestAGoodBodyFillsTheStructAndAnOptionalOneMayBeEmpty(t *testing.T) {
	w, got := serve(t, ` {"to":"u_17","amount":120000,"at":"2026-05-01T10:00:00Z","tags":["a"],"inner":{"n":3}} `, false)
	if w.Code != http.StatusNoContent || got.To != "u_17" || got.Amount == nil || *got.Amount != 120000 ||
		!got.At.Equal(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)) || len(got.Tags) != 1 || got.Inner == nil || got.Inner.N != 3 {
		t.Errorf("%d %s, decoded %+v", w.Code, w.Body, got)
	}
	// Brackets inside strings are not nesting.
	if w, _ := serve(t, `{"to":"`+strings.Repeat("[", 100)+`"}`, false); w.Code != http.StatusNoContent {
		t.Errorf("brackets in a string: %d %s", w.Code, w.Body)
	}
	if w, _ := serve(t, " \n", true); w.Code != http.StatusNoContent {
		t.Errorf("empty optional body: %d %s", w.Code, w.Body)
	}
	if w, _ := serve(t, `{"x":1}`, true); w.Code != http.StatusBadRequest {
		t.Errorf("optional body with an unknown field: %d %s, want 400", w.Code, w.Body)
	}
}

// A made-up field name is repeated in at most MaxFieldName bytes, cut on
// a character boundary, in the message and in the error's field.
func TestAnUnknownOrRepeatedFieldIsNamedInAtMost64BytesOfValidUTF8(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes, 2 per character
	for _, body := range []string{`{"` + long + `":1}`, `{"` + long + `":1,"` + long + `":2}`} {
		w, _ := serve(t, body, false)
		var b errs.Body
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		f := b.Error.Field
		if len(f) > httpjson.MaxFieldName || len(f) < httpjson.MaxFieldName-1 || !utf8.ValidString(f) || !strings.HasPrefix(long, f) {
			t.Errorf("field %q (%d bytes), want the name's first %d bytes or one less, valid UTF-8", f, len(f), httpjson.MaxFieldName)
		}
		if strings.Contains(b.Error.Message, long[:100]) {
			t.Errorf("message repeats more than %d bytes of the name: %s", httpjson.MaxFieldName, b.Error.Message)
		}
	}
}
