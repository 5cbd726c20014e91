//! Link control: how proxy instances find each other (`members`).

pub mod members;
