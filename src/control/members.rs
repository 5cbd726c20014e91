//! Placeholder (replaced by the "members" helper's version at merge): the
//! live proxy instances on this state topic. Here only this instance, with
//! an id made at start-up.

use crate::client::ClientError;

/// This instance and the others it can see.
#[derive(Debug)]
pub struct Members {
    instance_id: String,
}

impl Members {
    /// A random instance id (a UUID from the operating system's random source).
    pub fn new() -> Members {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 16];
        let _ = ring::rand::SystemRandom::new().fill(&mut b);
        let id = uuid::Builder::from_random_bytes(b).into_uuid();
        Members {
            instance_id: id.to_string(),
        }
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The instance ids of every live proxy on this state topic, this one
    /// included.
    pub async fn live_instances(&self) -> Result<Vec<String>, ClientError> {
        Ok(vec![self.instance_id.clone()])
    }
}

impl Default for Members {
    fn default() -> Self {
        Members::new()
    }
}
