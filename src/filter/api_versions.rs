//! ApiVersions: a client is told only the versions this proxy can parse of
//! the APIs it rewrites (the broker's answer clamped), and a request newer
//! than the proxy knows is answered here with UNSUPPORTED_VERSION in the v0
//! layout, as a broker answers it, so the client retries at a version both
//! understand.

use std::future::Future;

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use tower::Layer;

use super::addresses::{self, Learnt};
use super::{pass, FilterError, Outcome, Pending, Request, ResponseHalf, Service, Step, Then};

pub(crate) struct ApiVersionsLayer;

impl<S> Layer<S> for ApiVersionsLayer {
    type Service = ApiVersions<S>;

    fn layer(&self, inner: S) -> ApiVersions<S> {
        ApiVersions { inner }
    }
}

pub(crate) struct ApiVersions<S> {
    inner: S,
}

impl<S: Service> Service for ApiVersions<S> {
    type Pending = Then<S::Pending, Clamp>;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Self::Pending>> {
        let version = request.header.api_version;
        if request.api != Some(ApiKey::ApiVersions) {
            pass(&mut self.inner, request, Then::inner)
        } else if version > addresses::api_versions_max() {
            let answer = addresses::unsupported_api_versions(request.header.correlation_id);
            Step::Ready(
                answer
                    .map_err(FilterError::from)
                    .map(|frame| Outcome::Owed(Then::local(frame))),
            )
        } else {
            pass(&mut self.inner, request, move |p| {
                Then::new(p, Clamp { version })
            })
        }
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

/// The response half: the broker's version ranges clamped.
pub(crate) struct Clamp {
    version: i16,
}

impl ResponseHalf for Clamp {
    fn respond(self, frame: BytesMut, _: &mut Learnt) -> Result<BytesMut, FilterError> {
        Ok(addresses::clamp_api_versions(self.version, &frame)?.unwrap_or(frame))
    }
}
