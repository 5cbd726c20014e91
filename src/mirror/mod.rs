//! The mirror's rules, pure: the producer-id mapping (`pid`), mirror links
//! and their states (`link`, `link_state`, and which link-control records
//! apply: `control_records`), the records of the state topic
//! (`state_records`) and the origins view built from them (`origins`), the
//! plan of a Produce request (`produce`), the reading of the broker's
//! answer (`produce_response`), mirrored producer state (`producer_state`,
//! shared by every connection through `dedupe`), the barrier's bytes
//! (`barrier`), the offset translation map and its records
//! (`translation`) and where two clusters diverge after a failover
//! (`divergence`). Nothing here does I/O: `filter` runs these rules on a
//! connection's requests, `state` and `control` persist their outcomes.

pub mod barrier;
pub(crate) mod control_records;
pub(crate) mod dedupe;
pub(crate) mod divergence;
pub(crate) mod doubt;
pub mod link;
pub mod link_state;
pub mod origins;
pub mod pid;
pub mod produce;
pub(crate) mod produce_response;
pub mod producer_state;
pub mod state_records;
pub mod translation;
