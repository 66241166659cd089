//! The OTLP trace exporter, configured by the standard `OTEL_*` variables and off unless they
//! ask for it: with nothing set, no exporter, no propagator and no OpenTelemetry layer exist,
//! and a span costs what an unsubscribed `tracing` span costs.
//!
//! On when `OTEL_TRACES_EXPORTER=otlp`, or when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_TRACES_EXPORTER` is not `none`;
//! off whenever `OTEL_SDK_DISABLED=true`. Spans go over OTLP/HTTP protobuf (the exporter reads
//! the endpoint, headers and timeout variables itself) from a batch processor's own thread;
//! the resource reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, and is named `idem`
//! when they name no service. The W3C trace context propagator is installed with it.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;

/// What the `OTEL_*` variables ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// No traces: nothing configured, `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`.
    Off,
    /// Export over OTLP/HTTP protobuf.
    Otlp,
}

/// `OTEL_*` variables idem cannot honour; traces stay off and the binary says why.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An exporter other than `otlp` or `none`.
    #[error("OTEL_TRACES_EXPORTER={0} is not supported (otlp or none); traces are off")]
    Exporter(String),
    /// A protocol other than `http/protobuf`.
    #[error("{0}={1} is not supported (http/protobuf only); traces are off")]
    Protocol(&'static str, String),
    /// The exporter could not be built (a malformed endpoint).
    #[error("the OTLP exporter could not be built: {0}; traces are off")]
    Build(String),
}

/// Reads the setting from variables looked up with `var` (the process's environment, in
/// [`from_env`]).
pub fn setting(var: impl Fn(&str) -> Option<String>) -> Result<Setting, ExportError> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(Setting::Off);
    }
    let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .is_some();
    let on = match set("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        None => endpoint,
        Some(v) if v == "otlp" => true,
        Some(v) if v == "none" => false,
        Some(other) => return Err(ExportError::Exporter(other)),
    };
    if !on {
        return Ok(Setting::Off);
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = set(name) {
            if p.trim() != "http/protobuf" {
                return Err(ExportError::Protocol(name, p));
            }
            break;
        }
    }
    Ok(Setting::Otlp)
}

/// The running exporter. Dropping it (or [`Traces::shutdown`]) flushes the spans still queued.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

/// Starts the exporter if the process's `OTEL_*` variables ask for it, and installs the W3C
/// trace context propagator. Call it before any async runtime starts: the blocking HTTP
/// client runs on the batch processor's thread.
pub fn from_env() -> Result<Option<Traces>, ExportError> {
    if setting(|name| std::env::var(name).ok())? == Setting::Off {
        return Ok(None);
    }
    let exporter = SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| ExportError::Build(e.to_string()))?;
    Ok(Some(Traces::new(
        SdkTracerProvider::builder().with_batch_exporter(exporter),
    )))
}

impl Traces {
    /// Traces through `builder` (an exporter already added): the resource named as
    /// [`from_env`] says, and the W3C propagator installed.
    pub fn new(builder: opentelemetry_sdk::trace::TracerProviderBuilder) -> Self {
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok()
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES")
                .is_ok_and(|attrs| attrs.contains("service.name="));
        let resource = if named {
            Resource::builder().build()
        } else {
            Resource::builder().with_service_name("idem").build()
        };
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        Traces {
            provider: builder.with_resource(resource).build(),
        }
    }

    /// The subscriber layer that turns idem's request spans into OpenTelemetry spans, with
    /// the warnings logged inside them as span events. Other spans are left out: a trace of
    /// idem shows its decisions, not its internals.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let only_requests = Targets::new()
            .with_target("idem_core::span", LevelFilter::INFO)
            .with_default(LevelFilter::WARN);
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("idem"))
            .with_filter(only_requests)
    }

    /// Flushes the spans still queued and stops the exporter.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Setting, ExportError> {
        setting(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn off_unless_the_variables_ask() {
        assert_eq!(with(&[]).ok(), Some(Setting::Off));
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(with(&[endpoint]).ok(), Some(Setting::Otlp));
        assert_eq!(
            with(&[("OTEL_TRACES_EXPORTER", "otlp")]).ok(),
            Some(Setting::Otlp)
        );
        assert_eq!(
            with(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).ok(),
            Some(Setting::Off)
        );
        assert_eq!(
            with(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).ok(),
            Some(Setting::Off)
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let e = with(&[("OTEL_TRACES_EXPORTER", "zipkin")]);
        assert!(matches!(e, Err(ExportError::Exporter(v)) if v == "zipkin"));
        let e = with(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert!(
            matches!(e, Err(ExportError::Protocol("OTEL_EXPORTER_OTLP_PROTOCOL", p)) if p == "grpc")
        );
        let e = with(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert_eq!(e.ok(), Some(Setting::Otlp));
    }
}
