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
			err := load(c.Args)
			switch {
			case len(c.Want) == 0 && err != nil:
				t.Fatalf("refused: %v", err)
			case len(c.Want) > 0 && err == nil:
				t.Fatalf("accepted; want an error naming %q", c.Want)
			}
			for _, w := range c.Want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not hold %q", err, w)
				}
			}
		})
	}
}
