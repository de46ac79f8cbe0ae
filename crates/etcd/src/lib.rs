//! A client of etcd's v3 gRPC API, for what Skiff's etcd store does: ranges, puts, deletes,
//! transactions, compaction and watches, over one HTTP/2 channel balanced across the given
//! endpoints, with TLS and client certificates when asked.
//!
//! The messages are declared in Rust ([`proto`]), not generated from etcd's `.proto` files at
//! build time: building Skiff needs no protobuf compiler. The store's tests against a real etcd
//! (`crates/store`) are what hold the declarations to etcd's wire format.

pub mod proto;

use std::time::Duration;

use proto::{compare::TargetUnion, request_op::Request, response_op::Response};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// What an etcd call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid etcd endpoint {0:?}: {1}")]
    InvalidEndpoint(String, #[source] tonic::transport::Error),
    #[error("etcd TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("no etcd endpoint given")]
    NoEndpoints,
    #[error("etcd connection: {0}")]
    Transport(#[source] tonic::transport::Error),
    /// etcd (or the channel) answered with a gRPC status; its message says what etcd refused.
    #[error("grpc request error: {0}")]
    GRpcStatus(tonic::Status),
    #[error("etcd watch: {0}")]
    Watch(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::GRpcStatus(s)
    }
}

/// A PEM certificate (the CA the members' certificates are verified with).
pub struct Certificate(Vec<u8>);

impl Certificate {
    pub fn from_pem(pem: impl Into<Vec<u8>>) -> Self {
        Certificate(pem.into())
    }
}

/// A client certificate and its key, PEM.
pub struct Identity {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Identity {
    pub fn from_pem(cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        Identity {
            cert: cert.into(),
            key: key.into(),
        }
    }
}

/// TLS toward the members: the CA to verify them with and the identity to present.
#[derive(Default)]
pub struct TlsOptions {
    ca: Option<Certificate>,
    identity: Option<Identity>,
}

impl TlsOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn ca_certificate(mut self, ca: Certificate) -> Self {
        self.ca = Some(ca);
        self
    }
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }
}

/// How to reach the members.
#[derive(Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    keep_alive_while_idle: bool,
    tls: Option<TlsOptions>,
}

impl ConnectOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }
    /// HTTP/2 pings every `interval`, the connection dropped when one is unanswered for `timeout`.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }
    pub fn with_keep_alive_while_idle(mut self, enabled: bool) -> Self {
        self.keep_alive_while_idle = enabled;
        self
    }
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// A connection to an etcd cluster; cheap to clone (the channel is shared).
#[derive(Clone)]
pub struct Client {
    channel: Channel,
}

impl Client {
    /// A channel to `endpoints` (`HOST:PORT` or URLs; `https://` is assumed with TLS), balanced
    /// across them. Connections are made when first used, and again after a member goes away.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<ConnectOptions>,
    ) -> Result<Client> {
        let options = options.unwrap_or_default();
        let tls = match &options.tls {
            Some(t) => {
                let mut config = ClientTlsConfig::new();
                if let Some(ca) = &t.ca {
                    config = config.ca_certificate(tonic::transport::Certificate::from_pem(&ca.0));
                }
                if let Some(id) = &t.identity {
                    config = config.identity(tonic::transport::Identity::from_pem(&id.cert, &id.key));
                }
                Some(config)
            }
            None => None,
        };
        let mut list = Vec::new();
        for e in endpoints.as_ref() {
            let e = e.as_ref();
            let url = if e.contains("://") {
                e.to_string()
            } else if tls.is_some() {
                format!("https://{e}")
            } else {
                format!("http://{e}")
            };
            let mut endpoint = Endpoint::from_shared(url).map_err(|err| Error::InvalidEndpoint(e.to_string(), err))?;
            endpoint = endpoint.tcp_nodelay(true);
            if let Some(t) = options.connect_timeout {
                endpoint = endpoint.connect_timeout(t);
            }
            if let Some((interval, timeout)) = options.keep_alive {
                endpoint = endpoint.http2_keep_alive_interval(interval).keep_alive_timeout(timeout);
            }
            endpoint = endpoint.keep_alive_while_idle(options.keep_alive_while_idle);
            if let Some(config) = &tls {
                endpoint = endpoint.tls_config(config.clone()).map_err(Error::Tls)?;
            }
            list.push(endpoint);
        }
        if list.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let channel = if list.len() == 1 {
            list.remove(0).connect_lazy()
        } else {
            Channel::balance_list(list.into_iter())
        };
        Ok(Client { channel })
    }

    pub fn kv_client(&self) -> KvClient {
        KvClient {
            grpc: tonic::client::Grpc::new(self.channel.clone()),
        }
    }

    pub fn watch_client(&self) -> WatchClient {
        WatchClient {
            grpc: tonic::client::Grpc::new(self.channel.clone()),
        }
    }

    /// Defragments the member this client reaches (a client of one endpoint, as etcdctl's
    /// `defrag` asks each member in turn): its database file is rewritten without free pages.
    pub async fn defragment(&mut self) -> Result<proto::DefragmentResponse> {
        self.kv_client()
            .unary("/etcdserverpb.Maintenance/Defragment", proto::DefragmentRequest {})
            .await
    }

    /// A put (see [`KvClient::put`]).
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<PutResponse> {
        self.kv_client().put(key, value, options).await
    }
}

pub type GetResponse = proto::RangeResponse;
pub type PutResponse = proto::PutResponse;
pub type DeleteResponse = proto::DeleteRangeResponse;
pub type TxnResponse = proto::TxnResponse;
pub type CompactionResponse = proto::CompactionResponse;
pub type WatchResponse = proto::WatchResponse;
pub type KeyValue = proto::KeyValue;
pub type Event = proto::Event;
pub type EventType = proto::EventType;

/// Options of a range read.
#[derive(Clone, Default)]
pub struct GetOptions(proto::RangeRequest);

impl GetOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// Every key in `[key, end)`.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.0.range_end = end.into();
        self
    }
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.0.limit = limit;
        self
    }
    /// As of `revision` (0: the latest).
    pub fn with_revision(mut self, revision: i64) -> Self {
        self.0.revision = revision;
        self
    }
    pub fn with_keys_only(mut self) -> Self {
        self.0.keys_only = true;
        self
    }
    pub fn with_count_only(mut self) -> Self {
        self.0.count_only = true;
        self
    }
    pub fn with_min_mod_revision(mut self, revision: i64) -> Self {
        self.0.min_mod_revision = revision;
        self
    }
    fn request(self, key: Vec<u8>) -> proto::RangeRequest {
        proto::RangeRequest { key, ..self.0 }
    }
}

/// Options of a put.
#[derive(Clone, Default)]
pub struct PutOptions(proto::PutRequest);

impl PutOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// The value replaced comes back in the response.
    pub fn with_prev_key(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    fn request(self, key: Vec<u8>, value: Vec<u8>) -> proto::PutRequest {
        proto::PutRequest { key, value, ..self.0 }
    }
}

/// Options of a delete.
#[derive(Clone, Default)]
pub struct DeleteOptions(proto::DeleteRangeRequest);

impl DeleteOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// The values deleted come back in the response.
    pub fn with_prev_key(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    fn request(self, key: Vec<u8>) -> proto::DeleteRangeRequest {
        proto::DeleteRangeRequest { key, ..self.0 }
    }
}

/// Options of a compaction.
#[derive(Clone, Default)]
pub struct CompactionOptions {
    physical: bool,
}

impl CompactionOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// The call returns once the compaction is applied to the backend.
    pub fn with_physical(mut self) -> Self {
        self.physical = true;
        self
    }
}

/// How a [`Compare`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

impl From<CompareOp> for proto::CompareResult {
    fn from(op: CompareOp) -> Self {
        match op {
            CompareOp::Equal => proto::CompareResult::Equal,
            CompareOp::Greater => proto::CompareResult::Greater,
            CompareOp::Less => proto::CompareResult::Less,
            CompareOp::NotEqual => proto::CompareResult::NotEqual,
        }
    }
}

/// A condition of a transaction on one key.
#[derive(Clone)]
pub struct Compare(proto::Compare);

impl Compare {
    fn new(key: Vec<u8>, op: CompareOp, target: proto::CompareTarget, value: TargetUnion) -> Self {
        Compare(proto::Compare {
            result: proto::CompareResult::from(op) as i32,
            target: target as i32,
            key,
            target_union: Some(value),
            range_end: Vec::new(),
        })
    }
    /// The key's version (0 when absent).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        Self::new(
            key.into(),
            op,
            proto::CompareTarget::Version,
            TargetUnion::Version(version),
        )
    }
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(
            key.into(),
            op,
            proto::CompareTarget::Create,
            TargetUnion::CreateRevision(revision),
        )
    }
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(
            key.into(),
            op,
            proto::CompareTarget::Mod,
            TargetUnion::ModRevision(revision),
        )
    }
}

/// One operation of a transaction.
#[derive(Clone)]
pub struct TxnOp(proto::RequestOp);

impl TxnOp {
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        let r = options.unwrap_or_default().request(key.into());
        TxnOp(proto::RequestOp {
            request: Some(Request::RequestRange(r)),
        })
    }
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, options: Option<PutOptions>) -> Self {
        let r = options.unwrap_or_default().request(key.into(), value.into());
        TxnOp(proto::RequestOp {
            request: Some(Request::RequestPut(r)),
        })
    }
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Self {
        let r = options.unwrap_or_default().request(key.into());
        TxnOp(proto::RequestOp {
            request: Some(Request::RequestDeleteRange(r)),
        })
    }
}

/// A transaction: if every comparison holds, the `and_then` operations, else the `or_else` ones.
#[derive(Clone, Default)]
pub struct Txn(proto::TxnRequest);

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.0.compare.extend(compares.into_iter().map(|c| c.0));
        self
    }
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.success.extend(ops.into_iter().map(|o| o.0));
        self
    }
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.failure.extend(ops.into_iter().map(|o| o.0));
        self
    }
}

/// The answer of one operation of a transaction.
#[derive(Clone, Debug)]
pub enum TxnOpResponse {
    Get(GetResponse),
    Put(PutResponse),
    Delete(DeleteResponse),
    Txn(TxnResponse),
}

impl proto::ResponseHeader {
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl proto::RangeResponse {
    pub fn header(&self) -> Option<&proto::ResponseHeader> {
        self.header.as_ref()
    }
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    pub fn more(&self) -> bool {
        self.more
    }
    pub fn count(&self) -> i64 {
        self.count
    }
}

impl proto::PutResponse {
    pub fn header(&self) -> Option<&proto::ResponseHeader> {
        self.header.as_ref()
    }
    pub fn prev_key(&self) -> Option<&KeyValue> {
        self.prev_kv.as_ref()
    }
}

impl proto::DeleteRangeResponse {
    pub fn header(&self) -> Option<&proto::ResponseHeader> {
        self.header.as_ref()
    }
    pub fn prev_kvs(&self) -> &[KeyValue] {
        &self.prev_kvs
    }
}

impl proto::TxnResponse {
    pub fn header(&self) -> Option<&proto::ResponseHeader> {
        self.header.as_ref()
    }
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }
    /// The answers of the operations that ran, in order.
    pub fn op_responses(&self) -> Vec<TxnOpResponse> {
        self.responses
            .iter()
            .filter_map(|r| match r.response.clone()? {
                Response::ResponseRange(g) => Some(TxnOpResponse::Get(g)),
                Response::ResponsePut(p) => Some(TxnOpResponse::Put(p)),
                Response::ResponseDeleteRange(d) => Some(TxnOpResponse::Delete(d)),
                Response::ResponseTxn(t) => Some(TxnOpResponse::Txn(t)),
            })
            .collect()
    }
}

impl proto::KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    pub fn value(&self) -> &[u8] {
        &self.value
    }
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }
    pub fn version(&self) -> i64 {
        self.version
    }
}

impl proto::Event {
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
    pub fn prev_kv(&self) -> Option<&KeyValue> {
        self.prev_kv.as_ref()
    }
}

impl proto::WatchResponse {
    pub fn header(&self) -> Option<&proto::ResponseHeader> {
        self.header.as_ref()
    }
    pub fn created(&self) -> bool {
        self.created
    }
    pub fn canceled(&self) -> bool {
        self.canceled
    }
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }
    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

/// Waits until the channel can take a call; a channel that cannot reach any member is etcd
/// being unavailable.
async fn ready(grpc: &mut tonic::client::Grpc<Channel>) -> Result<()> {
    grpc.ready()
        .await
        .map_err(|e| Error::GRpcStatus(tonic::Status::unavailable(format!("etcd is unreachable: {e}"))))
}

fn path(p: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(p)
}

/// The `etcdserverpb.KV` service (and the unary calls of the others).
#[derive(Clone)]
pub struct KvClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl KvClient {
    async fn unary<Q, A>(&mut self, method: &'static str, request: Q) -> Result<A>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        ready(&mut self.grpc).await?;
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let response = self
            .grpc
            .unary(tonic::Request::new(request), path(method), codec)
            .await?;
        Ok(response.into_inner())
    }

    /// The key, or the keys of the range the options give.
    pub async fn get(&mut self, key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Result<GetResponse> {
        let request = options.unwrap_or_default().request(key.into());
        self.unary("/etcdserverpb.KV/Range", request).await
    }

    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<PutResponse> {
        let request = options.unwrap_or_default().request(key.into(), value.into());
        self.unary("/etcdserverpb.KV/Put", request).await
    }

    pub async fn delete(&mut self, key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Result<DeleteResponse> {
        let request = options.unwrap_or_default().request(key.into());
        self.unary("/etcdserverpb.KV/DeleteRange", request).await
    }

    pub async fn txn(&mut self, txn: Txn) -> Result<TxnResponse> {
        self.unary("/etcdserverpb.KV/Txn", txn.0).await
    }

    /// Drops the history before `revision`.
    pub async fn compact(&mut self, revision: i64, options: Option<CompactionOptions>) -> Result<CompactionResponse> {
        let request = proto::CompactionRequest {
            revision,
            physical: options.unwrap_or_default().physical,
        };
        self.unary("/etcdserverpb.KV/Compact", request).await
    }
}

/// Options of a watch.
#[derive(Clone, Default)]
pub struct WatchOptions(proto::WatchCreateRequest);

impl WatchOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.0.range_end = end.into();
        self
    }
    /// Events from `revision` on (0: from now).
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.0.start_revision = revision;
        self
    }
    /// Each event carries the value it replaced.
    pub fn with_prev_key(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
}

/// The `etcdserverpb.Watch` service.
#[derive(Clone)]
pub struct WatchClient {
    grpc: tonic::client::Grpc<Channel>,
}

/// The responses of one watch. Dropping it ends the watch (and its gRPC stream).
pub struct WatchStream {
    inbound: tonic::Streaming<WatchResponse>,
    /// The request side, kept open for as long as the watch is read: etcd ends a watch whose
    /// client closed its side.
    _requests: tokio::sync::mpsc::Sender<proto::WatchRequest>,
}

impl WatchStream {
    /// The next response; `None` once etcd ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        Ok(self.inbound.message().await?)
    }
}

impl WatchClient {
    /// Watches `key` (or the range the options give) on a stream of its own.
    pub async fn watch(&mut self, key: impl Into<Vec<u8>>, options: Option<WatchOptions>) -> Result<WatchStream> {
        let create = proto::WatchCreateRequest {
            key: key.into(),
            ..options.unwrap_or_default().0
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(proto::WatchRequest {
            request_union: Some(proto::watch_request::RequestUnion::CreateRequest(create)),
        })
        .await
        .map_err(|_| Error::Watch("the request stream closed".into()))?;
        ready(&mut self.grpc).await?;
        let codec = tonic_prost::ProstCodec::<proto::WatchRequest, WatchResponse>::default();
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let response = self
            .grpc
            .streaming(tonic::Request::new(requests), path("/etcdserverpb.Watch/Watch"), codec)
            .await?;
        Ok(WatchStream {
            inbound: response.into_inner(),
            _requests: tx,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes as etcd's own client encodes them (field numbers and wire types of `rpc.proto`).
    #[test]
    fn a_guarded_put_encodes_as_etcds_txn() {
        let txn = Txn::new()
            .when([Compare::mod_revision("k", CompareOp::Equal, 5)])
            .and_then([TxnOp::put("k", "v", None)]);
        let bytes = txn.0.encode_to_vec();
        assert_eq!(
            bytes,
            [
                0x0a, 0x07, // compare (1), 7 bytes
                0x10, 0x02, // target (2) = MOD
                0x1a, 0x01, b'k', // key (3)
                0x30, 0x05, // mod_revision (6) = 5
                0x12, 0x08, // success (2), 8 bytes
                0x12, 0x06, // request_put (2), 6 bytes
                0x0a, 0x01, b'k', // key (1)
                0x12, 0x01, b'v', // value (2)
            ]
        );
    }

    #[test]
    fn a_ranged_read_encodes_its_options() {
        let r = GetOptions::new()
            .with_range("b")
            .with_limit(2)
            .with_revision(7)
            .with_count_only()
            .request(b"a".to_vec());
        assert_eq!(
            r.encode_to_vec(),
            [0x0a, 0x01, b'a', 0x12, 0x01, b'b', 0x18, 0x02, 0x20, 0x07, 0x48, 0x01]
        );
    }
}
