package testenv

import (
	"slices"
	"strings"
	"testing"
)

// ConfigCase is one environment given to a service's configuration loader.
type ConfigCase struct {
	Name string
	Env  map[string]string // set over the base; "" sets the variable empty
	Args []string
	Want []string // substrings the error must hold, each; none: accepted
}

// ConfigErrors runs each case as a subtest: every variable any case names is
// unset, base and the case's Env are set, and load (service.Load of the
// service's Config) must refuse it with an error holding each of Want, or
// accept it when Want is empty.
func ConfigErrors(t *testing.T, base map[string]string, load func(args []string) error, cases []ConfigCase) {
	t.Helper()
	var names []string
	for _, c := range cases {
		for k := range c.Env {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			Unsetenv(t, names...)
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range c.Env {
				t.Setenv(k, v)
			}
			WantError(t, "the environment", load(c.Args), c.Want...)
		})
	}
}

// WantError checks a validation's verdict on what: with no want (empty
// strings do not count), err must be nil; with some, err must hold each.
func WantError(t testing.TB, what string, err error, want ...string) {
	t.Helper()
	want = slices.DeleteFunc(slices.Clone(want), func(w string) bool { return w == "" })
	switch {
	case len(want) == 0 && err != nil:
		t.Errorf("%s refused: %v", what, err)
	case len(want) > 0 && err == nil:
		t.Errorf("%s accepted; want an error holding %q", what, want)
	case err != nil:
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not hold %q", what, err, w)
			}
		}
	}
}
