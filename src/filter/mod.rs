//! The per-request filters: what the proxy does to a request on its way to
//! the broker and to the response on its way back. `produce` is the
//! Produce path (read-only rule, link remap, producer state; `rebuild`
//! reads a partition's tail for it), `addresses` rewrites the broker
//! addresses in responses and clamps ApiVersions.
//!
//! A filter sees a [`Context`]: what a request may read or change of the
//! process, and nothing of its listeners or connections. What a response
//! teaches the proxy (brokers, topic ids) goes back to the caller as a
//! [`addresses::Learnt`], so opening a listener for a new broker stays the
//! proxy's job.

pub mod addresses;
pub mod produce;
pub mod rebuild;

use std::sync::{Arc, RwLock};

use tokio::sync::watch;
use uuid::Uuid;

use crate::control::Control;
use crate::metrics::Metrics;
use crate::mirror::dedupe::Dedupe;
use crate::mirror::link::Links;
use crate::state::StateStore;
use addresses::Advertised;

/// What the filters of every connection share.
pub struct Context {
    pub links: Links,
    pub metrics: Arc<Metrics>,
    /// Link states, fencing and failovers.
    pub control: Arc<Control>,
    /// Mirrored producer state (SPEC §6), for link Produce requests.
    pub dedupe: Arc<Dedupe>,
    /// The state topic; `None` without mirror links.
    pub state: Option<Arc<StateStore>>,
    /// The proxy's address for each broker.
    pub advertised: Advertised,
    pub topics: TopicTable,
    /// Becomes `true` when the proxy begins to shut down.
    pub shutdown: watch::Receiver<bool>,
}

impl Context {
    /// Resolves once shutdown has begun (at once if it already has).
    pub async fn shutting_down(&self) {
        let mut rx = self.shutdown.clone();
        if rx.wait_for(|stop| *stop).await.is_err() {
            // The sender lives as long as the proxy: not reached.
            std::future::pending::<()>().await;
        }
    }
}

/// Topic ids and names seen in Metadata responses, both ways. Names are
/// shared: looked up for every link Produce v13, where a copy would be an
/// allocation per request.
#[derive(Default)]
pub struct TopicTable {
    names: RwLock<foldhash::HashMap<Uuid, Arc<str>>>,
    ids: RwLock<foldhash::HashMap<String, Uuid>>,
}

impl TopicTable {
    /// The id of a topic named in a Metadata response (no allocation).
    pub fn id(&self, name: &str) -> Option<Uuid> {
        self.ids.read().ok()?.get(name).copied()
    }

    /// The name of a topic id seen in a Metadata response.
    pub fn name(&self, id: Uuid) -> Option<Arc<str>> {
        self.names.read().ok()?.get(&id).cloned()
    }

    /// Remember `topics` (id, name).
    pub fn learn(&self, topics: Vec<(Uuid, String)>) {
        if topics.is_empty() {
            return;
        }
        if let Ok(mut ids) = self.ids.write() {
            ids.extend(topics.iter().map(|(id, name)| (name.clone(), *id)));
        }
        if let Ok(mut names) = self.names.write() {
            names.extend(topics.into_iter().map(|(id, name)| (id, Arc::from(name))));
        }
    }
}
