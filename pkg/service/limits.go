package service

import "github.com/effectively-once/payments-cashback/pkg/internal/settings"

// Limits gathers a config's out-of-range settings, each error naming its
// variable and the range it wants, so that a service refuses to start
// with all of them in one message, before it connects to anything. The
// libraries default or clamp a value they cannot use; a setting an
// operator wrote out is checked with Limits instead, because running,
// silently, with another value than the one written is worse than not
// starting. The zero Limits is ready to use.
type Limits = settings.Errors

// Front is a service's HTTP side as its settings say: the address it
// listens on and who may call it.
type Front struct {
	Addr   string
	Access Access
}

// ParseFront checks LISTEN_ADDR and PORT (ListenAddr) and the access
// settings (AccessEnv.Parse with prefix, need and def), every error at once.
func ParseFront(host, port string, access AccessEnv, prefix string, need []Role, def ...Role) (Front, error) {
	var l Limits
	addr, err := ListenAddr(host, port)
	l.Add(err)
	acc, err := access.Parse(prefix, need, def...)
	l.Add(err)
	return Front{Addr: addr, Access: acc}, l.Err()
}
