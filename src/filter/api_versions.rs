//! ApiVersions: a client is told only the versions this proxy can parse of
//! the APIs it rewrites (the broker's answer clamped), and a request newer
//! than the proxy knows is answered here with UNSUPPORTED_VERSION in the v0
//! layout, as a broker answers it, so the client retries at a version both
//! understand.

use std::future::{ready, Future};

use bytes::BytesMut;
use futures_util::future::Either;
use kafka_protocol::messages::ApiKey;
use tower::Layer;

use super::addresses::{self, Learnt};
use super::{pass, FilterError, Outcome, Reply, Request, ResponseHalf, Service};

pub struct ApiVersionsLayer;

impl<S> Layer<S> for ApiVersionsLayer {
    type Service = ApiVersions<S>;

    fn layer(&self, inner: S) -> ApiVersions<S> {
        ApiVersions { inner }
    }
}

pub struct ApiVersions<S> {
    inner: S,
}

impl<S: Service> Service for ApiVersions<S> {
    type Pending = Reply<S::Pending, Clamp>;

    fn call(
        &mut self,
        request: Request,
    ) -> impl Future<Output = Result<Outcome<Self::Pending>, FilterError>> + Send {
        let version = request.header.api_version;
        if request.api != Some(ApiKey::ApiVersions) {
            Either::Left(pass(&mut self.inner, request, Reply::Inner))
        } else if version > addresses::api_versions_max() {
            let answer = addresses::unsupported_api_versions(request.header.correlation_id);
            Either::Right(Either::Left(ready(
                answer
                    .map_err(FilterError::from)
                    .map(|frame| Outcome::Owed(Reply::Local(frame))),
            )))
        } else {
            Either::Right(Either::Right(pass(&mut self.inner, request, move |p| {
                Reply::Then(p, Clamp { version })
            })))
        }
    }
}

/// The response half: the broker's version ranges clamped.
pub struct Clamp {
    version: i16,
}

impl ResponseHalf for Clamp {
    fn respond(self, frame: BytesMut, _: &mut Learnt) -> Result<BytesMut, FilterError> {
        Ok(addresses::clamp_api_versions(self.version, &frame)?.unwrap_or(frame))
    }
}
