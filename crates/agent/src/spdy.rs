//! SPDY/3.1 as Kubernetes speaks it (the framing of moby/spdystream, which kubectl and the kubelet use):
//! the frame codec and the server side of a session.
//!
//! A session is a byte stream in each direction. Every frame starts with eight bytes: a control frame with
//! `1 | version (15 bits) | type (16 bits)` and `flags (8 bits) | length (24 bits)`, a data frame with
//! `0 | stream id (31 bits)` and `flags (8 bits) | length (24 bits)`. The name/value header blocks of
//! SYN_STREAM, SYN_REPLY and HEADERS are zlib-compressed with one compression context per direction for
//! the whole session (the SPDY/3 dictionary preset), each block ending with a sync flush.
//!
//! As spdystream, the session does no flow control: WINDOW_UPDATE and SETTINGS are read and ignored, and
//! nothing is ever held back for a window. Malformed input ends the session with GOAWAY (PROTOCOL_ERROR);
//! nothing a peer sends makes it panic.

use std::collections::HashMap;

use bytes::{Buf, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use futures::{Sink, SinkExt, Stream as FuturesStream, StreamExt};
use tokio::sync::{mpsc, watch};

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;

pub const TYPE_SYN_STREAM: u16 = 1;
pub const TYPE_SYN_REPLY: u16 = 2;
pub const TYPE_RST_STREAM: u16 = 3;
pub const TYPE_SETTINGS: u16 = 4;
pub const TYPE_PING: u16 = 6;
pub const TYPE_GOAWAY: u16 = 7;
pub const TYPE_HEADERS: u16 = 8;
pub const TYPE_WINDOW_UPDATE: u16 = 9;

/// FLAG_FIN on SYN_STREAM, SYN_REPLY, HEADERS and data frames: the sender sends nothing more on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL on SYN_STREAM: the receiver must not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// RST_STREAM status codes the session sends: a client stream id out of order, a stream refused.
pub const PROTOCOL_ERROR: u32 = 1;
pub const CANCEL: u32 = 5;

/// GOAWAY status codes.
pub const GOAWAY_OK: u32 = 0;
pub const GOAWAY_PROTOCOL_ERROR: u32 = 1;

/// The largest payload of one frame (the length field has 24 bits).
pub const MAX_FRAME_LENGTH: usize = 0xff_ffff;
/// The largest decompressed header block accepted from a peer.
pub const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// Data written on a stream is cut into frames of at most this many bytes.
const DATA_CHUNK: usize = 32 * 1024;
/// Frames queued per stream (incoming data) and per session (outgoing frames) before senders wait.
const QUEUE: usize = 16;

/// The SPDY/3 header compression dictionary: length-prefixed header names and values, then a run of
/// common status codes, dates and content types (spdy-protocol-draft3 section 2.6.10.1).
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const WORDS: [&str; 65] = [
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: [&str; 6] = [
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request\
             401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented\
             503 Service Unavailable",
            "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,\
             text/javascript,",
            "publicprivatemax-age=gzip,deflate,sdch",
            "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        ];
        let mut dict = Vec::with_capacity(1423);
        for word in WORDS {
            dict.extend_from_slice(&(word.len() as u32).to_be_bytes());
            dict.extend_from_slice(word.as_bytes());
        }
        for part in TAIL {
            dict.extend_from_slice(part.as_bytes());
        }
        dict
    })
}

/// Why a session's input could not be read (upstream's spdy framer messages where it has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdyError {
    #[error("unsupported SPDY version {0}")]
    UnsupportedVersion(u16),
    #[error("invalid control frame: {0}")]
    InvalidControlFrame(&'static str),
    #[error("invalid data frame: {0}")]
    InvalidDataFrame(&'static str),
    #[error("stream id zero is disallowed")]
    ZeroStreamId,
    #[error("header was not lowercased")]
    UnlowercasedHeaderName,
    #[error("multiple headers with same name")]
    DuplicateHeaders,
    #[error("invalid header block: {0}")]
    InvalidHeaderBlock(&'static str),
    #[error("header compression: {0}")]
    Compression(String),
}

/// A name/value header block. Names are lower case; a name carries one or more values (NUL-separated
/// on the wire).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, Vec<String>)>);

impl Headers {
    pub fn new() -> Headers {
        Headers::default()
    }

    /// Adds a value to `name` (lower-cased).
    pub fn add(&mut self, name: &str, value: &str) {
        let name = name.to_ascii_lowercase();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value.to_string()),
            None => self.0.push((name, vec![value.to_string()])),
        }
    }

    /// The first value of `name`, compared without regard to case (as Go's `http.Header.Get`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.first())
            .map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for Headers {
    fn from_iter<T: IntoIterator<Item = (&'a str, &'a str)>>(iter: T) -> Self {
        let mut h = Headers::new();
        for (n, v) in iter {
            h.add(n, v);
        }
        h
    }
}

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    pub id: u32,
    pub value: u32,
}

/// A frame in its unpacked form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        slot: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
}

/// Reads frames from the bytes of one direction of a session, in pieces of any size.
pub struct Decoder {
    buf: BytesMut,
    inflate: Decompress,
    dictionary_set: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            buf: BytesMut::new(),
            inflate: Decompress::new(true),
            dictionary_set: false,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until one has been received whole. After an error the
    /// session's header compression state is lost: the session must end.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        loop {
            if self.buf.len() < 8 {
                return Ok(None);
            }
            let first = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
            let second = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
            let flags = (second >> 24) as u8;
            let length = (second & 0xff_ffff) as usize;
            if self.buf.len() < 8 + length {
                return Ok(None);
            }
            let mut frame = self.buf.split_to(8 + length).freeze();
            frame.advance(8);
            if first & 0x8000_0000 == 0 {
                let stream_id = first & 0x7fff_ffff;
                if stream_id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                return Ok(Some(Frame::Data {
                    stream_id,
                    flags,
                    data: frame,
                }));
            }
            let version = ((first >> 16) & 0x7fff) as u16;
            if version != VERSION {
                return Err(SpdyError::UnsupportedVersion(version));
            }
            let kind = (first & 0xffff) as u16;
            if let Some(frame) = self.control(kind, flags, &frame)? {
                return Ok(Some(frame));
            }
            // An unknown control frame type is ignored (SPDY/3 section 2.2.1).
        }
    }

    fn control(&mut self, kind: u16, flags: u8, p: &[u8]) -> Result<Option<Frame>, SpdyError> {
        let word = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        let frame = match kind {
            TYPE_SYN_STREAM => {
                if p.len() < 10 {
                    return Err(SpdyError::InvalidControlFrame("SYN_STREAM is too short"));
                }
                let stream_id = word(0) & 0x7fff_ffff;
                let associated_to = word(4) & 0x7fff_ffff;
                let headers = self.header_block(&p[10..])?;
                if stream_id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority: p[8] >> 5,
                    slot: p[9],
                    flags,
                    headers,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                if p.len() < 4 {
                    return Err(SpdyError::InvalidControlFrame("SYN_REPLY or HEADERS is too short"));
                }
                let stream_id = word(0) & 0x7fff_ffff;
                let headers = self.header_block(&p[4..])?;
                if stream_id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        flags,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        flags,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                if p.len() != 8 {
                    return Err(SpdyError::InvalidControlFrame("RST_STREAM length is not 8"));
                }
                let stream_id = word(0) & 0x7fff_ffff;
                let status = word(4);
                if status == 0 {
                    return Err(SpdyError::InvalidControlFrame("RST_STREAM status 0"));
                }
                if stream_id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                Frame::RstStream { stream_id, status }
            }
            TYPE_SETTINGS => {
                if p.len() < 4 {
                    return Err(SpdyError::InvalidControlFrame("SETTINGS is too short"));
                }
                let count = word(0) as usize;
                if count.checked_mul(8).and_then(|n| n.checked_add(4)) != Some(p.len()) {
                    return Err(SpdyError::InvalidControlFrame(
                        "SETTINGS length does not match its entries",
                    ));
                }
                let entries = (0..count)
                    .map(|i| {
                        let id = word(4 + 8 * i);
                        Setting {
                            flags: (id >> 24) as u8,
                            id: id & 0xff_ffff,
                            value: word(8 + 8 * i),
                        }
                    })
                    .collect();
                Frame::Settings { flags, entries }
            }
            TYPE_PING => {
                if p.len() != 4 {
                    return Err(SpdyError::InvalidControlFrame("PING length is not 4"));
                }
                if flags != 0 {
                    return Err(SpdyError::InvalidControlFrame("PING with flags"));
                }
                let id = word(0);
                if id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                Frame::Ping { id }
            }
            TYPE_GOAWAY => {
                if p.len() != 8 || flags != 0 {
                    return Err(SpdyError::InvalidControlFrame("GOAWAY length is not 8 or has flags"));
                }
                Frame::GoAway {
                    last_good_stream_id: word(0) & 0x7fff_ffff,
                    status: word(4),
                }
            }
            TYPE_WINDOW_UPDATE => {
                if p.len() != 8 || flags != 0 {
                    return Err(SpdyError::InvalidControlFrame(
                        "WINDOW_UPDATE length is not 8 or has flags",
                    ));
                }
                Frame::WindowUpdate {
                    stream_id: word(0) & 0x7fff_ffff,
                    delta: word(4) & 0x7fff_ffff,
                }
            }
            _ => return Ok(None),
        };
        Ok(Some(frame))
    }

    /// Decompresses one header block with the session's decompression context and parses it.
    fn header_block(&mut self, compressed: &[u8]) -> Result<Headers, SpdyError> {
        let mut out = Vec::with_capacity((compressed.len() * 4).clamp(64, MAX_HEADER_BLOCK));
        let mut consumed = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.len().max(64));
            }
            let (in_before, out_before) = (self.inflate.total_in(), out.len());
            let result = self
                .inflate
                .decompress_vec(&compressed[consumed..], &mut out, FlushDecompress::Sync);
            consumed += (self.inflate.total_in() - in_before) as usize;
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::InvalidHeaderBlock("header block is too large"));
            }
            match result {
                Ok(Status::StreamEnd) => {
                    return Err(SpdyError::Compression("the header compression stream ended".into()));
                }
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() && !self.dictionary_set => {
                    self.dictionary_set = true;
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| SpdyError::Compression(format!("setting the dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
            let progressed = self.inflate.total_in() > in_before || out.len() > out_before;
            if out.len() < out.capacity() && (consumed == compressed.len() || !progressed) {
                break;
            }
        }
        if consumed != compressed.len() {
            return Err(SpdyError::Compression("compressed payload size was incorrect".into()));
        }
        parse_header_block(&out)
    }
}

fn parse_header_block(block: &[u8]) -> Result<Headers, SpdyError> {
    struct Cursor<'a>(&'a [u8]);
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], SpdyError> {
            if self.0.len() < n {
                return Err(SpdyError::InvalidHeaderBlock("header block is truncated"));
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Ok(head)
        }
        fn len_prefixed(&mut self) -> Result<&'a [u8], SpdyError> {
            let len = self.take(4)?;
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            self.take(len as usize)
        }
    }
    let mut r = Cursor(block);
    let count = r.take(4)?;
    let count = u32::from_be_bytes([count[0], count[1], count[2], count[3]]);
    let mut headers = Headers::new();
    // Every header takes at least eight bytes, so the count cannot make this loop longer than the block.
    for _ in 0..count {
        let name = r.len_prefixed()?;
        if name.is_empty() {
            return Err(SpdyError::InvalidHeaderBlock("empty header name"));
        }
        if name.iter().any(u8::is_ascii_uppercase) {
            return Err(SpdyError::UnlowercasedHeaderName);
        }
        let name = String::from_utf8_lossy(name).into_owned();
        if headers.0.iter().any(|(n, _)| *n == name) {
            return Err(SpdyError::DuplicateHeaders);
        }
        let values = r
            .len_prefixed()?
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        headers.0.push((name, values));
    }
    if !r.0.is_empty() {
        return Err(SpdyError::InvalidHeaderBlock("bytes after the last header"));
    }
    Ok(headers)
}

/// Writes frames for one direction of a session.
pub struct Encoder {
    deflate: Compress,
}

impl Encoder {
    pub fn new() -> Result<Encoder, SpdyError> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(dictionary())
            .map_err(|e| SpdyError::Compression(format!("setting the dictionary: {e}")))?;
        Ok(Encoder { deflate })
    }

    /// The bytes of one frame.
    pub fn encode(&mut self, frame: &Frame) -> Result<Vec<u8>, SpdyError> {
        let id = |id: u32| -> Result<u32, SpdyError> {
            match id {
                0 => Err(SpdyError::ZeroStreamId),
                id if id > 0x7fff_ffff => Err(SpdyError::InvalidControlFrame("stream id has 31 bits")),
                id => Ok(id),
            }
        };
        let (kind, flags, payload) = match frame {
            Frame::Data { stream_id, flags, data } => {
                if data.len() > MAX_FRAME_LENGTH {
                    return Err(SpdyError::InvalidDataFrame("data is longer than a frame"));
                }
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&id(*stream_id)?.to_be_bytes());
                out.extend_from_slice(&(u32::from(*flags) << 24 | data.len() as u32).to_be_bytes());
                out.extend_from_slice(data);
                return Ok(out);
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                slot,
                flags,
                headers,
            } => {
                let mut p = Vec::new();
                p.extend_from_slice(&id(*stream_id)?.to_be_bytes());
                p.extend_from_slice(&(associated_to & 0x7fff_ffff).to_be_bytes());
                p.push((priority & 0x07) << 5);
                p.push(*slot);
                p.extend_from_slice(&self.compress(headers)?);
                (TYPE_SYN_STREAM, *flags, p)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let kind = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                let mut p = id(*stream_id)?.to_be_bytes().to_vec();
                p.extend_from_slice(&self.compress(headers)?);
                (kind, *flags, p)
            }
            Frame::RstStream { stream_id, status } => {
                if *status == 0 {
                    return Err(SpdyError::InvalidControlFrame("RST_STREAM status 0"));
                }
                let mut p = id(*stream_id)?.to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                (TYPE_RST_STREAM, 0, p)
            }
            Frame::Settings { flags, entries } => {
                let mut p = (entries.len() as u32).to_be_bytes().to_vec();
                for e in entries {
                    p.extend_from_slice(&(u32::from(e.flags) << 24 | (e.id & 0xff_ffff)).to_be_bytes());
                    p.extend_from_slice(&e.value.to_be_bytes());
                }
                (TYPE_SETTINGS, *flags, p)
            }
            Frame::Ping { id: ping } => {
                if *ping == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                (TYPE_PING, 0, ping.to_be_bytes().to_vec())
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut p = (last_good_stream_id & 0x7fff_ffff).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                (TYPE_GOAWAY, 0, p)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let mut p = (stream_id & 0x7fff_ffff).to_be_bytes().to_vec();
                p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                (TYPE_WINDOW_UPDATE, 0, p)
            }
        };
        if payload.len() > MAX_FRAME_LENGTH {
            return Err(SpdyError::InvalidControlFrame("control frame is longer than a frame"));
        }
        let mut out = Vec::with_capacity(8 + payload.len());
        out.extend_from_slice(&(0x8000_0000 | u32::from(VERSION) << 16 | u32::from(kind)).to_be_bytes());
        out.extend_from_slice(&(u32::from(flags) << 24 | payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        Ok(out)
    }

    /// A header block through the session's compression context, ending with a sync flush so the peer
    /// can read it whole.
    fn compress(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let mut block = (headers.0.len() as u32).to_be_bytes().to_vec();
        for (name, values) in &headers.0 {
            let value = values.join("\0");
            for part in [name.as_str(), value.as_str()] {
                let len = u32::try_from(part.len())
                    .map_err(|_| SpdyError::InvalidHeaderBlock("header is longer than 4 GiB"))?;
                block.extend_from_slice(&len.to_be_bytes());
                block.extend_from_slice(part.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(block.len().max(256));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&block[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            consumed += (self.deflate.total_in() - before) as usize;
            // Done when all input is in and the flush fitted (output space was left over).
            if consumed == block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// Why a write on a stream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("write on closed stream")]
    Finished,
    #[error("stream reset")]
    Reset,
    #[error("the session is closed")]
    SessionClosed,
}

/// A stream the peer opened and the session accepted (its SYN_REPLY is already queued).
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

/// What the peer sends on a stream.
pub struct StreamReader {
    data: mpsc::Receiver<Bytes>,
}

impl StreamReader {
    /// The next data, `None` once the peer finished (FIN) or reset the stream, or the session ended.
    pub async fn read(&mut self) -> Option<Bytes> {
        self.data.recv().await
    }
}

/// Sends on a stream.
pub struct StreamWriter {
    id: u32,
    frames: mpsc::Sender<Frame>,
    reset: watch::Receiver<bool>,
    finished: bool,
}

impl StreamWriter {
    /// Whether the peer reset the stream or the session ended.
    pub fn is_reset(&self) -> bool {
        *self.reset.borrow() || self.frames.is_closed()
    }

    /// Waits until the peer resets the stream or the session ends.
    pub async fn reset_by_peer(&mut self) {
        while !*self.reset.borrow_and_update() {
            if self.reset.changed().await.is_err() {
                return;
            }
        }
    }

    /// Sends data (in frames of at most 32 KiB).
    pub async fn write(&mut self, data: &[u8]) -> Result<(), StreamError> {
        if self.finished {
            return Err(StreamError::Finished);
        }
        for chunk in data.chunks(DATA_CHUNK) {
            if self.is_reset() {
                return Err(StreamError::Reset);
            }
            self.send(Frame::Data {
                stream_id: self.id,
                flags: 0,
                data: Bytes::copy_from_slice(chunk),
            })
            .await?;
        }
        Ok(())
    }

    /// Half-closes the stream: an empty data frame with FIN. Closing twice does nothing.
    pub async fn close(&mut self) -> Result<(), StreamError> {
        if self.finished || self.is_reset() {
            self.finished = true;
            return Ok(());
        }
        self.finished = true;
        self.send(Frame::Data {
            stream_id: self.id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        })
        .await
    }

    async fn send(&self, frame: Frame) -> Result<(), StreamError> {
        self.frames.send(frame).await.map_err(|_| StreamError::SessionClosed)
    }
}

/// Why a session ended other than by its peer closing it.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("reading the session: {0}")]
    Protocol(#[from] SpdyError),
    #[error("writing the session: {0}")]
    Write(String),
}

/// The session's record of a stream.
struct Entry {
    /// Where the peer's data goes; `None` once the peer finished.
    data: Option<mpsc::Sender<Bytes>>,
    reset: watch::Sender<bool>,
}

impl Entry {
    /// Nothing reads or writes the stream any more.
    fn abandoned(&self) -> bool {
        self.reset.is_closed() && self.data.as_ref().is_none_or(mpsc::Sender::is_closed)
    }
}

/// Serves a session in which the peer is the client: reads frames from `incoming`, writes frames to
/// `outgoing` (one item per frame). Each SYN_STREAM is given to `check`: accepted streams are answered
/// with SYN_REPLY and sent to `accepted`; a rejected one is reset (CANCEL), as upstream's server does.
/// Pings are answered. Returns when `incoming` ends, when writing fails, or on malformed input (after
/// a GOAWAY with PROTOCOL_ERROR).
pub async fn serve<I, O, E>(
    incoming: I,
    outgoing: O,
    check: impl FnMut(&Headers) -> Result<(), String>,
    accepted: mpsc::Sender<Stream>,
) -> Result<(), SessionError>
where
    I: FuturesStream<Item = Bytes> + Unpin,
    O: Sink<Bytes, Error = E> + Unpin,
    E: std::fmt::Display,
{
    let (frames_tx, frames_rx) = mpsc::channel::<Frame>(QUEUE);
    let (stop_tx, stop_rx) = watch::channel(false);
    let reader = read_loop(incoming, frames_tx, check, accepted);
    let writer = write_loop(frames_rx, outgoing, stop_rx);
    tokio::pin!(reader);
    tokio::pin!(writer);
    tokio::select! {
        read = &mut reader => {
            let _ = stop_tx.send(true);
            let written = writer.await;
            read.and(written)
        }
        // Writing failed (the transport is gone): the streams end with the reader dropped here.
        written = &mut writer => written,
    }
}

async fn write_loop<O, E>(
    mut frames: mpsc::Receiver<Frame>,
    mut outgoing: O,
    mut stop: watch::Receiver<bool>,
) -> Result<(), SessionError>
where
    O: Sink<Bytes, Error = E> + Unpin,
    E: std::fmt::Display,
{
    let mut encoder = Encoder::new().map_err(|e| SessionError::Write(e.to_string()))?;
    let mut stopping = false;
    loop {
        let frame = if stopping {
            // Send what was queued before the session ended (a GOAWAY, final replies), then stop.
            match frames.try_recv() {
                Ok(f) => f,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                biased;
                f = frames.recv() => match f {
                    Some(f) => f,
                    None => break,
                },
                _ = stop.changed() => {
                    stopping = true;
                    continue;
                }
            }
        };
        let bytes = match encoder.encode(&frame) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, ?frame, "dropping a frame that cannot be encoded");
                continue;
            }
        };
        outgoing
            .send(Bytes::from(bytes))
            .await
            .map_err(|e| SessionError::Write(e.to_string()))?;
    }
    Ok(())
}

async fn read_loop<I>(
    mut incoming: I,
    frames: mpsc::Sender<Frame>,
    mut check: impl FnMut(&Headers) -> Result<(), String>,
    accepted: mpsc::Sender<Stream>,
) -> Result<(), SessionError>
where
    I: FuturesStream<Item = Bytes> + Unpin,
{
    let mut decoder = Decoder::new();
    let mut streams: HashMap<u32, Entry> = HashMap::new();
    let mut last_stream_id = 0u32;
    let mut gone_away = false;
    // Sending fails only once the writer is gone; then the session is over.
    macro_rules! send {
        ($frame:expr) => {
            if frames.send($frame).await.is_err() {
                return Ok(());
            }
        };
    }
    while let Some(chunk) = incoming.next().await {
        decoder.push(&chunk);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "malformed SPDY input; going away");
                    let _ = frames
                        .send(Frame::GoAway {
                            last_good_stream_id: last_stream_id,
                            status: GOAWAY_PROTOCOL_ERROR,
                        })
                        .await;
                    return Err(e.into());
                }
            };
            match frame {
                Frame::SynStream {
                    stream_id,
                    flags,
                    headers,
                    ..
                } => {
                    if gone_away {
                        continue;
                    }
                    // The client's streams have odd ids, each larger than the last.
                    if stream_id % 2 == 0 || stream_id <= last_stream_id {
                        send!(Frame::RstStream {
                            stream_id,
                            status: PROTOCOL_ERROR,
                        });
                        continue;
                    }
                    last_stream_id = stream_id;
                    streams.retain(|_, e| !e.abandoned());
                    if let Err(reason) = check(&headers) {
                        tracing::warn!(stream_id, %reason, "stream rejected");
                        send!(Frame::RstStream {
                            stream_id,
                            status: CANCEL,
                        });
                        continue;
                    }
                    send!(Frame::SynReply {
                        stream_id,
                        flags: 0,
                        headers: Headers::new(),
                    });
                    let (data_tx, data_rx) = mpsc::channel(QUEUE);
                    let (reset_tx, reset_rx) = watch::channel(false);
                    streams.insert(
                        stream_id,
                        Entry {
                            data: (flags & FLAG_FIN == 0).then_some(data_tx),
                            reset: reset_tx,
                        },
                    );
                    let stream = Stream {
                        id: stream_id,
                        headers,
                        reader: StreamReader { data: data_rx },
                        writer: StreamWriter {
                            id: stream_id,
                            frames: frames.clone(),
                            reset: reset_rx,
                            finished: flags & FLAG_UNIDIRECTIONAL != 0,
                        },
                    };
                    if accepted.send(stream).await.is_err() {
                        tracing::debug!(stream_id, "no one takes new streams");
                    }
                }
                Frame::Data { stream_id, flags, data } => {
                    // Data for a stream that is gone is dropped, as spdystream does.
                    let Some(entry) = streams.get_mut(&stream_id) else {
                        continue;
                    };
                    if !data.is_empty()
                        && let Some(tx) = &entry.data
                        && tx.send(data).await.is_err()
                    {
                        entry.data = None;
                    }
                    if flags & FLAG_FIN != 0 {
                        entry.data = None;
                    }
                }
                Frame::Headers { stream_id, flags, .. } => {
                    if flags & FLAG_FIN != 0
                        && let Some(entry) = streams.get_mut(&stream_id)
                    {
                        entry.data = None;
                    }
                }
                Frame::RstStream { stream_id, status } => {
                    tracing::debug!(stream_id, status, "stream reset by the peer");
                    if let Some(entry) = streams.remove(&stream_id) {
                        let _ = entry.reset.send(true);
                    }
                }
                // The client's pings have odd ids; answer them with the same frame.
                Frame::Ping { id } => {
                    if id % 2 == 1 {
                        send!(Frame::Ping { id });
                    }
                }
                Frame::GoAway { .. } => gone_away = true,
                Frame::SynReply { .. } | Frame::Settings { .. } | Frame::WindowUpdate { .. } => {}
            }
        }
    }
    for (_, entry) in streams.drain() {
        let _ = entry.reset.send(true);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(decoder: &mut Decoder, bytes: &[u8]) -> Result<Vec<Frame>, SpdyError> {
        decoder.push(bytes);
        let mut frames = Vec::new();
        while let Some(f) = decoder.next_frame()? {
            frames.push(f);
        }
        Ok(frames)
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().copied().collect()
    }

    #[test]
    fn dictionary_is_the_spdy3_one() {
        let dict = dictionary();
        assert_eq!(dict.len(), 1423);
        assert_eq!(&dict[..11], b"\0\0\0\x07options");
        assert!(dict.ends_with(b"charset=iso-8859-1,utf-,*,enq=0."));
        // Adler-32, the dictionary id zlib streams carry.
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in dict {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(b << 16 | a, 0xe3c6_a7c2);
    }

    #[test]
    fn every_frame_round_trips() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 3,
                slot: 0,
                flags: FLAG_FIN,
                headers: headers(&[("streamType", "error"), ("port", "8080"), ("requestID", "0")]),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: Headers::new(),
            },
            Frame::RstStream {
                stream_id: 3,
                status: CANCEL,
            },
            Frame::Settings {
                flags: 1,
                entries: vec![Setting {
                    flags: 1,
                    id: 7,
                    value: 65536,
                }],
            },
            Frame::Ping { id: 1 },
            Frame::GoAway {
                last_good_stream_id: 5,
                status: GOAWAY_OK,
            },
            Frame::Headers {
                stream_id: 3,
                flags: FLAG_FIN,
                headers: headers(&[("x", "a"), ("x", "b")]),
            },
            Frame::WindowUpdate {
                stream_id: 3,
                delta: 1024,
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"GET / HTTP/1.0\r\n\r\n"),
            },
            Frame::Data {
                stream_id: 5,
                flags: 0,
                data: Bytes::new(),
            },
        ];
        let mut encoder = Encoder::new().expect("encoder");
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encoder.encode(f).expect("encode"));
        }
        let got = decode_all(&mut Decoder::new(), &wire).expect("decode");
        assert_eq!(got, frames);
        // Header names are lower case on the wire; lookups ignore case.
        let Frame::SynStream { headers, .. } = &got[0] else {
            panic!("{:?}", got[0])
        };
        assert_eq!(headers.get("streamType"), Some("error"));
        assert_eq!(headers.get("requestid"), Some("0"));
        assert!(headers.iter().all(|(n, _)| n == n.to_ascii_lowercase()));

        // The same bytes one at a time (as Go's framer writes them, a field per write).
        let mut decoder = Decoder::new();
        let mut one_by_one = Vec::new();
        for byte in &wire {
            one_by_one.extend(decode_all(&mut decoder, std::slice::from_ref(byte)).expect("decode"));
        }
        assert_eq!(one_by_one, frames);
    }

    #[test]
    fn header_compression_is_one_stream_per_direction() {
        // Two SYN_STREAMs as Go's zlib writer (best compression, SPDY dictionary, a sync flush per
        // block) writes them: the second block is a few bytes that refer back to the first.
        let first = hex(
            "800300010000003d0000000100000000000078f9e3c6a7c202253a703a2b294a4dcc851625aca9a08086\
             14cb45e01c6061606100a4398b20d198094ade8c0600000000ffff",
        );
        let second = hex("800300010000001800000003000000000000c2aa19540e2512d60b000000ffff");
        let mut decoder = Decoder::new();
        let frames = decode_all(&mut decoder, &[first.clone(), second.clone()].concat()).expect("decode");
        let want = |id: u32, kind: &str| Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            flags: 0,
            headers: headers(&[("streamtype", kind), ("port", "8080"), ("requestid", "0")]),
        };
        assert_eq!(frames, vec![want(1, "error"), want(3, "data")]);
        // The second block alone is not a zlib stream: it only decodes after the first.
        assert!(decode_all(&mut Decoder::new(), &second).is_err());

        // Our encoder keeps one context too: later blocks are shorter than the first.
        let mut encoder = Encoder::new().expect("encoder");
        let syn = |id| Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            flags: 0,
            headers: headers(&[("streamtype", "data"), ("port", "8080"), ("requestid", "7")]),
        };
        let a = encoder.encode(&syn(1)).expect("encode");
        let b = encoder.encode(&syn(3)).expect("encode");
        assert!(b.len() < a.len(), "{} >= {}", b.len(), a.len());
        let mut decoder = Decoder::new();
        assert_eq!(decode_all(&mut decoder, &a).expect("first"), vec![syn(1)]);
        assert_eq!(decode_all(&mut decoder, &b).expect("second"), vec![syn(3)]);
        assert!(decode_all(&mut Decoder::new(), &b).is_err());
    }

    #[test]
    fn a_writer_without_the_dictionary_is_read_too() {
        let mut deflate = Compress::new(Compression::best(), true);
        let mut block = Vec::new();
        block.extend_from_slice(&1u32.to_be_bytes());
        for part in ["port", "80"] {
            block.extend_from_slice(&(part.len() as u32).to_be_bytes());
            block.extend_from_slice(part.as_bytes());
        }
        let mut compressed = Vec::with_capacity(256);
        deflate
            .compress_vec(&block, &mut compressed, FlushCompress::Sync)
            .expect("compress");
        let mut frame = vec![0x80, 0x03, 0x00, 0x02];
        frame.extend_from_slice(&((4 + compressed.len()) as u32).to_be_bytes());
        frame.extend_from_slice(&9u32.to_be_bytes());
        frame.extend_from_slice(&compressed);
        let got = decode_all(&mut Decoder::new(), &frame).expect("decode");
        assert_eq!(
            got,
            vec![Frame::SynReply {
                stream_id: 9,
                flags: 0,
                headers: headers(&[("port", "80")]),
            }]
        );
    }

    /// A control frame with a raw (uncompressed-field) payload.
    fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x80, 0x03];
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(&(u32::from(flags) << 24 | payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A SYN_STREAM whose header block is `block`, compressed with a fresh context.
    fn syn_with_block(block: &[u8]) -> Vec<u8> {
        let mut deflate = Compress::new(Compression::default(), true);
        let mut compressed = Vec::with_capacity(block.len() + 256);
        deflate
            .compress_vec(block, &mut compressed, FlushCompress::Sync)
            .expect("compress");
        let mut p = 1u32.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&compressed);
        control(TYPE_SYN_STREAM, 0, &p)
    }

    fn block(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut b = (pairs.len() as u32).to_be_bytes().to_vec();
        for (n, v) in pairs {
            b.extend_from_slice(&(n.len() as u32).to_be_bytes());
            b.extend_from_slice(n);
            b.extend_from_slice(&(v.len() as u32).to_be_bytes());
            b.extend_from_slice(v);
        }
        b
    }

    #[test]
    fn malformed_input_is_an_error() {
        let cases: Vec<(&str, Vec<u8>, SpdyError)> = vec![
            (
                "data on stream 0",
                vec![0, 0, 0, 0, 0, 0, 0, 1, b'x'],
                SpdyError::ZeroStreamId,
            ),
            (
                "version 2",
                [vec![0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4], 1u32.to_be_bytes().to_vec()].concat(),
                SpdyError::UnsupportedVersion(2),
            ),
            (
                "ping with flags",
                control(TYPE_PING, 1, &1u32.to_be_bytes()),
                SpdyError::InvalidControlFrame("PING with flags"),
            ),
            (
                "ping 0",
                control(TYPE_PING, 0, &0u32.to_be_bytes()),
                SpdyError::ZeroStreamId,
            ),
            (
                "short ping",
                control(TYPE_PING, 0, &[0, 1]),
                SpdyError::InvalidControlFrame("PING length is not 4"),
            ),
            (
                "rst status 0",
                control(TYPE_RST_STREAM, 0, &[0, 0, 0, 1, 0, 0, 0, 0]),
                SpdyError::InvalidControlFrame("RST_STREAM status 0"),
            ),
            (
                "rst stream 0",
                control(TYPE_RST_STREAM, 0, &[0, 0, 0, 0, 0, 0, 0, 5]),
                SpdyError::ZeroStreamId,
            ),
            (
                "goaway of 4 bytes",
                control(TYPE_GOAWAY, 0, &[0, 0, 0, 1]),
                SpdyError::InvalidControlFrame("GOAWAY length is not 8 or has flags"),
            ),
            (
                "settings count past the frame",
                control(TYPE_SETTINGS, 0, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1]),
                SpdyError::InvalidControlFrame("SETTINGS length does not match its entries"),
            ),
            (
                "short syn_stream",
                control(TYPE_SYN_STREAM, 0, &[0, 0, 0, 1]),
                SpdyError::InvalidControlFrame("SYN_STREAM is too short"),
            ),
            (
                "upper-case header name",
                syn_with_block(&block(&[(b"Port", b"80")])),
                SpdyError::UnlowercasedHeaderName,
            ),
            (
                "duplicate header",
                syn_with_block(&block(&[(b"port", b"80"), (b"port", b"81")])),
                SpdyError::DuplicateHeaders,
            ),
            (
                "header count past the block",
                syn_with_block(&[0, 0, 0, 9, 0, 0, 0, 1, b'a', 0, 0, 0, 0]),
                SpdyError::InvalidHeaderBlock("header block is truncated"),
            ),
            (
                "name length past the block",
                syn_with_block(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, b'a']),
                SpdyError::InvalidHeaderBlock("header block is truncated"),
            ),
            (
                "bytes after the headers",
                syn_with_block(&[block(&[(b"port", b"80")]), vec![1, 2, 3]].concat()),
                SpdyError::InvalidHeaderBlock("bytes after the last header"),
            ),
            (
                "empty header name",
                syn_with_block(&block(&[(b"", b"80")])),
                SpdyError::InvalidHeaderBlock("empty header name"),
            ),
        ];
        for (name, bytes, want) in cases {
            assert_eq!(decode_all(&mut Decoder::new(), &bytes), Err(want), "{name}");
        }
        // A header block that is not zlib at all.
        let mut p = 1u32.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        assert!(matches!(
            decode_all(&mut Decoder::new(), &control(TYPE_SYN_STREAM, 0, &p)),
            Err(SpdyError::Compression(_))
        ));
        // A zlib stream that asks for another dictionary.
        let mut deflate = Compress::new(Compression::default(), true);
        deflate.set_dictionary(b"some other dictionary").expect("dictionary");
        let mut compressed = Vec::with_capacity(256);
        deflate
            .compress_vec(&block(&[(b"port", b"80")]), &mut compressed, FlushCompress::Sync)
            .expect("compress");
        let mut p = 1u32.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&compressed);
        assert!(matches!(
            decode_all(&mut Decoder::new(), &control(TYPE_SYN_STREAM, 0, &p)),
            Err(SpdyError::Compression(_))
        ));
        // A header block that inflates past the limit (a run of one byte compresses to almost nothing).
        let huge = block(&[(b"x", &vec![b'a'; MAX_HEADER_BLOCK + 1])]);
        assert_eq!(
            decode_all(&mut Decoder::new(), &syn_with_block(&huge)),
            Err(SpdyError::InvalidHeaderBlock("header block is too large"))
        );
    }

    #[test]
    fn unknown_control_frames_are_skipped_and_partial_frames_wait() {
        let mut wire = control(0x0a, 0, &[1, 2, 3]);
        wire.extend(control(TYPE_PING, 0, &7u32.to_be_bytes()));
        let mut decoder = Decoder::new();
        assert_eq!(decode_all(&mut decoder, &wire[..wire.len() - 1]), Ok(vec![]));
        assert_eq!(
            decode_all(&mut decoder, &wire[wire.len() - 1..]),
            Ok(vec![Frame::Ping { id: 7 }])
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A deterministic pseudo-random walk over frame-like inputs: valid headers with garbage
        // bodies, garbage headers, and valid frames cut short or corrupted.
        let mut encoder = Encoder::new().expect("encoder");
        let valid = encoder
            .encode(&Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                slot: 0,
                flags: 0,
                headers: headers(&[("port", "80"), ("streamtype", "data")]),
            })
            .expect("encode");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..3000 {
            let mut bytes = match round % 3 {
                0 => valid.clone(),
                1 => {
                    let kind = (next() % 12) as u16;
                    let len = (next() % 40) as usize;
                    let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                    control(kind, next() as u8, &body)
                }
                _ => (0..(next() % 64)).map(|_| next() as u8).collect(),
            };
            if !bytes.is_empty() {
                for _ in 0..(next() % 4) {
                    let i = (next() as usize) % bytes.len();
                    bytes[i] = next() as u8;
                }
                let cut = (next() as usize) % (bytes.len() + 1);
                bytes.truncate(cut.max(1));
            }
            let mut decoder = Decoder::new();
            let _ = decode_all(&mut decoder, &bytes);
        }
    }

    #[test]
    fn encoder_refuses_invalid_frames() {
        let mut encoder = Encoder::new().expect("encoder");
        assert_eq!(
            encoder.encode(&Frame::Data {
                stream_id: 0,
                flags: 0,
                data: Bytes::new()
            }),
            Err(SpdyError::ZeroStreamId)
        );
        assert!(
            encoder
                .encode(&Frame::RstStream {
                    stream_id: 1,
                    status: 0
                })
                .is_err()
        );
        assert_eq!(encoder.encode(&Frame::Ping { id: 0 }), Err(SpdyError::ZeroStreamId));
    }

    /// A client's end of an in-memory session.
    struct Client {
        encoder: Encoder,
        decoder: Decoder,
        to_server: futures::channel::mpsc::UnboundedSender<Bytes>,
        from_server: futures::channel::mpsc::UnboundedReceiver<Bytes>,
    }

    impl Client {
        fn send(&mut self, frame: Frame) {
            let bytes = self.encoder.encode(&frame).expect("encode");
            self.to_server.unbounded_send(bytes.into()).expect("send");
        }

        async fn recv(&mut self) -> Option<Frame> {
            loop {
                if let Some(f) = self.decoder.next_frame().expect("server frames decode") {
                    return Some(f);
                }
                let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), self.from_server.next())
                    .await
                    .expect("a frame within 5s")?;
                self.decoder.push(&chunk);
            }
        }
    }

    type Served = tokio::task::JoinHandle<Result<(), SessionError>>;

    fn session(check: fn(&Headers) -> Result<(), String>) -> (Client, mpsc::Receiver<Stream>, Served) {
        let (to_server, incoming) = futures::channel::mpsc::unbounded::<Bytes>();
        let (outgoing, from_server) = futures::channel::mpsc::unbounded::<Bytes>();
        let (accepted_tx, accepted) = mpsc::channel(4);
        let served = tokio::spawn(serve(incoming, outgoing, check, accepted_tx));
        let client = Client {
            encoder: Encoder::new().expect("encoder"),
            decoder: Decoder::new(),
            to_server,
            from_server,
        };
        (client, accepted, served)
    }

    fn syn(stream_id: u32, flags: u8, pairs: &[(&str, &str)]) -> Frame {
        Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            flags,
            headers: headers(pairs),
        }
    }

    #[tokio::test]
    async fn session_replies_carries_data_and_honours_fin_and_reset() {
        let (mut client, mut accepted, served) = session(|h| match h.get("port") {
            Some(_) => Ok(()),
            None => Err("\"port\" header is required".into()),
        });
        client.send(syn(1, 0, &[("port", "80")]));
        assert_eq!(
            client.recv().await,
            Some(Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: Headers::new()
            })
        );
        let mut stream = accepted.recv().await.expect("stream");
        assert_eq!((stream.id, stream.headers.get("port")), (1, Some("80")));

        client.send(Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Bytes::from_static(b"ping?"),
        });
        assert_eq!(stream.reader.read().await.as_deref(), Some(&b"ping?"[..]));
        stream.writer.write(b"pong!").await.expect("write");
        assert_eq!(
            client.recv().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: 0,
                data: Bytes::from_static(b"pong!")
            })
        );
        // FIN from the client ends what the server reads; the server can still write, then close.
        client.send(Frame::Data {
            stream_id: 1,
            flags: FLAG_FIN,
            data: Bytes::new(),
        });
        assert_eq!(stream.reader.read().await, None);
        stream.writer.write(b"last").await.expect("write after the peer's FIN");
        stream.writer.close().await.expect("close");
        assert_eq!(stream.writer.write(b"more").await, Err(StreamError::Finished));
        assert!(matches!(client.recv().await, Some(Frame::Data { data, .. }) if data == "last"));
        assert_eq!(
            client.recv().await,
            Some(Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::new()
            })
        );

        // Pings from the client (odd ids) come back.
        client.send(Frame::Ping { id: 5 });
        assert_eq!(client.recv().await, Some(Frame::Ping { id: 5 }));

        // A stream the check refuses is reset with CANCEL; an even or reused id with PROTOCOL_ERROR.
        client.send(syn(3, 0, &[("streamtype", "data")]));
        assert_eq!(
            client.recv().await,
            Some(Frame::RstStream {
                stream_id: 3,
                status: CANCEL
            })
        );
        client.send(syn(4, 0, &[("port", "80")]));
        assert_eq!(
            client.recv().await,
            Some(Frame::RstStream {
                stream_id: 4,
                status: PROTOCOL_ERROR
            })
        );
        client.send(syn(1, 0, &[("port", "80")]));
        assert_eq!(
            client.recv().await,
            Some(Frame::RstStream {
                stream_id: 1,
                status: PROTOCOL_ERROR
            })
        );

        // RST_STREAM from the client: reading ends and writing fails.
        client.send(syn(7, 0, &[("port", "81")]));
        assert!(matches!(
            client.recv().await,
            Some(Frame::SynReply { stream_id: 7, .. })
        ));
        let mut stream = accepted.recv().await.expect("stream 7");
        client.send(Frame::RstStream {
            stream_id: 7,
            status: CANCEL,
        });
        stream.writer.reset_by_peer().await;
        assert_eq!(stream.reader.read().await, None);
        assert_eq!(stream.writer.write(b"x").await, Err(StreamError::Reset));

        // SETTINGS and WINDOW_UPDATE are read and ignored; the session ends with its input.
        client.send(Frame::Settings {
            flags: 0,
            entries: vec![],
        });
        client.send(Frame::WindowUpdate {
            stream_id: 0,
            delta: 10,
        });
        client.send(Frame::Ping { id: 9 });
        assert_eq!(client.recv().await, Some(Frame::Ping { id: 9 }));
        drop(client.to_server);
        served.await.expect("join").expect("clean end");
    }

    #[tokio::test]
    async fn malformed_input_ends_the_session_with_goaway() {
        let (mut client, mut accepted, served) = session(|_| Ok(()));
        client.send(syn(1, 0, &[("port", "80")]));
        assert!(matches!(
            client.recv().await,
            Some(Frame::SynReply { stream_id: 1, .. })
        ));
        let mut stream = accepted.recv().await.expect("stream");
        client
            .to_server
            .unbounded_send(Bytes::from(control(TYPE_PING, 3, &1u32.to_be_bytes())))
            .expect("send");
        assert_eq!(
            client.recv().await,
            Some(Frame::GoAway {
                last_good_stream_id: 1,
                status: GOAWAY_PROTOCOL_ERROR
            })
        );
        assert!(matches!(
            served.await.expect("join"),
            Err(SessionError::Protocol(SpdyError::InvalidControlFrame(_)))
        ));
        assert_eq!(stream.reader.read().await, None);
        assert!(stream.writer.write(b"x").await.is_err());
        assert_eq!(client.from_server.next().await, None);
    }

    #[tokio::test]
    async fn a_syn_stream_with_fin_has_nothing_to_read() {
        let (mut client, mut accepted, _served) = session(|_| Ok(()));
        client.send(syn(1, FLAG_FIN, &[("port", "80")]));
        assert!(matches!(
            client.recv().await,
            Some(Frame::SynReply { stream_id: 1, .. })
        ));
        let mut stream = accepted.recv().await.expect("stream");
        assert_eq!(stream.reader.read().await, None);
        stream.writer.write(b"still writable").await.expect("write");
        assert!(matches!(client.recv().await, Some(Frame::Data { stream_id: 1, .. })));
    }
}
