//! Prometheus metrics rendered by hand in the text exposition format: sandboxes by state, a
//! create-latency histogram, execs, gateway bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Upper bounds (seconds) of the create-latency histogram buckets.
const BUCKETS: &[f64] = &[0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[derive(Default)]
pub struct Metrics {
    pub creates: AtomicU64,
    pub create_failures: AtomicU64,
    pub kills: AtomicU64,
    pub gateway_requests: AtomicU64,
    pub execs: AtomicU64,
    pub gateway_bytes_in: std::sync::Arc<AtomicU64>,
    pub gateway_bytes_out: std::sync::Arc<AtomicU64>,
    create_buckets: [AtomicU64; 10],
    create_sum_micros: AtomicU64,
}

impl Metrics {
    pub fn observe_create(&self, seconds: f64) {
        self.creates.fetch_add(1, Ordering::Relaxed);
        self.create_sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        for (i, b) in BUCKETS.iter().enumerate() {
            if seconds <= *b {
                self.create_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The exposition text; `states` are (state, count) gauges of live sandboxes.
    pub fn render(&self, states: &[(&str, u64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP cella_sandboxes Sandboxes by state.\n# TYPE cella_sandboxes gauge\n");
        for (state, n) in states {
            out.push_str(&format!("cella_sandboxes{{state=\"{state}\"}} {n}\n"));
        }
        let count = self.creates.load(Ordering::Relaxed);
        out.push_str("# HELP cella_sandbox_create_seconds Time to create a sandbox.\n# TYPE cella_sandbox_create_seconds histogram\n");
        for (i, b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!(
                "cella_sandbox_create_seconds_bucket{{le=\"{b}\"}} {}\n",
                self.create_buckets[i].load(Ordering::Relaxed)
            ));
        }
        out.push_str(&format!(
            "cella_sandbox_create_seconds_bucket{{le=\"+Inf\"}} {count}\n"
        ));
        out.push_str(&format!(
            "cella_sandbox_create_seconds_sum {}\n",
            self.create_sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        ));
        out.push_str(&format!("cella_sandbox_create_seconds_count {count}\n"));
        for (name, help, v) in [
            (
                "cella_sandbox_create_failures_total",
                "Sandbox creations that failed.",
                &self.create_failures,
            ),
            (
                "cella_sandbox_kills_total",
                "Sandboxes killed.",
                &self.kills,
            ),
            (
                "cella_gateway_requests_total",
                "Requests passed to sandboxes' envd.",
                &self.gateway_requests,
            ),
            (
                "cella_execs_total",
                "Processes started through the gateway.",
                &self.execs,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        out.push_str("# HELP cella_gateway_bytes_total Bytes through the envd gateway.\n# TYPE cella_gateway_bytes_total counter\n");
        out.push_str(&format!(
            "cella_gateway_bytes_total{{direction=\"in\"}} {}\n",
            self.gateway_bytes_in.load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "cella_gateway_bytes_total{{direction=\"out\"}} {}\n",
            self.gateway_bytes_out.load(Ordering::Relaxed)
        ));
        out
    }
}

pin_project_lite::pin_project! {
    /// A body that counts the bytes flowing through it.
    pub struct CountingBody<B> {
        #[pin]
        inner: B,
        counter: std::sync::Arc<AtomicU64>,
    }
}

impl<B> CountingBody<B> {
    pub fn new(inner: B, counter: &std::sync::Arc<AtomicU64>) -> Self {
        CountingBody {
            inner,
            counter: counter.clone(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for CountingBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.counter.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One exported pool series: name, type, help, value.
type PoolSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&cella_sandbox::PoolStats) -> u64,
);

/// Warm-pool gauges and counters, one series per template.
pub fn render_pools(pools: &[cella_sandbox::PoolStats]) -> String {
    let mut out = String::new();
    if pools.is_empty() {
        return out;
    }
    let series: [PoolSeries; 5] = [
        (
            "cella_warm_pool_ready",
            "gauge",
            "Ready sandboxes in the warm pool.",
            |p| p.ready as u64,
        ),
        (
            "cella_warm_pool_target",
            "gauge",
            "Configured size of the warm pool.",
            |p| p.target as u64,
        ),
        (
            "cella_warm_pool_hits_total",
            "counter",
            "Creates served from the warm pool.",
            |p| p.hits,
        ),
        (
            "cella_warm_pool_misses_total",
            "counter",
            "Creates that found the warm pool empty.",
            |p| p.misses,
        ),
        (
            "cella_warm_pool_failures_total",
            "counter",
            "Warm-pool sandboxes that failed to build.",
            |p| p.failures,
        ),
    ];
    for (name, kind, help, value) in series {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for p in pools {
            out.push_str(&format!(
                "{name}{{template=\"{}\"}} {}\n",
                p.template,
                value(p)
            ));
        }
    }
    out
}
