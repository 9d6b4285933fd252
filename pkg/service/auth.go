package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/httprate"
)

// Role is what a client may do. A route names the role it needs
// (RequireRole); a client holds any number of roles.
type Role string

// The roles of this project's APIs.
const (
	// RoleRead reads state: wallets, notifications, rates, deliveries.
	RoleRead Role = "read"
	// RoleAdmin changes state an operator owns: cashback rates, fault
	// injection, anything else that is not a customer's own request.
	RoleAdmin Role = "admin"
	// RolePay charges, reads and refunds the client's own payments.
	RolePay Role = "pay"
	// RoleSend sends messages through a provider and looks them up: the
	// dev SMS provider's /v1/messages, which the notifications service
	// calls.
	RoleSend Role = "send"
)

// Roles are every role ParseAPIKeys knows.
var Roles = []Role{RoleRead, RoleAdmin, RolePay, RoleSend}

// APIKeys are the clients of an API: each client's name, the digest of its
// key and its roles. Parse it from "name[/role+role]:key,..." with
// ParseAPIKeys; keep the source in a config field tagged `secret:"true"` so
// LogConfig masks it.
type APIKeys struct {
	clients []apiClient
}

type apiClient struct {
	name   string
	digest [sha256.Size]byte
	roles  []Role
}

// MinAPIKeyLength is the shortest key ParseAPIKeys accepts: 128 bits of
// hex, or the equivalent; anything shorter is guessable.
const MinAPIKeyLength = 32

var clientName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// ParseAPIKeys reads "name[/role+role]:key[,...]", e.g.
// "web:K1,ops/read+admin:K2". An entry without roles gets def. Names must
// be unique and plain (letters, digits, _ . -), roles among Roles, keys at
// least MinAPIKeyLength bytes, and no two clients may share a key (the
// service could not tell them apart). Spaces around each ',' and ':' are
// trimmed, not part of a name or key ("web: K1, ops/admin: K2" is
// "web:K1,ops/admin:K2"), as RequireAPIKey trims the key it is sent. The
// error never contains a key, nor a piece of one written where the name or
// a role goes: it names the entry by its position, its shape and key are
// checked before anything else in it, and it quotes a name or role only
// when shorter than 16 bytes (a typo); a longer one is given by its length.
func ParseAPIKeys(s string, def ...Role) (APIKeys, error) {
	var ks APIKeys
	var labels []string // of ks.clients, as errors name them
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		who, key, ok := strings.Cut(part, ":")
		// Spaces around the ':' are layout, as around the ',': RequireAPIKey
		// trims the key it is sent, so a key kept with them would match none.
		who, key = strings.TrimSpace(who), strings.TrimSpace(key)
		// Until the key is where a key goes, the rest may be a key (a ':'
		// mistyped, name and key swapped): nothing of it is repeated.
		switch {
		case !ok:
			return APIKeys{}, fmt.Errorf("entry %d: want name[/role+role]:key", i+1)
		case len(key) < MinAPIKeyLength:
			return APIKeys{}, fmt.Errorf("entry %d: key shorter than %d bytes", i+1, MinAPIKeyLength)
		}
		name, roleList, hasRoles := strings.Cut(who, "/")
		entry := fmt.Sprintf("entry %d", i+1)
		if !clientName.MatchString(name) {
			return APIKeys{}, fmt.Errorf("%s: client name %s: want 1-64 of A-Z a-z 0-9 _ . -", entry, shown(name))
		}
		label, hint := fmt.Sprintf("(entry %d)", i+1), "<name>"
		if len(name) < maxShown {
			entry += " (client " + name + ")"
			label, hint = name, name
		}
		roles := slices.Clone(def)
		if hasRoles {
			roles = nil
			for _, r := range strings.Split(roleList, "+") {
				if !slices.Contains(Roles, Role(r)) {
					return APIKeys{}, fmt.Errorf("%s: role %s: want %s", entry, shown(r), roleNames(Roles))
				}
				roles = append(roles, Role(r))
			}
		}
		switch {
		case seen[name]:
			return APIKeys{}, fmt.Errorf("entry %d: client %s listed twice", i+1, shown(name))
		case len(roles) == 0:
			return APIKeys{}, fmt.Errorf("%s: no roles: write %s/<role>:<key>, role one of %s", entry, hint, roleNames(Roles))
		}
		d := sha256.Sum256([]byte(key))
		for j, c := range ks.clients {
			if c.digest == d {
				return APIKeys{}, fmt.Errorf("clients %s and %s have the same key: give each client its own", labels[j], label)
			}
		}
		seen[name] = true
		ks.clients = append(ks.clients, apiClient{name: name, digest: d, roles: roles})
		labels = append(labels, label)
	}
	return ks, nil
}

// maxShown bounds what ParseAPIKeys' errors repeat of a name or role: a
// typo is shorter, a key (MinAPIKeyLength) or a telling piece of one is not.
const maxShown = 16

// shown is how an error of ParseAPIKeys gives a name or role: quoted when
// shorter than maxShown, else only by its length.
func shown(s string) string {
	if len(s) < maxShown {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("(%d bytes, not shown)", len(s))
}

func roleNames(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// Need fails unless, for each of roles, at least one client holds it: a
// service whose routes need a role nobody has would refuse every call, so
// it refuses to start instead.
func (ks APIKeys) Need(roles ...Role) error {
	var missing []string
	for _, r := range roles {
		if !slices.ContainsFunc(ks.clients, func(c apiClient) bool { return slices.Contains(c.roles, r) }) {
			missing = append(missing, string(r))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no client has the role %s, which the API's routes need (add e.g. ops/%s:$(openssl rand -hex 24))",
			strings.Join(missing, ", "), strings.Join(missing, "+"))
	}
	return nil
}

// Client names the client whose key this is, or "" for none. It compares
// digests of equal length in constant time and looks at every key, so the
// time taken says nothing about how close a guess was or whose key it was.
func (ks APIKeys) Client(key string) string {
	c, _ := ks.lookup(key)
	return c.name
}

func (ks APIKeys) lookup(key string) (apiClient, bool) {
	d := sha256.Sum256([]byte(key))
	var found apiClient
	ok := false
	for _, c := range ks.clients {
		if subtle.ConstantTimeCompare(d[:], c.digest[:]) == 1 {
			found, ok = c, true
		}
	}
	return found, ok
}

type clientKey struct{}

type caller struct {
	name  string
	roles []Role
}

// ClientOf is the authenticated client of a request that went through
// RequireAPIKey, or "".
func ClientOf(ctx context.Context) string {
	c, _ := ctx.Value(clientKey{}).(caller)
	return c.name
}

// RequireAPIKey refuses, with 401 and a WWW-Authenticate challenge, every
// request without "Authorization: Bearer <key>" of a known client, and puts
// the client (its name, ClientOf, and its roles, for RequireRole) in the
// request's context.
func RequireAPIKey(ks APIKeys) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scheme, key, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			var (
				c  apiClient
				ok bool
			)
			if strings.EqualFold(scheme, "Bearer") && key != "" {
				c, ok = ks.lookup(strings.TrimSpace(key))
			}
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="api"`)
				WriteError(w, http.StatusUnauthorized, "unauthorized", "Authorization",
					"send Authorization: Bearer <your API key>")
				return
			}
			ctx := context.WithValue(r.Context(), clientKey{}, caller{name: c.name, roles: c.roles})
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// RequireRole refuses with 403, naming the role (never the key), a request
// whose client (RequireAPIKey) lacks role.
func RequireRole(role Role) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, _ := r.Context().Value(clientKey{}).(caller)
			if !slices.Contains(c.roles, role) {
				WriteError(w, http.StatusForbidden, "forbidden", "Authorization",
					fmt.Sprintf("this client lacks the role %q, which this route needs", role))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// RateLimitPerClient allows each authenticated client (ClientOf; the
// remote IP for others) at most limit requests per window, a sliding
// window counted by httprate; beyond it the answer is 429 with Retry-After
// and nothing is done.
func RateLimitPerClient(limit int, window time.Duration) func(http.Handler) http.Handler {
	return httprate.Limit(limit, window,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) {
			if c := ClientOf(r.Context()); c != "" {
				return "client:" + c, nil
			}
			return httprate.KeyByIP(r)
		}),
		httprate.WithLimitHandler(tooMany(limit, window)))
}

// RateLimitPerAddress allows each remote address (the connection's, never
// a header the caller writes) at most limit requests per window, whatever
// they carry: it runs before authentication, so a flood of requests without
// a key, or with wrong ones, is cut off before any key is hashed.
func RateLimitPerAddress(limit int, window time.Duration) func(http.Handler) http.Handler {
	return httprate.Limit(limit, window, httprate.WithKeyFuncs(httprate.KeyByIP),
		httprate.WithLimitHandler(tooMany(limit, window)))
}

func tooMany(limit int, window time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusTooManyRequests, "rate_limited", "",
			fmt.Sprintf("more than %d requests in %v: slow down and retry after the Retry-After header's seconds", limit, window))
	}
}

// AccessEnv is who may call a service's API and how often, as environment
// variables; embed it with the service's prefix (`envPrefix:"REWARDS_"`
// reads REWARDS_API_KEYS, REWARDS_RATE_LIMIT, ...).
type AccessEnv struct {
	// APIKeys: the clients, "name[/role+role]:key,..." (see ParseAPIKeys).
	APIKeys string `env:"API_KEYS" secret:"true"`
	// RateLimit requests per RateWindow per client; more get 429.
	RateLimit  int           `env:"RATE_LIMIT" envDefault:"1000"`
	RateWindow time.Duration `env:"RATE_WINDOW" envDefault:"1s"`
	// AddressRateLimit requests per RateWindow per remote address, counted
	// before the key is looked at.
	AddressRateLimit int `env:"RATE_LIMIT_PER_ADDRESS" envDefault:"2000"`
}

// Access is a parsed AccessEnv.
type Access struct {
	Keys                        APIKeys
	RateLimit, AddressRateLimit int
	RateWindow                  time.Duration
}

// Parse checks e: keys present and well formed, some client holding each
// of need, limits positive. prefix names the variables in errors. def are
// the roles of an entry that names none.
func (e AccessEnv) Parse(prefix string, need []Role, def ...Role) (Access, error) {
	var errs []error
	a := Access{RateLimit: e.RateLimit, AddressRateLimit: e.AddressRateLimit, RateWindow: e.RateWindow}
	if e.APIKeys == "" {
		errs = append(errs, fmt.Errorf("%sAPI_KEYS is empty: the API needs clients with the roles %s, e.g. %sAPI_KEYS=ops/%s:$(openssl rand -hex 24)",
			prefix, roleNames(need), prefix, strings.ReplaceAll(roleNames(need), ", ", "+")))
	} else if ks, err := ParseAPIKeys(e.APIKeys, def...); err != nil {
		errs = append(errs, fmt.Errorf("%sAPI_KEYS: %w", prefix, err))
	} else if err := ks.Need(need...); err != nil {
		errs = append(errs, fmt.Errorf("%sAPI_KEYS: %w", prefix, err))
	} else {
		a.Keys = ks
	}
	if e.RateLimit <= 0 || e.RateWindow <= 0 || e.AddressRateLimit <= 0 {
		errs = append(errs, fmt.Errorf("%[1]sRATE_LIMIT, %[1]sRATE_LIMIT_PER_ADDRESS and %[1]sRATE_WINDOW must be positive", prefix))
	}
	return a, errors.Join(errs...)
}

// Protect makes every route of r need a client's key: per remote address
// rate limit first (before any key is hashed), then the key (401), then
// the client's own rate limit. Each route then names its role with
// RequireRole (403).
func (a Access) Protect(r chi.Router) {
	r.Use(RateLimitPerAddress(a.AddressRateLimit, a.RateWindow), RequireAPIKey(a.Keys),
		RateLimitPerClient(a.RateLimit, a.RateWindow))
}
