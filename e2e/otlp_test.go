package e2e

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// spanRecord is one span a service exported.
type spanRecord struct {
	Service, Name           string
	TraceID, SpanID, Parent string
	Kind                    tracepb.Span_SpanKind
	Attrs                   map[string]string
}

// collector is an OTLP/HTTP trace receiver kept in memory: the services of
// the local stack export their spans to it (OTEL_EXPORTER_OTLP_ENDPOINT),
// exactly as they would to Jaeger or an OpenTelemetry collector.
type collector struct {
	mu    sync.Mutex
	spans []spanRecord
	srv   *http.Server
	url   string
}

func startCollector() (*collector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &collector{url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", c.export)
	c.srv = &http.Server{Handler: mux}
	go func() { _ = c.srv.Serve(ln) }()
	return c, nil
}

func (c *collector) export(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []spanRecord
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				attrs := map[string]string{}
				for _, a := range sp.Attributes {
					attrs[a.Key] = a.GetValue().GetStringValue()
				}
				got = append(got, spanRecord{Service: service, Name: sp.Name, Kind: sp.Kind, Attrs: attrs,
					TraceID: hex.EncodeToString(sp.TraceId), SpanID: hex.EncodeToString(sp.SpanId),
					Parent: hex.EncodeToString(sp.ParentSpanId)})
			}
		}
	}
	c.mu.Lock()
	c.spans = append(c.spans, got...)
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans received so far for one trace id.
func (c *collector) trace(id string) []spanRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []spanRecord
	for _, s := range c.spans {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

func (c *collector) close() { _ = c.srv.Close() }
