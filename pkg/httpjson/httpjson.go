// Package httpjson reads the JSON body of an HTTP request strictly, and
// refuses what it will not take with an answer a client can act on: one
// of the error bodies of pkg/errs, naming the offending field, in words of
// its own. No refusal carries encoding/json's text (Go type or struct
// names, decoder internals): only the client's own field names and byte
// offsets.
//
// What Decode refuses, and with what:
//
//	a body over MaxBytes                      413 body_too_large   "body over 64 KiB"
//	a body that did not arrive in time        408 request_timeout
//	an empty body (unless DecodeOptional)     400 malformed_json   "body is empty: send a JSON object"
//	nesting deeper than MaxDepth              400 malformed_json   "body nests too deep"
//	bad syntax                                400 malformed_json   "body is not valid JSON (at byte N)"
//	a body cut short                          400 malformed_json   "body ends early"
//	anything but one object (null, [], "x")   400 malformed_json
//	data after the object                     400 malformed_json   "data after the JSON object"
//	a field given twice                       400 duplicate_field  `field "x" given twice`
//	a field dst lacks, or in another case     400 unknown_field    `unknown field "x"`
//	a value of the wrong type                 400 invalid_type     `field "x" must be an integer, not a string`
//
// The field rules hold in nested objects too, which encoding/json would
// match case-insensitively, keeping the last of two: in an object that
// decodes into a struct (a field's, or an element's of a slice, an array
// or a map) each name must be one of the struct's, exactly, and in one
// that decodes into a struct or a map each name may appear once. The
// error names the path: `unknown field "meta.NAME"`, `field "tags.a"
// given twice`, with no index for an array element, as in a type error
// ("list.name"). A value a type decodes itself (time.Time,
// json.RawMessage, any json.Unmarshaler or encoding.TextUnmarshaler) or
// that fills an interface is that type's business.
//
// A number that does not fit the field (beyond int64, a fraction or an
// exponent for an integer) is a wrong type. Strings that are not UTF-8
// decode with U+FFFD in place of the bad bytes, as encoding/json does: a
// field that must not hold them is checked by the caller's own allowlist
// (events.ValidID for ids).
//
// The package uses the standard library, pkg/errs and pkg/events (for the
// one-pass duplicate-field scan) only.
package httpjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
)

// MaxBytes is the largest body Decode reads; a longer one is 413.
const MaxBytes = 64 << 10

// MaxDepth is the deepest nesting of objects and arrays Decode accepts:
// far more than any request body of these APIs holds, far less than what
// makes a decoder work hard.
const MaxDepth = 32

// Error is a refused body: the status, code, field and message of the
// answer (errs.Body). Nothing of the request was acted on.
type Error struct {
	Status  int
	Code    string
	Field   string
	Message string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Write answers the request with e as an errs.Body.
func (e *Error) Write(w http.ResponseWriter) { errs.Write(w, e.Status, e.Code, e.Field, e.Message) }

// Invalid is a 400 with code, naming field, whose message is the formatted
// text: for the checks a caller makes after Decode.
func Invalid(code, field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Decode reads r's body, at most MaxBytes, and decodes the one JSON object
// it must hold into dst, a pointer to a struct of named fields, strictly:
// each field of the object must be one of dst's, by its exact JSON name,
// at most once, of the field's type, and so must each field of a nested
// object that decodes into a struct (see the package doc); nothing may
// follow the object. On error dst may have been partly filled and must
// not be used; the answer to write is the returned Error.
func Decode(w http.ResponseWriter, r *http.Request, dst any) *Error {
	return decode(w, r, dst, false)
}

// DecodeOptional is Decode for a body that may also be empty (or only
// white space), which leaves dst as it is.
func DecodeOptional(w http.ResponseWriter, r *http.Request, dst any) *Error {
	return decode(w, r, dst, true)
}

func decode(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) *Error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &Error{http.StatusRequestEntityTooLarge, "body_too_large", "body", fmt.Sprintf("body over %d KiB", MaxBytes>>10)}
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return &Error{http.StatusRequestTimeout, "request_timeout", "body", "the request body did not arrive in time"}
		}
		return malformed("the request body could not be read")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return malformed("body is empty: send a JSON object")
	}
	return Unmarshal(body, dst)
}

// Unmarshal is Decode's check and decoding of a body already read.
func Unmarshal(body []byte, dst any) *Error {
	fields, bad := object(body)
	if bad != nil {
		return bad
	}
	if name, dup := events.DuplicateField(body); dup {
		// encoding/json keeps the last value silently; a client (or a proxy
		// in the middle) may have meant the first.
		name = cutName(name)
		return &Error{http.StatusBadRequest, "duplicate_field", name, fmt.Sprintf("field %q given twice", name)}
	}
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic("httpjson: dst must be a pointer to a struct")
	}
	v = v.Elem()
	known := jsonFields(v.Type())
	for name := range fields {
		if _, ok := known[name]; !ok {
			name = cutName(name)
			return &Error{http.StatusBadRequest, "unknown_field", name, fmt.Sprintf("unknown field %q", name)}
		}
	}
	// Field by field, in the struct's order: every error names its field,
	// whatever the field's type does when it decodes (time.Time, say,
	// returns a parse error that names none).
	for i := range v.NumField() {
		name := fieldName(v.Type().Field(i))
		raw, ok := fields[name]
		if name == "" || !ok {
			continue
		}
		f := v.Field(i)
		if bad := nested(raw, f.Type(), name); bad != nil {
			return bad
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(f.Addr().Interface()); err != nil {
			return typeError(name, f.Type(), err)
		}
	}
	return nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// nested holds the objects inside raw, the value of the field at path, of
// type t, to the rules of the body's own fields, which encoding/json does
// not apply below the top: in an object that decodes into a struct each
// name must be one of the struct's JSON names, exactly (encoding/json
// would take one in another case), and in any object that decodes into a
// struct or a map each name may appear once (encoding/json keeps the last
// silently). It descends through pointers, slices, arrays and map values;
// a type that decodes itself (time.Time, json.RawMessage, any other
// json.Unmarshaler or encoding.TextUnmarshaler) and an interface are left
// as they are. A value of another shape than t's, or bad syntax, is left
// to the decoder, whose type error names the field.
func nested(raw json.RawMessage, t reflect.Type, path string) *Error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Slice, reflect.Array:
	default:
		return nil // a scalar or an interface: nothing nested to check
	}
	if pt := reflect.PointerTo(t); pt.Implements(jsonUnmarshaler) || pt.Implements(textUnmarshaler) {
		return nil
	}
	s := bytes.TrimLeft(raw, " \t\r\n")
	dec := json.NewDecoder(bytes.NewReader(s))
	switch {
	case (t.Kind() == reflect.Struct || t.Kind() == reflect.Map) && len(s) > 0 && s[0] == '{':
		var fields map[string]reflect.Type
		if t.Kind() == reflect.Struct {
			fields = promotedFields(t)
		}
		seen := map[string]bool{}
		if _, err := dec.Token(); err != nil {
			return nil
		}
		for dec.More() {
			tok, err := dec.Token()
			key, ok := tok.(string)
			if err != nil || !ok {
				return nil
			}
			at := cutName(path + "." + key)
			if seen[key] {
				return &Error{http.StatusBadRequest, "duplicate_field", at, fmt.Sprintf("field %q given twice", at)}
			}
			seen[key] = true
			var elem reflect.Type
			if fields == nil {
				elem = t.Elem() // a map's values
			} else if elem, ok = fields[key]; !ok {
				return &Error{http.StatusBadRequest, "unknown_field", at, fmt.Sprintf("unknown field %q", at)}
			}
			var v json.RawMessage
			if dec.Decode(&v) != nil {
				return nil
			}
			if bad := nested(v, elem, path+"."+key); bad != nil {
				return bad
			}
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && len(s) > 0 && s[0] == '[':
		if _, err := dec.Token(); err != nil {
			return nil
		}
		for dec.More() {
			var v json.RawMessage
			if dec.Decode(&v) != nil {
				return nil
			}
			// No index in the path, as in encoding/json's own ("list.name").
			if bad := nested(v, t.Elem(), path); bad != nil {
				return bad
			}
		}
	}
	return nil
}

// promotedFields maps the JSON names of a nested struct's fields to their
// types as encoding/json decodes them: the fields of an embedded struct
// without a JSON name of its own count as the outer struct's, a shallower
// name hiding a deeper one. (Two of one name at one depth are both listed;
// the decoder, which drops such a name, then refuses it.)
func promotedFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	visited := map[reflect.Type]bool{}
	for level := []reflect.Type{t}; len(level) > 0; {
		var next []reflect.Type
		found := map[string]reflect.Type{}
		for _, st := range level {
			if visited[st] {
				continue
			}
			visited[st] = true
			for i := range st.NumField() {
				f := st.Field(i)
				tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				switch {
				case tag == "-":
					continue
				case f.Anonymous && tag == "" && ft.Kind() == reflect.Struct:
					next = append(next, ft)
					continue
				case !f.IsExported():
					continue
				}
				name := tag
				if name == "" {
					name = f.Name
				}
				if _, hidden := fields[name]; !hidden {
					found[name] = f.Type
				}
			}
		}
		for name, ft := range found {
			fields[name] = ft
		}
		level = next
	}
	return fields
}

// object checks that body is one JSON object, not nested beyond MaxDepth,
// and returns its fields.
func object(body []byte) (map[string]json.RawMessage, *Error) {
	if tooDeep(body) {
		return nil, malformed("body nests too deep")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var fields map[string]json.RawMessage
	if err := dec.Decode(&fields); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syntax):
			return nil, malformed(fmt.Sprintf("body is not valid JSON (at byte %d)", syntax.Offset))
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, malformed("body ends early")
		case errors.As(err, &typ):
			return nil, malformed("body must be a JSON object")
		default:
			return nil, malformed("body is not valid JSON")
		}
	}
	if fields == nil {
		return nil, malformed("body must be a JSON object, not null")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed("data after the JSON object")
	}
	return fields, nil
}

func malformed(message string) *Error {
	return &Error{http.StatusBadRequest, "malformed_json", "body", message}
}

// tooDeep reports whether objects and arrays in body nest deeper than
// MaxDepth; brackets inside strings do not count. It does not check the
// syntax (the decoder does).
func tooDeep(body []byte) bool {
	depth, inString := 0, false
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			if depth++; depth > MaxDepth {
				return true
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return false
}

// MaxFieldName bounds a field name an error repeats: a name the caller
// made up (an unknown or repeated field) is cut to its first MaxFieldName
// bytes, on a character boundary, so a 60 KB key is not sent back.
const MaxFieldName = 64

func cutName(name string) string {
	if len(name) <= MaxFieldName {
		return name
	}
	cut := MaxFieldName
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut]
}

// typeError is the answer to field's value not decoding into a t. Only
// the JSON kind of the value is named, never the value itself.
func typeError(field string, t reflect.Type, err error) *Error {
	msg := ""
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		if typ.Field != "" { // inside an object: the path below field
			field = cutName(field + "." + typ.Field)
		}
		t = typ.Type
		word, literal, _ := strings.Cut(typ.Value, " ")
		switch {
		case word == "number" && literal != "":
			// A number that does not fit: beyond the type's range, a
			// fraction or an exponent for an integer.
			msg = fmt.Sprintf("field %q must be %s: a number in range, %s", field, kindOfType(t), wholeOrNot(t))
		case kindOfValue(word) != "":
			msg = fmt.Sprintf("field %q must be %s, not %s", field, kindOfType(t), kindOfValue(word))
		}
	}
	if msg == "" {
		msg = fmt.Sprintf("field %q must be %s", field, kindOfType(t))
	}
	return &Error{http.StatusBadRequest, "invalid_type", field, msg}
}

func wholeOrNot(t reflect.Type) string {
	if strings.HasSuffix(kindOfType(t), "integer") {
		return "written without a fraction or an exponent"
	}
	return "as JSON writes it"
}

var timeType = reflect.TypeFor[time.Time]()

// kindOfType says, in a client's words, what a value of t is in JSON.
func kindOfType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == timeType {
		return "an RFC 3339 time"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	default:
		return "a value of another kind"
	}
}

// kindOfValue says what encoding/json saw ("number", "string", "bool",
// "object", "array"), in a client's words.
func kindOfValue(word string) string {
	switch word {
	case "number":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "object":
		return "an object"
	case "array":
		return "an array"
	}
	return ""
}

// jsonFields lists the JSON names of a struct's fields.
func jsonFields(t reflect.Type) map[string]struct{} {
	names := map[string]struct{}{}
	for i := range t.NumField() {
		if name := fieldName(t.Field(i)); name != "" {
			names[name] = struct{}{}
		}
	}
	return names
}

// fieldName is f's JSON name: its tag's, else its Go name; "" for a field
// encoding/json skips (unexported, or tagged "-").
func fieldName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return f.Name
	}
	return name
}
