package service

import (
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
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

// RedactURL returns s with the password of a URL replaced by "xxxxx"; any
// other string is returned as it is.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); !has {
		return s
	}
	return u.Redacted()
}
