package service

import (
	"fmt"
	"log/slog"
	"net/url"
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
// password='p w' quoted). Any other string is returned as it is.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
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
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

// kvPassword is a password (or sslpassword) in libpq's keyword/value form:
// a single-quoted value with \' and \\ escapes, or a bare word.
var kvPassword = regexp.MustCompile(`((?:^|\s)(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s']\S*|'.*)`)
