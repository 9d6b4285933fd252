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
		{"nested unknown", `{"inner":{"m":1}}`, 400, "unknown_field", "inner.m", `unknown field "inner.m"`},
		{"nested other case", `{"inner":{"N":1}}`, 400, "unknown_field", "inner.N", `unknown field "inner.N"`},
		{"nested duplicate", `{"inner":{"n":1,"n":2}}`, 400, "duplicate_field", "inner.n", `field "inner.n" given twice`},
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

type profile struct {
	Name string `json:"name"`
}

// member embeds profile: encoding/json takes profile's fields as its own.
type member struct {
	profile
	Role string `json:"role"`
}

type nestedRequest struct {
	Meta    profile             `json:"meta"`
	Team    []member            `json:"team"`
	List    []profile           `json:"list"`
	ByID    map[string]*profile `json:"by_id"`
	Grid    [][]profile         `json:"grid"`
	Labels  map[string]string   `json:"labels"`
	Created time.Time           `json:"created"`
	Raw     json.RawMessage     `json:"raw"`
}

// Inside a nested object encoding/json matches names case-insensitively
// and keeps the last of two: {"meta":{"name":"alice","NAME":"mallory"}}
// would decode to mallory. A nested object that decodes into a struct,
// in a slice or a map too, is held to the body's own rules: exact names
// of the struct's fields, each at most once (a map's keys too); the error
// names the path to the field.
func TestANestedFieldInAnotherCaseOrGivenTwiceIsRefusedLikeATopLevelOne(t *testing.T) {
	cases := []struct{ body, code, field string }{
		{`{"meta":{"name":"alice","NAME":"mallory"}}`, "unknown_field", "meta.NAME"},
		{`{"meta":{"NAME":"x"}}`, "unknown_field", "meta.NAME"},
		{`{"meta":{"name":"alice","name":"mallory"}}`, "duplicate_field", "meta.name"},
		{`{"meta":{"nick":"x"}}`, "unknown_field", "meta.nick"},
		{`{"list":[{"name":"x"},{"Name":"y"}]}`, "unknown_field", "list.Name"},
		{`{"by_id":{"u1":{"name":"x","NaMe":"y"}}}`, "unknown_field", "by_id.u1.NaMe"},
		{`{"by_id":{"u1":{"name":"x"},"u1":{"name":"y"}}}`, "duplicate_field", "by_id.u1"},
		{`{"grid":[[{"name":"x"}],[{"NAME":"y"}]]}`, "unknown_field", "grid.NAME"},
		{`{"team":[{"role":"r","NAME":"y"}]}`, "unknown_field", "team.NAME"},
		{`{"team":[{"profile":{"name":"y"}}]}`, "unknown_field", "team.profile"},
		{`{"labels":{"a":"1","a":"2"}}`, "duplicate_field", "labels.a"},
		{`{"meta":{"` + strings.Repeat("é", 100) + `":1}}`, "unknown_field", ("meta." + strings.Repeat("é", 100))[:httpjson.MaxFieldName-1]},
	}
	for _, c := range cases {
		var v nestedRequest
		bad := httpjson.Unmarshal([]byte(c.body), &v)
		if bad == nil {
			t.Errorf("%s accepted, decoded %+v; want %s %q", c.body, v, c.code, c.field)
			continue
		}
		if bad.Status != http.StatusBadRequest || bad.Code != c.code || bad.Field != c.field {
			t.Errorf("%s: %d %s %q (%s), want 400 %s %q", c.body, bad.Status, bad.Code, bad.Field, bad.Message, c.code, c.field)
		}
	}

	// The fields of an embedded struct are the outer one's, as in
	// encoding/json; what decodes by its own rules is left to it (a time,
	// a raw value), a map's keys may differ only in case, and a value of
	// the wrong shape is a type error, as before.
	var v nestedRequest
	good := `{"meta":{"name":"alice"},"team":[{"name":"e","role":"r"}],"list":[{"name":"a"},{"name":"b"}],"by_id":{"u1":{"name":"c"},"U1":null},` +
		`"grid":[[{"name":"d"}]],"labels":{"a":"1","A":"2"},"created":"2026-05-01T10:00:00Z","raw":{"x":1,"X":2,"x":3}}`
	if bad := httpjson.Unmarshal([]byte(good), &v); bad != nil {
		t.Fatalf("a good nested body refused: %s %q %s", bad.Code, bad.Field, bad.Message)
	}
	if v.Meta.Name != "alice" || len(v.List) != 2 || v.List[1].Name != "b" || v.ByID["u1"].Name != "c" || v.Grid[0][0].Name != "d" ||
		len(v.Team) != 1 || v.Team[0].Name != "e" || v.Team[0].Role != "r" ||
		v.Labels["A"] != "2" || v.Created.IsZero() || len(v.Raw) == 0 {
		t.Errorf("a good nested body decoded to %+v", v)
	}
	if bad := httpjson.Unmarshal([]byte(`{"meta":"alice"}`), &v); bad == nil || bad.Code != "invalid_type" || bad.Field != "meta" {
		t.Errorf("a string for an object: %+v, want invalid_type \"meta\"", bad)
	}
}
