//! Counts every request by API key (`kafka_mirror_proxy_requests_total`),
//! the outermost filter so that what the others answer themselves counts too.

use std::future::Future;

use tower::Layer;

use super::{FilterError, Outcome, Request, Service, Step};
use crate::metrics::Metrics;

pub(crate) struct CountLayer<'a> {
    metrics: &'a Metrics,
}

impl<'a> CountLayer<'a> {
    pub(crate) fn new(metrics: &'a Metrics) -> CountLayer<'a> {
        CountLayer { metrics }
    }
}

impl<'a, S> Layer<S> for CountLayer<'a> {
    type Service = Count<'a, S>;

    fn layer(&self, inner: S) -> Count<'a, S> {
        Count {
            metrics: self.metrics,
            inner,
        }
    }
}

pub(crate) struct Count<'a, S> {
    metrics: &'a Metrics,
    inner: S,
}

impl<S: Service> Service for Count<'_, S> {
    type Pending = S::Pending;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<S::Pending>> {
        self.metrics.request(request.header.api_key);
        self.inner.call(request)
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}
