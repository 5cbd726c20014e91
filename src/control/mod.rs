//! Link control: what a failover does to a link (SPEC §7).
//!
//! - `api`: the admin API's bodies, typed once for the proxy and the CLI.
//! - `barriers`: one partition's `MIRROR_PID_RESET` barrier, sent, recorded
//!   in the state topic and applied to the producer state.
//! - `members`: the live proxy instances on the state topic.
//! - `io`: what the control needs of the state store, the instances' group
//!   and barrier placing, as traits (so its decisions are unit-tested).
//! - `links`: the `Control` object the admin API calls, the fencing
//!   and draining every instance does, and the failover runner.

pub(crate) mod api;
pub mod barriers;
pub(crate) mod io;
pub(crate) mod links;
pub mod members;

pub(crate) use links::Control;
