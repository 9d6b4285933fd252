// Package faults puts Toxiproxy (github.com/Shopify/toxiproxy/v2, as a
// library in the test process) between a service and what it talks to, so
// tests can make the network misbehave the way production's does: cut it,
// slow it, reset connections, throttle it, or lose one answer.
//
//	fx := faults.New()
//	db, _ := fx.Proxy("rewards-db", "127.0.0.1:5432")
//	url := faults.ViaProxy(databaseURL, db.Addr())   // give this to the service
//	db.Cut()                                         // the database "goes away"
//	db.Restore()
//	db.Add(faults.Latency(300*time.Millisecond, 200*time.Millisecond))
//	db.Add(faults.CutOnReply("COMMIT\x00", 1))       // the commit's answer is lost
//
// It is for tests only: nothing in a service imports it.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
)

// Server holds the proxies of one test process.
type Server struct {
	api *toxiproxy.ApiServer
	mu  sync.Mutex
	all []*Proxy
}

// New returns a server with no proxies; Close stops them all.
func New() *Server {
	return &Server{api: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// Proxy starts a proxy named name that listens on a free port of 127.0.0.1
// and forwards to upstream (host:port).
func (s *Server) Proxy(name, upstream string) (*Proxy, error) {
	p := toxiproxy.NewProxy(s.api, name, "127.0.0.1:0", upstream)
	if err := s.api.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("faults: proxy %s: %w", name, err)
	}
	px := &Proxy{p: p, addr: p.Listen}
	s.mu.Lock()
	s.all = append(s.all, px)
	s.mu.Unlock()
	return px, nil
}

// Close stops every proxy and drops their connections.
func (s *Server) Close() {
	_ = s.api.Collection.Clear()
}

// Proxy is one TCP proxy with its toxics.
type Proxy struct {
	p    *toxiproxy.Proxy
	addr string
	cut  atomic.Bool
	seq  atomic.Int64
}

// Addr is where the proxy listens (host:port): point the client here.
func (p *Proxy) Addr() string { return p.addr }

// Cut makes the dependency unreachable: the listener closes (new
// connections are refused) and every open connection is dropped.
func (p *Proxy) Cut() {
	p.cut.Store(true)
	p.p.Stop()
}

// Restore undoes Cut: the proxy listens on the same address again.
func (p *Proxy) Restore() error {
	if !p.cut.Swap(false) {
		return nil
	}
	p.p.Listen = p.addr
	return p.p.Start()
}

// Toxic is one misbehaviour to add to a proxy (see Latency, Reset, ...).
type Toxic struct {
	Type       string
	Stream     string // "upstream" (client → server) or "downstream" [downstream]
	Attributes map[string]any
}

// Add adds t and returns its name, for Remove.
func (p *Proxy) Add(t Toxic) (string, error) {
	if t.Stream == "" {
		t.Stream = "downstream"
	}
	name := fmt.Sprintf("%s_%d", t.Type, p.seq.Add(1))
	body, err := json.Marshal(map[string]any{"name": name, "type": t.Type, "stream": t.Stream, "toxicity": 1.0, "attributes": t.Attributes})
	if err != nil {
		return "", err
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return "", fmt.Errorf("faults: add %s: %w", t.Type, err)
	}
	return name, nil
}

// Remove removes the toxic named name (from Add).
func (p *Proxy) Remove(name string) error {
	return p.p.Toxics.RemoveToxic(context.Background(), name)
}

// Clear removes every toxic.
func (p *Proxy) Clear() { p.p.Toxics.ResetToxics(context.Background()) }

// Latency delays every chunk by latency ± jitter.
func Latency(latency, jitter time.Duration) Toxic {
	return Toxic{Type: "latency", Attributes: map[string]any{"latency": latency.Milliseconds(), "jitter": jitter.Milliseconds()}}
}

// Reset resets (TCP RST) every connection after timeout of data flow.
func Reset(after time.Duration) Toxic {
	return Toxic{Type: "reset_peer", Attributes: map[string]any{"timeout": after.Milliseconds()}}
}

// Bandwidth limits the flow to kbPerSecond KB/s.
func Bandwidth(kbPerSecond int) Toxic {
	return Toxic{Type: "bandwidth", Attributes: map[string]any{"rate": kbPerSecond}}
}

// Timeout stops all data and closes the connection after timeout (0: never
// closes; the peer just hangs, as on a partition that drops packets).
func Timeout(after time.Duration) Toxic {
	return Toxic{Type: "timeout", Attributes: map[string]any{"timeout": after.Milliseconds()}}
}

// CutOnReply drops the first count replies (downstream chunks) that
// contain match, and the connection with them: the server did the work,
// the client never learns it. "COMMIT\x00" is PostgreSQL's CommandComplete
// of a COMMIT (sent after the commit is durable), "MD5OfMessageBody" is in
// every SendMessageBatch answer. unless, when not empty, spares replies that
// also contain it. count 0: every match.
func CutOnReply(match string, count int, unless ...string) Toxic {
	attrs := map[string]any{"match": match, "count": count}
	if len(unless) > 0 {
		attrs["unless"] = unless[0]
	}
	return Toxic{Type: cutOnReplyType, Attributes: attrs}
}

// Cuts reports how many replies the CutOnReply toxics of this process have
// dropped so far.
func Cuts() int64 { return cutsTotal.Load() }

const cutOnReplyType = "cut_on_reply"

var cutsTotal atomic.Int64

// cutOnReply is the toxic behind CutOnReply. Its fields are its JSON
// attributes; done counts the cuts made.
type cutOnReply struct {
	Match  string `json:"match"`
	Unless string `json:"unless"`
	Count  int64  `json:"count"`
	done   atomic.Int64
}

func (t *cutOnReply) Pipe(stub *toxics.ToxicStub) {
	match, unless := []byte(t.Match), []byte(t.Unless)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if len(match) > 0 && bytes.Contains(c.Data, match) && (len(unless) == 0 || !bytes.Contains(c.Data, unless)) &&
				(t.Count == 0 || t.done.Add(1) <= t.Count) {
				cutsTotal.Add(1)
				stub.Close() // the answer is dropped with the connection
				return
			}
			stub.Output <- c
		}
	}
}

func init() { toxics.Register(cutOnReplyType, new(cutOnReply)) }

// ViaProxy returns rawURL (a postgres:// or http:// URL) with its host and
// port replaced by addr, so a client given it goes through the proxy.
func ViaProxy(rawURL, addr string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("faults: %w", err)
	}
	u.Host = addr
	return u.String(), nil
}

// HostPort is the host:port rawURL points at, with the scheme's default
// port when it names none (5432 for postgres, 80 for http).
func HostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("faults: %w", err)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := map[string]string{"postgres": "5432", "postgresql": "5432", "http": "80", "https": "443"}[u.Scheme]
	if port == "" {
		return "", fmt.Errorf("faults: %s names no port", rawURL)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// Postgres puts a proxy named name in front of direct's server and returns
// a pool on the same database through it (connect timeout 1 s, so a cut
// shows at once), closed by the caller.
func (s *Server) Postgres(ctx context.Context, name string, direct *pgxpool.Pool) (*pgxpool.Pool, *Proxy, error) {
	cc := direct.Config().ConnConfig
	px, err := s.Proxy(name, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	if err != nil {
		return nil, nil, err
	}
	cfg := direct.Config().Copy()
	host, port, _ := net.SplitHostPort(px.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.ConnectTimeout, cfg.ConnConfig.Fallbacks = host, uint16(p), time.Second, nil
	via, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return via, px, nil
}
