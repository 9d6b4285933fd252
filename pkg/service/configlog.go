package service

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strings"
)

// LogConfig logs cfg, a struct loaded by LoadConfig, as one "configuration"
// record keyed by environment variable name, so an operator sees what a
// process actually runs with. Fields tagged `secret:"true"` are logged as
// "***" (or "(unset)"), and the password of any URL-valued field is
// replaced by "xxxxx": a config summary must never leak a credential into
// the logs. Fields tagged `env:"-"` (wiring for tests) are left out.
func LogConfig(log *slog.Logger, cfg any) {
	v := reflect.ValueOf(cfg)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return
	}
	var attrs []any
	configAttrs(v, "", &attrs)
	log.Info("configuration", attrs...)
	names := make([]string, len(attrs))
	for i, a := range attrs {
		names[i] = a.(slog.Attr).Key
	}
	for _, m := range nearMisses(names, os.Environ()) {
		log.Warn("environment variable ignored: it is not a setting of this service, but nearly the name of one",
			"variable", m[0], "did_you_mean", m[1])
	}
}

// nearMisses returns, for each variable of environ that is not one of
// names but one or two letters away from one (a letter left out, added,
// changed or two swapped), that variable and the name it is near: a
// misspelt setting, which would otherwise leave the service on its
// default without a word. Short names are left out, being near too much,
// and so is a name that is the other's plural: a client's X_API_KEY (the
// key it sends) and a server's X_API_KEYS (the keys it accepts) share one
// environment in a local stack.
func nearMisses(names, environ []string) [][2]string {
	known := make(map[string]bool, len(names))
	for _, n := range names {
		known[n] = true
	}
	var out [][2]string
	for _, kv := range environ {
		v, _, _ := strings.Cut(kv, "=")
		if known[v] || len(v) < 6 {
			continue
		}
		for _, n := range names {
			if len(n) >= 6 && v+"S" != n && n+"S" != v && editDistance(v, n) <= 2 {
				out = append(out, [2]string{v, n})
				break
			}
		}
	}
	return out
}

// editDistance is the optimal string alignment distance of a and b: the
// fewest insertions, deletions, substitutions and swaps of two adjacent
// bytes that turn one into the other.
func editDistance(a, b string) int {
	if d := len(a) - len(b); d > 2 || d < -2 {
		return 3 // far enough: the only answer that matters is "more than 2"
	}
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

func configAttrs(v reflect.Value, prefix string, attrs *[]any) {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "-" {
			continue
		}
		if p, ok := f.Tag.Lookup("envPrefix"); ok && fv.Kind() == reflect.Struct {
			configAttrs(fv, prefix+p, attrs)
			continue
		}
		if name == "" {
			continue
		}
		*attrs = append(*attrs, slog.String(prefix+name, configValue(fv, f.Tag.Get("secret") == "true")))
	}
}

func configValue(v reflect.Value, secret bool) string {
	s := fmt.Sprint(v.Interface())
	switch {
	case secret && v.IsZero():
		return "(unset)"
	case secret:
		return "***"
	}
	return RedactURL(s)
}

// RedactURL returns s with every password pgx accepts in a connection
// string replaced by "xxxxx": the user info of a URL
// (postgres://u:pw@host), its query parameters password= and sslpassword=,
// and the same keys in the keyword/value form (host=h password=pw, or
// password='p w' quoted). A URL whose password holds a character it should
// have percent-encoded (postgres://u:p#w@host, u:p?w@, u:p/w@), which
// url.Parse refuses or misreads but pgx may connect with, is masked from
// the user's ':' to the last '@' and in every password= parameter: that may
// hide more than the password, never less. Any other string is returned as
// it is.
func RedactURL(s string) string {
	scheme, rest, isURL := strings.Cut(s, "://")
	if !isURL || !urlScheme.MatchString(scheme) {
		return kvPassword.ReplaceAllString(s, "${1}xxxxx")
	}
	// url.Parse reads the password where pgx (as libpq) does only if no
	// '@' or '#' follows the host: else a password may be in what it took
	// for the host, path, query or fragment.
	tail := rest[strings.IndexAny(rest+"/", "/?#"):]
	if u, err := url.Parse(s); err == nil && u.Host != "" && !strings.ContainsAny(tail, "@#") {
		changed := false
		if _, has := u.User.Password(); has {
			u.User, changed = url.UserPassword(u.User.Username(), "xxxxx"), true
		}
		q := u.Query()
		for _, k := range []string{"password", "sslpassword"} {
			if q.Has(k) {
				q.Set(k, "xxxxx")
				changed = true
			}
		}
		if !changed {
			return s
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, _, has := strings.Cut(rest[:at], ":"); has {
			rest = user + ":xxxxx" + rest[at:]
		}
	}
	return scheme + "://" + queryParam.ReplaceAllStringFunc(rest, func(p string) string {
		key, _, _ := strings.Cut(p[1:], "=")
		if k, err := url.PathUnescape(key); err == nil && (k == "password" || k == "sslpassword") {
			return p[:1] + key + "=xxxxx"
		}
		return p
	})
}

// kvPassword is a password (or sslpassword) in libpq's keyword/value form:
// a single-quoted value with \' and \\ escapes, or a bare word.
var kvPassword = regexp.MustCompile(`((?:^|\s)(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s']\S*|'.*)`)

// urlScheme is the scheme of a URL (RFC 3986), which a keyword/value
// string, holding '=' or a space before any "://", never matches.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// queryParam is a query parameter as libpq reads one: from '?' or '&' to
// the next '&', '#' included.
var queryParam = regexp.MustCompile(`[?&][^?&=]*=[^&]*`)
