"""An OpenTelemetry SDK for the tracing benches: a TracerProvider whose spans are made, batched and dropped, so that
what is measured is the SDK's cost in the process, not an exporter's."""

from typing import Any


def install_dropping_provider(*, install: bool = True) -> Any:
    """A TracerProvider with a BatchSpanProcessor and an exporter that drops every span, made the global one
    unless ``install`` is False."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    if install:
        trace.set_tracer_provider(provider)
    return provider
