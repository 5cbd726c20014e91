//! Fencing (SPEC §7): once a link is STOPPING or STOPPED, a request of its
//! replicator is refused (a Produce is answered with the fenced error for
//! every partition; anything else gets no answer) and its connection
//! closes after answering what is in flight. A link Produce that waits in
//! the Produce filter is checked again there before it is forwarded.
//!
//! ApiVersions alone is answered as usual: a client negotiates versions
//! before anything else on a new connection, and a replicator that
//! reconnects after the failover must get as far as a Produce to be told,
//! with the fenced error naming the link, that it is fenced. It changes
//! nothing and reveals only what any client is told.

use std::future::Future;
use std::sync::Arc;

use kafka_protocol::messages::ApiKey;
use tower::Layer;

use super::produce::refuse_every_partition;
use super::{Context, FilterError, Outcome, Pending, Request, Service, Step};
use crate::mirror::link::{Link, Origin};
use crate::mirror::produce::Refusal;

pub(crate) struct FenceLayer<'a> {
    ctx: &'a Context,
}

impl<'a> FenceLayer<'a> {
    pub(crate) fn new(ctx: &'a Context) -> FenceLayer<'a> {
        FenceLayer { ctx }
    }
}

impl<'a, S> Layer<S> for FenceLayer<'a> {
    type Service = Fence<'a, S>;

    fn layer(&self, inner: S) -> Fence<'a, S> {
        Fence {
            ctx: self.ctx,
            inner,
        }
    }
}

pub(crate) struct Fence<'a, S> {
    ctx: &'a Context,
    inner: S,
}

impl<S: Service> Service for Fence<'_, S> {
    type Pending = S::Pending;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<S::Pending>> {
        let fenced = match &request.origin {
            Origin::Link(_) if request.api == Some(ApiKey::ApiVersions) => None,
            Origin::Link(link) => self.ctx.control.fenced(link).map(|m| (Arc::clone(link), m)),
            _ => None,
        };
        match fenced {
            None => self.inner.call(request),
            Some((link, message)) => Step::Ready(self.refuse(request, &link, &message)),
        }
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

impl<S> Fence<'_, S> {
    /// A request of a fenced link: a Produce is answered with the fenced
    /// error for every partition, anything else gets no answer.
    fn refuse<P: Pending>(
        &self,
        request: Request,
        link: &Link,
        message: &str,
    ) -> Result<Outcome<P>, FilterError> {
        self.ctx.control.link_request_refused(link.name());
        let owed = match request.api {
            Some(ApiKey::Produce) => refuse_every_partition(
                self.ctx,
                link.name(),
                &request.header,
                request.frame.freeze(),
                Refusal::LinkFenced,
                message,
            )?
            .map(P::local),
            _ => None,
        };
        tracing::debug!(link = link.name(), api = ?request.api, "refused a request of a fenced link; closing its connection");
        Ok(Outcome::Fenced {
            owed,
            link: link.name().to_string(),
        })
    }
}
