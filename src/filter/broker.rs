//! The innermost service: the connection to the broker. Requests are
//! written in the order they are called, and a broker answers the requests
//! of one connection in that order, so a pending response needs to know only
//! which correlation id to expect; the session reads the frames.

use bytes::BytesMut;
use tokio::io::AsyncWrite;

use super::addresses::Learnt;
use super::{FilterError, Outcome, Pending, Request, Service};
use crate::net::frame::write_frame;

/// The write half of a broker connection.
pub struct Broker<W> {
    upstream: W,
}

impl<W> Broker<W> {
    pub fn new(upstream: W) -> Broker<W> {
        Broker { upstream }
    }
}

impl<W: AsyncWrite + Unpin + Send> Service for Broker<W> {
    type Pending = Awaiting;

    async fn call(&mut self, request: Request) -> Result<Outcome<Awaiting>, FilterError> {
        write_frame(&mut self.upstream, &request.frame)
            .await
            .map_err(FilterError::UpstreamWrite)?;
        Ok(Outcome::Owed(Awaiting {
            correlation_id: request.header.correlation_id,
        }))
    }
}

/// A request written to the broker, waiting for its response.
pub struct Awaiting {
    correlation_id: i32,
}

impl Pending for Awaiting {
    fn awaits_broker(&self) -> Option<i32> {
        Some(self.correlation_id)
    }

    fn respond(self, broker: Option<BytesMut>, _: &mut Learnt) -> Result<BytesMut, FilterError> {
        broker.ok_or(FilterError::MissingResponse)
    }
}
