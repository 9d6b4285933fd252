// Package deploy holds what runs the project in containers (the compose
// file at the repository root, the Dockerfile, the PostgreSQL init script
// here) and the rules a compose file of this project must keep, checked by
// make test on every machine, Docker or not.
package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// LoadCompose parses a compose file with compose-go, the loader Docker
// Compose itself uses: anchors, merges and interpolation resolve as they
// would under `docker compose up`.
func LoadCompose(ctx context.Context, path string) (*types.Project, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: path, Content: b}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) {
		o.SetProjectName("effectively-once", true)
		o.SkipResolveEnvironment = true
	})
}

var moduleAtVersion = regexp.MustCompile(`^[\w.\-/]+@v\d+\.\d+\.\d+$`)

// CheckCompose returns every way p breaks the project's rules, sorted by
// service:
//   - each service builds (build.context) or names an image;
//   - a build's SERVICE arg names a main package under moduleRoot
//     ("./services/payments") or a module@version to go install;
//   - each service has a healthcheck that is not disabled;
//   - each depends_on names a service of p and waits for it to be
//     service_healthy, so the stack comes up in order with no sleeps.
func CheckCompose(p *types.Project, moduleRoot string) []error {
	var errs []error
	names := make([]string, 0, len(p.Services))
	for n := range p.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		svc := p.Services[name]
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("service %s: "+format, append([]any{name}, args...)...))
		}
		switch {
		case svc.Build != nil && svc.Build.Context != "":
			if arg, ok := svc.Build.Args["SERVICE"]; ok {
				if err := checkServiceArg(arg, moduleRoot); err != nil {
					bad("build arg SERVICE: %v", err)
				}
			}
		case svc.Image != "":
		default:
			bad("neither builds nor names an image")
		}
		hc := svc.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) == 0 || hc.Test[0] == "NONE" {
			bad("has no healthcheck")
		}
		deps := make([]string, 0, len(svc.DependsOn))
		for d := range svc.DependsOn {
			deps = append(deps, d)
		}
		slices.Sort(deps)
		for _, d := range deps {
			if _, ok := p.Services[d]; !ok {
				bad("depends on %s, which is not a service", d)
			}
			if c := svc.DependsOn[d].Condition; c != types.ServiceConditionHealthy {
				bad("depends on %s with condition %q, want service_healthy", d, c)
			}
		}
	}
	return errs
}

func checkServiceArg(arg *string, moduleRoot string) error {
	if arg == nil || *arg == "" {
		return fmt.Errorf("empty")
	}
	v := *arg
	if moduleAtVersion.MatchString(v) {
		return nil
	}
	if !strings.HasPrefix(v, "./") {
		return fmt.Errorf("%q: want ./path/to/package or module@vX.Y.Z", v)
	}
	dir := filepath.Join(moduleRoot, filepath.FromSlash(v))
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err == nil && regexp.MustCompile(`(?m)^package main$`).Match(b) {
			return nil
		}
	}
	return fmt.Errorf("%q: no main package in %s", v, dir)
}
