//! The innermost service: the connection to the broker. A request passed
//! on to it is written by the flush that follows its call, so requests are
//! written in the order they are called, and a broker answers the requests
//! of one connection in that order, so a pending response needs to know only
//! which correlation id to expect; the session reads the frames.

use std::future::Future;

use bytes::BytesMut;
use tokio::io::AsyncWrite;

use super::addresses::Learnt;
use super::{FilterError, Outcome, Pending, Request, Service, Step};
use crate::net::frame::write_frame;

/// The write half of a broker connection.
pub(crate) struct Broker<W> {
    upstream: W,
    /// The frame the last call forwarded, until it is flushed.
    forwarded: Option<BytesMut>,
}

impl<W> Broker<W> {
    pub(crate) fn new(upstream: W) -> Broker<W> {
        Broker {
            upstream,
            forwarded: None,
        }
    }
}

impl<W: AsyncWrite + Unpin + Send> Service for Broker<W> {
    type Pending = Answer;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Answer>> {
        let correlation_id = request.header.correlation_id;
        // One call, then its flush: a second frame would replace the first.
        debug_assert!(
            self.forwarded.is_none(),
            "a forwarded frame was not flushed"
        );
        self.forwarded = Some(request.frame);
        Step::Ready(Ok(Outcome::Owed(Answer::Broker(correlation_id))))
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        let frame = self.forwarded.take();
        async move {
            match frame {
                Some(frame) => write_frame(&mut self.upstream, &frame)
                    .await
                    .map_err(FilterError::UpstreamWrite),
                None => Ok(()),
            }
        }
    }
}

/// A request's response: the broker's, to the request written with this
/// correlation id, or one the proxy made.
pub(crate) enum Answer {
    Broker(i32),
    Local(BytesMut),
}

impl Pending for Answer {
    fn local(frame: BytesMut) -> Answer {
        Answer::Local(frame)
    }

    fn awaits_broker(&self) -> Option<i32> {
        match self {
            Answer::Broker(correlation_id) => Some(*correlation_id),
            Answer::Local(_) => None,
        }
    }

    fn respond(self, broker: Option<BytesMut>, _: &mut Learnt) -> Result<BytesMut, FilterError> {
        match self {
            Answer::Broker(_) => broker.ok_or(FilterError::MissingResponse),
            Answer::Local(frame) => Ok(frame),
        }
    }
}
