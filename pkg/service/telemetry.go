package service

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry is what SetupTelemetry installed.
type Telemetry struct {
	// Metrics serves /metrics in the Prometheus text format.
	Metrics http.Handler
	// Exporter names where spans go: "none", "otlp" or "console".
	Exporter string
	// Shutdown flushes pending spans and stops the providers.
	Shutdown func(context.Context) error
}

// SetupTelemetry installs global OpenTelemetry providers for the service:
// metrics exported in Prometheus format, a tracer provider, and W3C
// trace-context propagation, so the traceparent stored in outbox rows and
// carried on SQS messages joins one trace across services.
//
// Where spans go is chosen by the standard variables:
//   - OTEL_TRACES_EXPORTER=otlp (or unset with OTEL_EXPORTER_OTLP_ENDPOINT
//     or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set): OTLP over HTTP/protobuf,
//     configured by the usual OTEL_EXPORTER_OTLP_* variables;
//   - OTEL_TRACES_EXPORTER=console: one JSON span per line on stderr;
//   - OTEL_TRACES_EXPORTER=none, OTEL_SDK_DISABLED=true, or nothing set:
//     no exporter. Spans are still created, so trace ids propagate and
//     appear in the logs, but nothing leaves the process.
//
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the resource;
// OTEL_BSP_* tune the batch span processor.
func SetupTelemetry(name string) (Telemetry, error) {
	ctx := context.Background()
	// Later options win: OTEL_SERVICE_NAME overrides the built-in name.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(name)), resource.WithFromEnv())
	if err != nil {
		return Telemetry{}, fmt.Errorf("telemetry: resource: %w", err)
	}
	reg := prometheus.NewRegistry()
	mexp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return Telemetry{}, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(mexp), sdkmetric.WithResource(res))

	kind, sexp, err := spanExporter(ctx)
	if err != nil {
		_ = mp.Shutdown(ctx)
		return Telemetry{}, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sdktrace.ParentBased(noRootClients{}))}
	if sexp != nil {
		opts = append(opts, sdktrace.WithBatcher(sexp))
	}
	tp := sdktrace.NewTracerProvider(opts...)

	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return Telemetry{
		Metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Exporter: kind,
		Shutdown: func(ctx context.Context) error {
			terr := tp.Shutdown(ctx) // flushes the batch of unexported spans
			merr := mp.Shutdown(ctx)
			if terr != nil {
				return terr
			}
			return merr
		},
	}, nil
}

// spanExporter picks the span exporter from the OTEL_* environment.
func spanExporter(ctx context.Context) (string, sdktrace.SpanExporter, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return "none", nil, nil
	}
	kind := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	if kind == "" {
		// Unlike the SDK's own default (otlp to localhost), nothing set
		// means nothing exported: a service must not spray spans at a port
		// nobody configured.
		kind = "none"
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			kind = "otlp"
		}
	}
	switch kind {
	case "none":
		return kind, nil, nil
	case "otlp":
		proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		if proto != "" && proto != "http/protobuf" {
			return "", nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL=%q: this build exports OTLP over http/protobuf only (port 4318)", proto)
		}
		exp, err := otlptracehttp.New(ctx) // endpoint, headers, timeout from OTEL_EXPORTER_OTLP_*
		if err != nil {
			return "", nil, fmt.Errorf("telemetry: otlp exporter: %w", err)
		}
		return kind, exp, nil
	case "console":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
		if err != nil {
			return "", nil, fmt.Errorf("telemetry: console exporter: %w", err)
		}
		return kind, exp, nil
	default:
		return "", nil, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER=%q: want otlp, console or none", kind)
	}
}

// noRootClients samples every root span except a client call made outside
// any trace: the relay's and the pollers' queries every few hundred
// milliseconds would otherwise each start a one-span trace and bury the
// traces that matter. Child spans follow their parent (ParentBased).
type noRootClients struct{}

func (noRootClients) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	d := sdktrace.RecordAndSample
	if p.Kind == trace.SpanKindClient {
		d = sdktrace.Drop
	}
	return sdktrace.SamplingResult{Decision: d, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (noRootClients) Description() string { return "NoRootClients" }
