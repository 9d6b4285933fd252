// Package stack is the local stack of service processes, for the demo
// (cmd/demo) and the e2e suite: the dev SMS provider, payments, rewards and
// notifications, built into <repo>/bin and run as real processes against the
// infrastructure scripts/stack.sh started (PostgreSQL, fauxqs, stripe-mock;
// its endpoints in .stack/env).
//
//	root, _ := stack.RepoRoot()
//	env, _ := stack.LoadEnv(root)
//	l, err := stack.StartLocal(ctx, stack.Options{Root: root, Env: env})
//	defer l.Close()
//	l.Kill("rewards")                     // crash it
//	l.Start("rewards", "FAILPOINTS=...")  // bring it back, differently
//	l.StartAs("rewards-2", "rewards", "PORT=8092") // a replica
//
// Every process gets the parent-death signal (SIGKILL, Linux), is forked
// from a thread that lives as long as this process (sysproc.Start), and runs
// in its own process group: a Ctrl-C in the terminal reaches the program
// that owns the Local, which stops the services (Close: SIGTERM to all at
// once), and a crash of that program takes them all down with it.
package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/effectively-once/payments-cashback/internal/ports"
	"github.com/effectively-once/payments-cashback/internal/sysproc"
)

// The services StartLocal runs, in start order.
const (
	SMSProvider   = "smsprovider"
	Payments      = "payments"
	Rewards       = "rewards"
	Notifications = "notifications"
)

// Services are the names StartLocal starts, in order.
var Services = []string{SMSProvider, Payments, Rewards, Notifications}

// Module is the module path RepoRoot looks for in go.mod: this package's
// own, so a copy of the repository under another module path (see the
// README, "Use it as a template") finds its root too.
var Module = strings.TrimSuffix(reflect.TypeOf(Local{}).PkgPath(), "/internal/stack")

// base describes one binary.
type base struct {
	pkg       string // go package that builds it
	portVar   string // the env variable it reads its port from
	urlVar    string // the .stack/env variable that says where it listens
	stackVar  string // scripts/stack.sh's setting that urlVar is written from
	port      int    // default port
	readyPath string // 200 when ready
}

var bases = map[string]base{
	SMSProvider:   {"./services/notifications/cmd/smsprovider", "SMS_PROVIDER_PORT", "SMS_PROVIDER_URL", "SMS_PROVIDER_PORT", 8090, "/healthz"},
	Payments:      {"./services/payments", "PORT", "PAYMENTS_URL", "PAYMENTS_PORT", 8081, "/readyz"},
	Rewards:       {"./services/rewards", "PORT", "REWARDS_URL", "REWARDS_PORT", 8082, "/readyz"},
	Notifications: {"./services/notifications", "PORT", "NOTIFICATIONS_URL", "NOTIFICATIONS_PORT", 8083, "/readyz"},
}

// RepoRoot walks up from the working directory to the directory whose
// go.mod declares this module (a nested module's go.mod is passed over).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(b) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("stack: no go.mod of %s above the working directory", Module)
		}
		dir = parent
	}
}

func declaresModule(gomod []byte) bool {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == Module {
			return true
		}
	}
	return false
}

// LoadEnv parses <root>/.stack/env, the file scripts/stack.sh infra-up
// writes (export KEY='value' lines, '\” inside a value), and returns only
// its variables: nothing from os.Environ(). A missing file is an error
// wrapping fs.ErrNotExist that says how to get one.
func LoadEnv(root string) (map[string]string, error) {
	path := filepath.Join(root, ".stack", "env")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stack: %s does not exist: the infrastructure is not up; run under `scripts/stack.sh with CMD` "+
			"(as `make demo` does) or start it with `make infra`: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	return parseEnv(path, b)
}

func parseEnv(path string, b []byte) (map[string]string, error) {
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t'\"") {
			return nil, fmt.Errorf("stack: %s:%d: want export KEY='value', got %q", path, i+1, line)
		}
		switch {
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, `'`)
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	return env, nil
}

// APIKey is the key clients of this stack's payments API send
// (Authorization: Bearer), from .stack/env's PAYMENTS_API_KEY or made by
// StartLocal.
func (l *Local) APIKey() string { return l.env["PAYMENTS_API_KEY"] }

// Key is the dev client key in the variable name (one of DevClients'
// KeyVar: REWARDS_READ_KEY, REWARDS_ADMIN_KEY, ...), from .stack/env or
// made by StartLocal.
func (l *Local) Key(name string) string { return l.env[name] }

// DevClient is one dev client of a local stack's service: the variable its
// key is in (for callers), its entry in the service's *_API_KEYS
// (name/roles) and that variable.
type DevClient struct {
	KeyVar, Entry, KeysVar string
}

// DevClients are the local stack's clients, one per service and role, as
// scripts/stack.sh writes them to .stack/env: the payments client (pay),
// a reader and an operator (read+admin) of rewards and of the SMS
// provider, a reader of notifications, and the notifications service
// itself as the SMS provider's sender (send; it reads SMS_PROVIDER_API_KEY).
var DevClients = []DevClient{
	{"PAYMENTS_API_KEY", "dev", "PAYMENTS_API_KEYS"},
	{"REWARDS_READ_KEY", "dev-read/read", "REWARDS_API_KEYS"},
	{"REWARDS_ADMIN_KEY", "dev-admin/read+admin", "REWARDS_API_KEYS"},
	{"NOTIFICATIONS_READ_KEY", "dev-read/read", "NOTIFICATIONS_API_KEYS"},
	{"SMS_PROVIDER_READ_KEY", "dev-read/read", "SMS_PROVIDER_API_KEYS"},
	{"SMS_PROVIDER_ADMIN_KEY", "dev-admin/read+admin", "SMS_PROVIDER_API_KEYS"},
	{"SMS_PROVIDER_API_KEY", "notifications/send", "SMS_PROVIDER_API_KEYS"},
}

// withDevDefaults returns env (a copy if it changes anything) with what a
// local stack needs and the caller left out: loopback listen addresses,
// stripe-mock's fixtures accepted, and a fresh key for every dev client of
// a service whose *_API_KEYS is unset.
func withDevDefaults(env map[string]string) map[string]string {
	out := maps.Clone(env)
	if out["LISTEN_ADDR"] == "" {
		out["LISTEN_ADDR"] = "127.0.0.1" // this machine only; compose binds 0.0.0.0
	}
	if out["STRIPE_MOCK_FIXTURES"] == "" {
		out["STRIPE_MOCK_FIXTURES"] = "true" // the local stack's Stripe is stripe-mock
	}
	made := map[string][]string{}
	for _, c := range DevClients {
		if env[c.KeysVar] != "" {
			continue
		}
		key := rand.Text() + rand.Text()
		out[c.KeyVar] = key
		made[c.KeysVar] = append(made[c.KeysVar], c.Entry+":"+key)
	}
	for v, entries := range made {
		out[v] = strings.Join(entries, ",")
	}
	return out
}

// Options configure StartLocal.
type Options struct {
	// Root is the repository root (default: RepoRoot()).
	Root string
	// Env is the base environment of every service, typically LoadEnv(Root)
	// with overrides; nil means LoadEnv(Root). It must hold
	// PAYMENTS_DATABASE_URL, REWARDS_DATABASE_URL, NOTIFICATIONS_DATABASE_URL
	// and AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_SQS). Its PAYMENTS_URL,
	// REWARDS_URL, NOTIFICATIONS_URL and SMS_PROVIDER_URL, if set, pick the
	// services' ports (default 8081, 8082, 8083, 8090). Of the caller's own
	// environment only PATH, HOME, USER, LOGNAME, TMPDIR, TZ, LANG, LC_*,
	// GOCOVERDIR, GORACE, GOTRACEBACK, GODEBUG and the runtime's GOGC,
	// GOMEMLIMIT and GOMAXPROCS reach the services, so a stray PORT or
	// FAILPOINTS in a shell never changes what runs.
	Env map[string]string
	// LogDir receives <name>.log per process (default <Root>/.stack/logs).
	LogDir string
	// Ready bounds each wait for a process to become ready (default 60s).
	Ready time.Duration
	// Tags are build tags for the services. The e2e suite passes "e2e",
	// which compiles in what it needs to kill and fail processes on purpose
	// (FAILPOINTS, rewards' REWARDS_FAIL_* hooks); without it the services
	// are the production builds, which hold neither.
	Tags []string
}

// Local is a running local stack. Its methods are safe for concurrent use.
type Local struct {
	root, binDir, logDir string
	env                  map[string]string
	ready                time.Duration

	mu     sync.Mutex
	procs  map[string]*proc
	order  []string // names in the order they were first started
	closed bool
}

// proc is one named process slot; each start makes a new run.
type proc struct {
	name, base string
	identity   []string // env given to StartAs: kept for every later Start
	cur        *run     // the latest run; nil before the first start
}

type run struct {
	cmd       *exec.Cmd
	pid, port int
	done      chan struct{}    // closed when the process has exited and was reaped
	state     *os.ProcessState // set before done is closed
	logFrom   int64            // size of the log when this run started
}

func (r *run) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// PortInUseError is StartLocal's and Start's error when a service's port is
// taken by a process this Local did not start.
type PortInUseError struct {
	Port   int
	Name   string // the service that wanted it
	Holder string // "pid 123 (payments)" if it could be found out, else ""
	Hint   string
}

func (e *PortInUseError) Error() string {
	by, stop := "", "stop it (Ctrl-C in its terminal)"
	if e.Holder != "" {
		by = " by " + e.Holder
		if pid, _, ok := strings.Cut(strings.TrimPrefix(e.Holder, "pid "), " "); ok {
			stop = "stop it (Ctrl-C in its terminal, or kill " + pid + ")"
		}
	}
	return fmt.Sprintf("port %d (%s) is in use%s: is the demo (make demo) or another local stack still running? %s, or %s",
		e.Port, e.Name, by, stop, e.Hint)
}

// Build compiles the services and the repo's commands into <root>/bin:
// go build -o <root>/bin/ ./services/payments ./services/rewards
// ./services/notifications ./services/notifications/cmd/smsprovider ./cmd/...
func Build(ctx context.Context, root string) (binDir string, err error) {
	pkgs := servicePackages()
	pkgs = append(pkgs, "./cmd/...")
	binDir = filepath.Join(root, "bin")
	return binDir, goBuild(ctx, root, binDir, nil, pkgs)
}

func servicePackages() []string {
	var pkgs []string
	for _, name := range Services {
		pkgs = append(pkgs, bases[name].pkg)
	}
	return pkgs
}

func goBuild(ctx context.Context, root, binDir string, tags, pkgs []string) error {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("stack: building the services needs the go command on PATH: %w", err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	args := []string{"build", "-o", binDir + string(filepath.Separator)}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, gocmd, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("stack: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// StartLocal builds the four service binaries into <Root>/bin (only those:
// a half-written tool under ./cmd must not stop the stack; Build builds
// everything), then starts smsprovider, payments, rewards and notifications
// in that order, each on its port (see Options.Env) of 127.0.0.1 only
// (LISTEN_ADDR, unless Env sets another), and waits until each
// answers 200 on /readyz (the SMS provider: /healthz). A port already taken
// fails fast with a *PortInUseError naming it. On any error whatever it
// started is stopped again. ctx bounds the build and the waits, not the
// processes: they run until Stop, Kill or Close.
func StartLocal(ctx context.Context, o Options) (*Local, error) {
	if o.Root == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		o.Root = root
	}
	if o.Env == nil {
		env, err := LoadEnv(o.Root)
		if err != nil {
			return nil, err
		}
		o.Env = env
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(o.Root, ".stack", "logs")
	}
	if o.Ready <= 0 {
		o.Ready = 60 * time.Second
	}
	var missing []string
	for _, k := range []string{"PAYMENTS_DATABASE_URL", "REWARDS_DATABASE_URL", "NOTIFICATIONS_DATABASE_URL"} {
		if o.Env[k] == "" {
			missing = append(missing, k)
		}
	}
	if o.Env["AWS_ENDPOINT_URL"] == "" && o.Env["AWS_ENDPOINT_URL_SQS"] == "" {
		missing = append(missing, "AWS_ENDPOINT_URL")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("stack: the environment lacks %s: pass LoadEnv(root) of a stack scripts/stack.sh started (make infra)",
			strings.Join(missing, ", "))
	}
	if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	// A stack from before API keys, or a test's own environment: fresh
	// dev clients (a copy: the caller's map stays as it is).
	o.Env = withDevDefaults(o.Env)
	l := &Local{root: o.Root, binDir: filepath.Join(o.Root, "bin"), logDir: o.LogDir, env: o.Env,
		ready: o.Ready, procs: map[string]*proc{}}
	for _, name := range Services {
		l.procs[name] = &proc{name: name, base: name}
	}
	// Fail on a taken port before spending time on the build.
	for _, name := range Services {
		if err := l.checkPort(name, l.defaultPort(name)); err != nil {
			return nil, err
		}
	}
	if err := goBuild(ctx, o.Root, l.binDir, o.Tags, servicePackages()); err != nil {
		return nil, err
	}
	for _, name := range Services {
		if err := l.start(ctx, name, true, nil); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	return l, nil
}

// Start starts a stopped (or exited, or killed) process again, with extra
// KEY=VALUE environment for this run only (FAILPOINTS=in-sending,
// REWARDS_FAIL_FIRST_N=2, ...), and waits until it is ready. A name made
// by StartAs keeps the environment StartAs gave it. It fails if the process
// is running.
func (l *Local) Start(name string, env ...string) error {
	return l.start(context.Background(), name, true, env)
}

// StartNoWait is Start without the readiness wait: for a process expected
// to die on the way (a failpoint) or one whose readiness the caller checks.
func (l *Local) StartNoWait(name string, env ...string) error {
	return l.start(context.Background(), name, false, env)
}

// StartAs starts a second process of binary base (payments, rewards,
// notifications or smsprovider) under a new name, a replica such as
// "rewards-2" with PORT=8092 or "payments-relay" with ROLE=relay, and waits
// until it is ready. Its port is the PORT (SMS_PROVIDER_PORT for
// smsprovider) in env, else a free one chosen at random in 20000-32000
// (ports.Free, below the kernel's ephemeral range; see URL). env
// stays with the name: Start(name) later runs it with the same env again.
// Its log is LogPath(name).
func (l *Local) StartAs(name, baseName string, env ...string) error {
	if _, ok := bases[baseName]; !ok {
		return fmt.Errorf("stack: StartAs %q: unknown binary %q (want one of %s)", name, baseName, strings.Join(Services, ", "))
	}
	if name == "" || strings.ContainsAny(name, `/\ `) {
		return fmt.Errorf("stack: StartAs: bad name %q", name)
	}
	if err := checkEnv(env); err != nil {
		return err
	}
	l.mu.Lock()
	if p, ok := l.procs[name]; ok {
		if p.base == baseName && slices.Equal(p.identity, env) {
			l.mu.Unlock()
			return l.Start(name) // same replica again
		}
		// Another scenario's replica of the same name: its settings may be
		// replaced once it has stopped, never while it runs.
		if p.cur != nil && !p.cur.exited() {
			l.mu.Unlock()
			return fmt.Errorf("stack: StartAs %q: that name is running as %s with env %q", name, p.base, p.identity)
		}
		p.base, p.identity = baseName, slices.Clone(env)
		l.mu.Unlock()
		return l.start(context.Background(), name, true, nil)
	}
	l.procs[name] = &proc{name: name, base: baseName, identity: slices.Clone(env)}
	l.mu.Unlock()
	return l.start(context.Background(), name, true, nil)
}

// Kill sends SIGKILL and waits until the process is gone. Killing a
// process that already exited is not an error.
func (l *Local) Kill(name string) error {
	r, err := l.current(name)
	if err != nil {
		return err
	}
	if !r.exited() {
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-r.done
	return nil
}

// Stop sends SIGTERM, waits up to 30 s for the process to drain and exit,
// then kills it. Stopping a process that already exited is not an error.
func (l *Local) Stop(name string) error {
	r, err := l.current(name)
	if err != nil {
		return err
	}
	stopRun(r, 30*time.Second)
	return nil
}

func stopRun(r *run, grace time.Duration) {
	if r.exited() {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(grace):
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
		<-r.done
	}
}

// Restart is Stop, then Start with env.
func (l *Local) Restart(name string, env ...string) error {
	if err := l.Stop(name); err != nil {
		return err
	}
	return l.Start(name, env...)
}

// WaitExit waits up to timeout for the process to exit (a failpoint killing
// it, say) and reports whether a signal ended it. It returns at once if the
// process has already exited; an error if it is still running at the
// deadline.
func (l *Local) WaitExit(name string, timeout time.Duration) (killedBySignal bool, err error) {
	r, err := l.current(name)
	if err != nil {
		return false, err
	}
	select {
	case <-r.done:
	case <-time.After(timeout):
		return false, fmt.Errorf("stack: %s (pid %d) still running after %v; see %s", name, r.pid, timeout, l.LogPath(name))
	}
	return !r.state.Exited(), nil
}

// Running reports whether the named process is running now.
func (l *Local) Running(name string) bool {
	r, err := l.current(name)
	return err == nil && !r.exited()
}

// PID is the pid of the named process's latest run (0 if never started).
func (l *Local) PID(name string) int {
	if r, err := l.current(name); err == nil {
		return r.pid
	}
	return 0
}

// ExitState is how the latest run of name ended (nil while it runs or if
// it never started).
func (l *Local) ExitState(name string) *os.ProcessState {
	r, err := l.current(name)
	if err != nil || !r.exited() {
		return nil
	}
	return r.state
}

// LogPath is the file that gets the process's stdout and stderr (JSON log
// lines), appended across restarts. Between runs Local adds lines of its
// own, also JSON, with "service":"stack" ("stack: starting" with the run's
// extra env, "stack: exited" with its status).
func (l *Local) LogPath(name string) string {
	return filepath.Join(l.logDir, name+".log")
}

// URL is http://127.0.0.1:<port> of the named process (its latest run's
// port, or the one it will get), "" for a name never started.
func (l *Local) URL(name string) string {
	if p := l.Port(name); p != 0 {
		return "http://127.0.0.1:" + strconv.Itoa(p)
	}
	return ""
}

// Port is the named process's port (see URL), 0 for a name never started.
func (l *Local) Port(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.procs[name]
	if !ok {
		return 0
	}
	if p.cur != nil {
		return p.cur.port
	}
	if p.base == p.name {
		return l.defaultPort(name)
	}
	return 0
}

// Names are the processes this Local knows, in the order first started.
func (l *Local) Names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// BinDir is where the binaries are (<root>/bin).
func (l *Local) BinDir() string { return l.binDir }

// Close stops every process it started (SIGTERM to all at once, SIGKILL
// after 30 s for any still there) and waits until they are gone. Later
// Starts fail. It is safe to call more than once.
func (l *Local) Close() error {
	l.mu.Lock()
	l.closed = true
	var runs []*run
	for _, p := range l.procs {
		if p.cur != nil {
			runs = append(runs, p.cur)
		}
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() { stopRun(r, 30*time.Second) })
	}
	wg.Wait()
	return nil
}

// ---------------------------------------------------------------------------

func (l *Local) current(name string) (*run, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.procs[name]
	if !ok {
		return nil, fmt.Errorf("stack: no process named %q (known: %s)", name, strings.Join(l.namesLocked(), ", "))
	}
	if p.cur == nil {
		return nil, fmt.Errorf("stack: %s was never started", name)
	}
	return p.cur, nil
}

func (l *Local) namesLocked() []string {
	names := make([]string, 0, len(l.procs))
	for _, n := range Services {
		if _, ok := l.procs[n]; ok {
			names = append(names, n)
		}
	}
	for _, n := range l.order {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// defaultPort is the port of one of the four services: from its URL in the
// base env (PAYMENTS_URL, ...), else the design's default.
func (l *Local) defaultPort(name string) int {
	b := bases[name]
	if u, err := url.Parse(l.env[b.urlVar]); err == nil && u.Port() != "" {
		if p, err := strconv.Atoi(u.Port()); err == nil {
			return p
		}
	}
	return b.port
}

func checkEnv(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("stack: env entry %q: want KEY=VALUE", kv)
		}
	}
	return nil
}

// inherited are the caller's variables a service process gets; see Options.Env.
var inherited = []string{"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "GOCOVERDIR", "GORACE", "GOTRACEBACK", "GODEBUG",
	"GOGC", "GOMEMLIMIT", "GOMAXPROCS"}

// environ builds a run's environment: inherited, then the base env, then
// the service's own settings, then identity, then extra (later wins). It
// returns the list and the port the process will listen on.
func (l *Local) environ(p *proc, extra []string) ([]string, int, error) {
	b := bases[p.base]
	vars := map[string]string{}
	var keys []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			keys = append(keys, k)
		}
		vars[k] = v
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if slices.Contains(inherited, k) || strings.HasPrefix(k, "LC_") {
			set(k, v)
		}
	}
	baseKeys := make([]string, 0, len(l.env))
	for k := range l.env {
		baseKeys = append(baseKeys, k)
	}
	slices.Sort(baseKeys)
	for _, k := range baseKeys {
		set(k, l.env[k])
	}
	if vars["AWS_REGION"] == "" {
		set("AWS_REGION", "us-east-1")
	}
	if vars["AWS_ACCESS_KEY_ID"] == "" && vars["AWS_PROFILE"] == "" {
		set("AWS_ACCESS_KEY_ID", "test")
		set("AWS_SECRET_ACCESS_KEY", "test")
	}
	if p.base == Notifications {
		if sp, ok := l.procs[SMSProvider]; ok && sp.cur != nil {
			set("SMS_PROVIDER_URL", "http://127.0.0.1:"+strconv.Itoa(sp.cur.port))
		}
	}
	delete(vars, b.portVar) // a port in the base env is no service's in particular
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == b.portVar })
	for _, kv := range append(slices.Clone(p.identity), extra...) {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	port := 0
	if s, ok := vars[b.portVar]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > 65535 {
			return nil, 0, fmt.Errorf("stack: %s: %s=%q is not a port number", p.name, b.portVar, s)
		}
		port = n
	} else if p.base == p.name {
		port = l.defaultPort(p.name)
	} else {
		n, err := freePort()
		if err != nil {
			return nil, 0, err
		}
		port = n
	}
	set(b.portVar, strconv.Itoa(port))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+vars[k])
	}
	return out, port, nil
}

func freePort() (int, error) {
	p, err := ports.Free()
	if err != nil {
		return 0, fmt.Errorf("stack: find a free port: %w", err)
	}
	return p, nil
}

// checkPort fails with a *PortInUseError if something listens on port.
// The services listen on loopback (LISTEN_ADDR=127.0.0.1), so that is what
// is tried; a process bound to every interface holds it too.
func (l *Local) checkPort(name string, port int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err == nil {
		ln.Close()
		return nil
	}
	var hint string
	if b, ok := bases[name]; ok {
		// make demo and make e2e take the URLs from .stack/env, which
		// scripts/stack.sh writes from its *_PORT settings (a *_URL in
		// the shell is not looked at).
		hint = fmt.Sprintf("give %s another port: %s=<port> make demo (or make e2e); a program of your own sets %s in Options.Env",
			name, b.stackVar, b.urlVar)
	} else if p, ok := l.procs[name]; ok {
		hint = fmt.Sprintf("give %s another port (%s=<port>)", name, bases[p.base].portVar)
	}
	return &PortInUseError{Port: port, Name: name, Holder: portHolder(port), Hint: hint}
}

func (l *Local) start(ctx context.Context, name string, wait bool, extra []string) error {
	if err := checkEnv(extra); err != nil {
		return err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("stack: Start %s: the stack is closed", name)
	}
	p, ok := l.procs[name]
	if !ok {
		l.mu.Unlock()
		return fmt.Errorf("stack: no process named %q: StartAs makes new ones (known: %s)", name, strings.Join(l.namesLocked(), ", "))
	}
	if p.cur != nil && !p.cur.exited() {
		l.mu.Unlock()
		return fmt.Errorf("stack: %s is already running (pid %d)", name, p.cur.pid)
	}
	r, err := l.spawn(p, extra)
	l.mu.Unlock()
	if err != nil || !wait {
		return err
	}
	return l.waitReady(ctx, name, r)
}

// spawn starts a run of p; l.mu is held.
func (l *Local) spawn(p *proc, extra []string) (*run, error) {
	env, port, err := l.environ(p, extra)
	if err != nil {
		return nil, err
	}
	if err := l.checkPort(p.name, port); err != nil {
		return nil, err
	}
	bin := filepath.Join(l.binDir, p.base)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("stack: %s: binary missing (StartLocal builds it): %w", p.name, err)
	}
	logPath := l.LogPath(p.name)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	defer logf.Close() // the child has its own copy of the descriptor
	var logFrom int64
	if fi, err := logf.Stat(); err == nil {
		logFrom = fi.Size()
	}
	attr, err := sysproc.ChildAttr(false, syscall.SIGKILL)
	if err != nil {
		return nil, err
	}
	attr.Setpgid = true // a terminal's Ctrl-C is for our owner, who stops us (Close)
	cmd := exec.Command(bin)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = l.root, env, logf, logf, attr
	writeMarker(logf, "INFO", "stack: starting", "name", p.name, "binary", p.base, "port", port, "env", append(append([]string{}, p.identity...), extra...))
	if err := sysproc.Start(cmd); err != nil {
		return nil, fmt.Errorf("stack: start %s: %w", p.name, err)
	}
	r := &run{cmd: cmd, pid: cmd.Process.Pid, port: port, done: make(chan struct{}), logFrom: logFrom}
	p.cur = r
	if !slices.Contains(l.order, p.name) {
		l.order = append(l.order, p.name)
	}
	go func() {
		_ = cmd.Wait()
		r.state = cmd.ProcessState
		level := "INFO"
		if !r.state.Success() {
			level = "WARN"
		}
		if f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			writeMarker(f, level, "stack: exited", "name", p.name, "pid", r.pid, "status", r.state.String())
			f.Close()
		}
		close(r.done)
	}()
	return r, nil
}

func writeMarker(w io.Writer, level, msg string, kv ...any) {
	m := map[string]any{"time": time.Now().Format(time.RFC3339Nano), "level": level, "msg": msg, "service": "stack"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	_, _ = w.Write(append(b, '\n'))
}

var readyClient = &http.Client{Timeout: 3 * time.Second}

// waitReady polls the run's ready endpoint until 200; it fails early if
// the process exits, and kills it if it is not ready within l.ready.
func (l *Local) waitReady(ctx context.Context, name string, r *run) error {
	l.mu.Lock()
	b := bases[l.procs[name].base]
	l.mu.Unlock()
	u := "http://127.0.0.1:" + strconv.Itoa(r.port) + b.readyPath
	deadline := time.Now().Add(l.ready)
	last := "no answer yet"
	for {
		if resp, err := readyClient.Get(u); err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-r.done:
			return fmt.Errorf("stack: %s exited while starting (%s); last lines of %s:\n%s",
				name, r.state, l.LogPath(name), l.tail(name, r.logFrom, 20))
		case <-ctx.Done():
			_ = r.cmd.Process.Signal(syscall.SIGKILL)
			<-r.done
			return fmt.Errorf("stack: waiting for %s: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = r.cmd.Process.Signal(syscall.SIGKILL)
			<-r.done
			return fmt.Errorf("stack: %s not ready within %v (GET %s: %s), killed it; last lines of %s:\n%s",
				name, l.ready, u, last, l.LogPath(name), l.tail(name, r.logFrom, 20))
		}
	}
}

// tail returns the last n lines the run wrote (from offset from).
func (l *Local) tail(name string, from int64, n int) string {
	f, err := os.Open(l.LogPath(name))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return "(log: " + err.Error() + ")"
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, "\t"+sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
