//! The mirror side of the proxy: the producer-id mapping, mirror links and
//! the Produce filter that applies them. The planning (`produce`), the
//! reading of the broker's answers (`produce_response`) and the producer
//! state (`producer_state`) are pure; `produce_filter` and `produce_path`
//! run them on a connection's Produce requests.

pub mod barrier;
pub mod link;
pub mod origins;
pub mod pid;
pub mod produce;
pub mod produce_filter;
pub mod produce_path;
pub mod produce_response;
pub mod producer_state;
