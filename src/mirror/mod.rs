//! The mirror side of the proxy: the producer-id mapping, mirror links and
//! the Produce filter that applies them. All pure.

pub mod barrier;
pub mod link;
pub mod origins;
pub mod pid;
pub mod produce;
pub mod produce_filter;
pub mod producer_state;
