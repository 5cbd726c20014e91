//! The `__mirror_state` topic.

pub mod records;
