//! Topic administration the replicator needs to make a destination topic
//! follow its source: a topic's configuration overrides (the values set on
//! the topic itself, not inherited), partitions added, configuration
//! changed one key at a time (IncrementalAlterConfigs).
//!
//! Builders and interpreters are pure; the [`Client`] methods at the end
//! send them, retried like every other operation of the client.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::error::ClientError;
use super::protocol::{missing, text, topic_configs, topic_name};
use super::{millis_i32, Client};

/// Kafka's resource type for topics.
const RESOURCE_TOPIC: i8 = 2;
/// `ConfigSource.DYNAMIC_TOPIC_CONFIG`: set on the topic itself.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;

/// One change of `alter_topic_configs_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigChange {
    Set(String, String),
    /// Back to what the topic inherits.
    Delete(String),
}

/// Every configuration value of a topic.
pub(crate) fn describe_topic_request(topic: &str) -> DescribeConfigsRequest {
    DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(topic.to_string()))
        .with_configuration_keys(None)])
}

/// The topic's own overrides: the values whose source is the topic
/// itself (sensitive values, which come without one, are left out).
pub(crate) fn topic_overrides(
    r: &DescribeConfigsResponse,
    topic: &str,
) -> Result<BTreeMap<String, String>, ClientError> {
    Ok(topic_configs(r, topic)?
        .configs
        .iter()
        .filter(|c| c.config_source == DYNAMIC_TOPIC_CONFIG)
        .filter_map(|c| Some((c.name.to_string(), text(&c.value)?)))
        .collect())
}

/// Grow `topic` to `count` partitions in all.
pub(crate) fn create_partitions_request(
    topic: &str,
    count: i32,
    timeout_ms: i32,
) -> CreatePartitionsRequest {
    CreatePartitionsRequest::default()
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(topic))
            .with_count(count)
            .with_assignments(None)])
        .with_timeout_ms(timeout_ms)
}

/// `Ok(true)` when partitions were added, `Ok(false)` when the topic had
/// `count` already (INVALID_PARTITIONS: another instance was first).
pub(crate) fn create_partitions_result(
    r: &CreatePartitionsResponse,
    topic: &str,
) -> Result<bool, ClientError> {
    let t = r
        .results
        .iter()
        .find(|t| t.name.0.as_str() == topic)
        .ok_or_else(|| missing("CreatePartitions", topic))?;
    match t.error_code {
        0 => Ok(true),
        37 => Ok(false), // INVALID_PARTITIONS: not more than it has
        code => Err(ClientError::Kafka {
            context: format!("add partitions to {topic}"),
            code,
            message: text(&t.error_message),
        }),
    }
}

pub(crate) fn alter_topic_configs_request(
    topic: &str,
    changes: &[ConfigChange],
) -> IncrementalAlterConfigsRequest {
    let configs = changes
        .iter()
        .map(|c| match c {
            ConfigChange::Set(k, v) => AlterableConfig::default()
                .with_name(StrBytes::from_string(k.clone()))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_string(v.clone()))),
            ConfigChange::Delete(k) => AlterableConfig::default()
                .with_name(StrBytes::from_string(k.clone()))
                .with_config_operation(1)
                .with_value(None),
        })
        .collect();
    IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(topic.to_string()))
        .with_configs(configs)])
}

pub(crate) fn alter_topic_configs_result(
    r: &IncrementalAlterConfigsResponse,
    topic: &str,
) -> Result<(), ClientError> {
    let res = r
        .responses
        .iter()
        .find(|x| x.resource_type == RESOURCE_TOPIC && x.resource_name.as_str() == topic)
        .ok_or_else(|| missing("IncrementalAlterConfigs", topic))?;
    match res.error_code {
        0 => Ok(()),
        code => Err(ClientError::Kafka {
            context: format!("alter configs of topic {topic}"),
            code,
            message: text(&res.error_message),
        }),
    }
}

impl Client {
    /// A topic's own configuration overrides (`topic_overrides`).
    pub async fn topic_overrides(
        &self,
        topic: &str,
    ) -> Result<BTreeMap<String, String>, ClientError> {
        self.retrying(&format!("describe configs of {topic}"), || async move {
            let (_, r) = self
                .call_any(None, |_| Ok(describe_topic_request(topic)))
                .await?;
            topic_overrides(&r, topic)
        })
        .await
    }

    /// Grow a topic to `count` partitions; `Ok(false)` when it had them.
    pub async fn create_partitions(&self, topic: &str, count: i32) -> Result<bool, ClientError> {
        let timeout_ms = millis_i32(self.config().request_timeout * 9 / 10);
        self.retrying(&format!("add partitions to {topic}"), || async move {
            let controller = super::lock(&self.inner.cluster).controller_address();
            let (_, r) = self
                .call_any(controller, |_| {
                    Ok(create_partitions_request(topic, count, timeout_ms))
                })
                .await?;
            create_partitions_result(&r, topic)
        })
        .await
    }

    /// Apply `changes` to a topic's configuration.
    pub async fn alter_topic_configs(
        &self,
        topic: &str,
        changes: &[ConfigChange],
    ) -> Result<(), ClientError> {
        self.retrying(&format!("alter configs of {topic}"), || async move {
            let (_, r) = self
                .call_any(None, |_| Ok(alter_topic_configs_request(topic, changes)))
                .await?;
            alter_topic_configs_result(&r, topic)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
    use kafka_protocol::messages::describe_configs_response::{
        DescribeConfigsResourceResult, DescribeConfigsResult,
    };

    #[test]
    fn only_the_topics_own_values_are_overrides() {
        let config = |name: &str, value: Option<&str>, source: i8| {
            DescribeConfigsResourceResult::default()
                .with_name(StrBytes::from_string(name.into()))
                .with_value(value.map(|v| StrBytes::from_string(v.into())))
                .with_config_source(source)
        };
        let r =
            DescribeConfigsResponse::default().with_results(vec![DescribeConfigsResult::default()
                .with_resource_type(RESOURCE_TOPIC)
                .with_resource_name(StrBytes::from_static_str("t"))
                .with_configs(vec![
                    config("retention.ms", Some("1000"), DYNAMIC_TOPIC_CONFIG),
                    config("segment.bytes", Some("1073741824"), 5), // DEFAULT_CONFIG
                    config("cleanup.policy", Some("compact"), DYNAMIC_TOPIC_CONFIG),
                    config("secret", None, DYNAMIC_TOPIC_CONFIG),
                ])]);
        let got = topic_overrides(&r, "t").expect("answered");
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("retention.ms".to_string(), "1000".to_string())
            ]
        );
        assert!(topic_overrides(&r, "other").is_err());
    }

    #[test]
    fn partitions_already_there_are_not_an_error() {
        let answer = |code| {
            CreatePartitionsResponse::default().with_results(vec![
                CreatePartitionsTopicResult::default()
                    .with_name(topic_name("t"))
                    .with_error_code(code),
            ])
        };
        assert_eq!(create_partitions_result(&answer(0), "t").ok(), Some(true));
        assert_eq!(create_partitions_result(&answer(37), "t").ok(), Some(false));
        assert!(create_partitions_result(&answer(29), "t").is_err());
    }

    #[test]
    fn a_change_sets_or_deletes_one_key() {
        let r = alter_topic_configs_request(
            "t",
            &[
                ConfigChange::Set("retention.ms".into(), "5".into()),
                ConfigChange::Delete("segment.ms".into()),
            ],
        );
        let c = &r.resources[0].configs;
        assert_eq!(
            (c[0].config_operation, c[0].value.as_deref()),
            (0, Some("5"))
        );
        assert_eq!((c[1].config_operation, c[1].value.as_deref()), (1, None));
    }
}
