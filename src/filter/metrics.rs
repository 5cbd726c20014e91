//! Counts every request by API key (`kafka_mirror_proxy_requests_total`),
//! the outermost filter so that what the others answer themselves counts too.

use std::future::Future;

use tower::Layer;

use super::{FilterError, Outcome, Request, Service};
use crate::metrics::Metrics;

pub struct CountLayer<'a> {
    metrics: &'a Metrics,
}

impl<'a> CountLayer<'a> {
    pub fn new(metrics: &'a Metrics) -> CountLayer<'a> {
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

pub struct Count<'a, S> {
    metrics: &'a Metrics,
    inner: S,
}

impl<S: Service> Service for Count<'_, S> {
    type Pending = S::Pending;

    fn call(
        &mut self,
        request: Request,
    ) -> impl Future<Output = Result<Outcome<S::Pending>, FilterError>> + Send {
        self.metrics.request(request.header.api_key);
        self.inner.call(request)
    }
}
