//! A raw Kafka client for tests that need exact bytes on the wire: garbage
//! frames, oversized frames, hand-made record batches, chosen client ids,
//! with or without a TLS client certificate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

pub trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

pub struct RawClient {
    io: Box<dyn Io>,
    correlation: i32,
}

impl RawClient {
    pub fn connect(addr: &str) -> Result<RawClient> {
        let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(RawClient {
            io: Box::new(s),
            correlation: 0,
        })
    }

    /// [`RawClient::connect`], with a second handle on the same socket, for
    /// a test to reset the connection (SO_LINGER 0, then close both).
    pub fn connect_with_socket(addr: &str) -> Result<(RawClient, TcpStream)> {
        let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let handle = s.try_clone()?;
        Ok((
            RawClient {
                io: Box::new(s),
                correlation: 0,
            },
            handle,
        ))
    }

    /// Connect with TLS, trusting `ca_pem`, optionally presenting a client
    /// certificate.
    pub fn connect_tls(
        addr: &str,
        ca_pem: &str,
        client: Option<(&str, &str)>,
    ) -> Result<RawClient> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()?;
                builder
                    .with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes())?)?
            }
            None => builder.with_no_client_auth(),
        };
        let conn = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from("localhost")?.to_owned(),
        )?;
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(RawClient {
            io: Box::new(rustls::StreamOwned::new(conn, s)),
            correlation: 0,
        })
    }

    /// Send raw bytes (no framing added).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.io.write_all(bytes)?;
        self.io.flush()?;
        Ok(())
    }

    /// Read one response frame; `None` when the peer closed the connection.
    pub fn recv_frame(&mut self) -> Result<Option<Bytes>> {
        let mut size = [0u8; 4];
        match self.io.read_exact(&mut size) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        }
        let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
        self.io.read_exact(&mut body)?;
        Ok(Some(Bytes::from(body)))
    }

    /// Whether the peer closes the connection (reads EOF) within the read
    /// timeout, discarding anything it sends first.
    pub fn closed_by_peer(&mut self) -> bool {
        for _ in 0..16 {
            match self.recv_frame() {
                Ok(None) => return true,
                Ok(Some(_)) => continue,
                Err(_) => return true, // reset counts as closed
            }
        }
        false
    }

    /// Send a framed request: header (for `api`, `version`) + encoded body.
    pub fn send<T: Encodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        client_id: &str,
        body: &T,
    ) -> Result<i32> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
        let mut buf = BytesMut::new();
        header.encode(&mut buf, api.request_header_version(version))?;
        body.encode(&mut buf, version)?;
        let mut framed = (buf.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&buf);
        self.send_raw(&framed)?;
        Ok(self.correlation)
    }

    /// Send a Produce request holding `records` for one partition and decode
    /// the response.
    pub fn produce(
        &mut self,
        client_id: &str,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> Result<ProduceResponse> {
        let version = 9;
        let request = produce_request(topic, partition, records);
        let correlation = self.send(ApiKey::Produce, version, client_id, &request)?;
        let Some(mut frame) = self.recv_frame()? else {
            bail!("connection closed instead of a Produce response");
        };
        let header =
            ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(version))?;
        if header.correlation_id != correlation {
            bail!("correlation {} != {correlation}", header.correlation_id);
        }
        ProduceResponse::decode(&mut frame, version)
    }
}

/// A Produce request (`acks=-1`, 30 s timeout) of `records` for one
/// partition.
pub fn produce_request(topic: &str, partition: i32, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

/// The (error code, error message) of the single partition in a response.
pub fn partition_result(r: &ProduceResponse) -> (i16, Option<String>) {
    let p = &r.responses[0].partition_responses[0];
    (
        p.error_code,
        p.error_message.as_ref().map(|m| m.as_str().to_string()),
    )
}

/// A magic-2 record batch with `values`, as a producer with `pid` writes it
/// (keys `key-0`, `key-1`, …).
pub fn record_batch(pid: i64, values: &[&str]) -> Bytes {
    record_batch_at(pid, 0, values)
}

/// [`record_batch`] starting at `sequence` (for `pid >= 0`).
pub fn record_batch_at(pid: i64, sequence: i32, values: &[&str]) -> Bytes {
    use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};
    let keys: Vec<String> = (0..values.len()).map(|i| format!("key-{i}")).collect();
    let records: Vec<NewRecord<'_>> = values
        .iter()
        .zip(&keys)
        .enumerate()
        .map(|(i, (v, k))| NewRecord {
            key: Some(k.as_bytes()),
            value: Some(v.as_bytes()),
            headers: &[],
            timestamp: 1_700_000_000_000 + i as i64,
        })
        .collect();
    let batch = match pid {
        -1 => NewBatch::NO_PRODUCER,
        _ => NewBatch {
            producer_id: pid,
            producer_epoch: if pid >= 0 { 0 } else { -1 },
            base_sequence: if pid >= 0 { sequence } else { -1 },
            transactional: false,
            control: false,
        },
    };
    Bytes::from(build(&batch, &records).expect("a record batch of at least one record"))
}

/// SO_LINGER 0 on `s`: closing it then sends a reset, as a killed client's
/// socket does, instead of a FIN.
pub fn linger_zero(s: &TcpStream) -> Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    socket_option(s, libc::SO_LINGER, &linger, "SO_LINGER")
}

/// A 4 KiB receive buffer on `s`, so that what it does not read stays with
/// the sender.
pub fn small_receive_buffer(s: &TcpStream) -> Result<()> {
    let size: libc::c_int = 4096;
    socket_option(s, libc::SO_RCVBUF, &size, "SO_RCVBUF")
}

/// `setsockopt(SOL_SOCKET, name, value)` on `s`; `what` names the option
/// in the error.
fn socket_option<T>(s: &TcpStream, name: libc::c_int, value: &T, what: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket fd, and `value` a live `T` of the size given.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    anyhow::ensure!(rc == 0, "{what}: {}", std::io::Error::last_os_error());
    Ok(())
}
