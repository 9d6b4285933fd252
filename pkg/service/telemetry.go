package service

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// SetupTelemetry installs global OpenTelemetry providers for the service:
// metrics exported in Prometheus format (the returned handler serves
// /metrics) and a tracer provider with W3C trace-context propagation, so the
// traceparent stored in outbox rows and carried on SQS messages joins one
// trace. Spans are sampled but not exported unless an exporter is added
// here (an OTLP exporter is one line); propagation works regardless.
func SetupTelemetry(name string) (metrics http.Handler, shutdown func(context.Context) error, err error) {
	res := resource.NewSchemaless(semconv.ServiceName(name))
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	otel.SetMeterProvider(mp)
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), func(ctx context.Context) error {
		_ = tp.Shutdown(ctx)
		return mp.Shutdown(ctx)
	}, nil
}
