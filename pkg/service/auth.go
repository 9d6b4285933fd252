package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/go-chi/httprate"
)

// APIKeys maps each client's API key to the client's name. Parse it from
// "client1:key1,client2:key2" with ParseAPIKeys; keep it in a config field
// tagged `secret:"true"` so LogConfig masks it.
type APIKeys struct {
	clients []apiClient
}

type apiClient struct {
	name   string
	digest [sha256.Size]byte
}

// MinAPIKeyLength is the shortest key ParseAPIKeys accepts: 128 bits of
// hex, or the equivalent; anything shorter is guessable.
const MinAPIKeyLength = 32

var clientName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// ParseAPIKeys reads "name:key[,name:key...]". Names must be unique and
// plain (letters, digits, _ . -); keys at least MinAPIKeyLength bytes. The
// error never contains a key.
func ParseAPIKeys(s string) (APIKeys, error) {
	var ks APIKeys
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		name, key, ok := strings.Cut(strings.TrimSpace(part), ":")
		switch {
		case !ok:
			return APIKeys{}, fmt.Errorf("entry %d: want name:key", i+1)
		case !clientName.MatchString(name):
			return APIKeys{}, fmt.Errorf("entry %d: client name %q: want 1-64 of A-Z a-z 0-9 _ . -", i+1, name)
		case seen[name]:
			return APIKeys{}, fmt.Errorf("entry %d: client %q listed twice", i+1, name)
		case len(key) < MinAPIKeyLength:
			return APIKeys{}, fmt.Errorf("entry %d (client %s): key shorter than %d bytes", i+1, name, MinAPIKeyLength)
		}
		seen[name] = true
		ks.clients = append(ks.clients, apiClient{name: name, digest: sha256.Sum256([]byte(key))})
	}
	return ks, nil
}

// Client names the client whose key this is, or "" for none. It compares
// digests of equal length in constant time and looks at every key, so the
// time taken says nothing about how close a guess was or whose key it was.
func (ks APIKeys) Client(key string) string {
	d := sha256.Sum256([]byte(key))
	found := ""
	for _, c := range ks.clients {
		if subtle.ConstantTimeCompare(d[:], c.digest[:]) == 1 {
			found = c.name
		}
	}
	return found
}

type clientKey struct{}

// ClientOf is the authenticated client of a request that went through
// RequireAPIKey, or "".
func ClientOf(ctx context.Context) string {
	c, _ := ctx.Value(clientKey{}).(string)
	return c
}

// RequireAPIKey refuses, with 401 and a WWW-Authenticate challenge, every
// request without "Authorization: Bearer <key>" of a known client, and puts
// the client's name in the request's context (ClientOf).
func RequireAPIKey(ks APIKeys) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scheme, key, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			client := ""
			if strings.EqualFold(scheme, "Bearer") && key != "" {
				client = ks.Client(strings.TrimSpace(key))
			}
			if client == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="api"`)
				WriteError(w, http.StatusUnauthorized, "unauthorized", "Authorization",
					"send Authorization: Bearer <your API key>")
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientKey{}, client)))
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
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, http.StatusTooManyRequests, "rate_limited", "",
				fmt.Sprintf("more than %d requests in %v: slow down and retry after the Retry-After header's seconds", limit, window))
		}))
}
