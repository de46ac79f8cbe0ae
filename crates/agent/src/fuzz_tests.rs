//! Fuzz targets for what the agent reads from peers: SPDY/3.1 frames (the decoder alone, the
//! encoder/decoder round trip, whole port-forward sessions end to end), the query strings of the
//! exec/attach/log/port-forward endpoints. The
//! invariants: no panic, a session always ends once its input ends, the server only ever writes
//! well-formed frames, and decoding does not depend on how the bytes were split.

use crate::spdy::{Decoder, Encoder, FLAG_FIN, Frame, Headers, Setting};
use bytes::Bytes;
use futures::StreamExt;
use skiff_fuzz::proptest::prelude::*;
use skiff_fuzz::{mutated_bytes, mutated_text, run};

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().copied().collect()
}

/// A port-forward session as kubectl's dialer opens it: an error and a data stream per
/// forwarded connection, data, a half-close, a ping, then a second pair with a bad port.
fn port_forward_session() -> Vec<Frame> {
    let syn = |id: u32, flags: u8, pairs: &[(&str, &str)]| Frame::SynStream {
        stream_id: id,
        associated_to: 0,
        priority: 0,
        slot: 0,
        flags,
        headers: headers(pairs),
    };
    vec![
        Frame::Settings {
            flags: 0,
            entries: vec![Setting {
                flags: 0,
                id: 7,
                value: 65536,
            }],
        },
        syn(
            1,
            FLAG_FIN,
            &[("streamtype", "error"), ("port", "8080"), ("requestid", "0")],
        ),
        syn(3, 0, &[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]),
        Frame::Data {
            stream_id: 3,
            flags: 0,
            data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
        },
        Frame::WindowUpdate {
            stream_id: 3,
            delta: 1024,
        },
        Frame::Ping { id: 1 },
        Frame::Data {
            stream_id: 3,
            flags: FLAG_FIN,
            data: Bytes::new(),
        },
        syn(5, 0, &[("streamtype", "error"), ("port", "0"), ("requestid", "1")]),
        syn(7, 0, &[("streamtype", "data"), ("port", "65536")]),
        Frame::Headers {
            stream_id: 7,
            flags: 0,
            headers: headers(&[("x", "y")]),
        },
        Frame::RstStream {
            stream_id: 7,
            status: 5,
        },
        Frame::GoAway {
            last_good_stream_id: 7,
            status: 0,
        },
    ]
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut encoder = Encoder::new().expect("encoder");
    frames
        .iter()
        .flat_map(|f| encoder.encode(f).unwrap_or_default())
        .collect()
}

/// Every frame in `bytes` fed in pieces at the given cut points, up to the first error.
fn decode_in_pieces(bytes: &[u8], cuts: &[usize]) -> (Vec<Frame>, Option<crate::spdy::SpdyError>) {
    let mut decoder = Decoder::new();
    let mut frames = Vec::new();
    let mut start = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.push(bytes.len());
    for end in points {
        if end < start {
            continue;
        }
        decoder.push(&bytes[start..end]);
        start = end;
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

/// Mutated sessions, bytewise (header blocks are zlib streams: flipping their bytes reaches the
/// inflater) and with frame lengths and types made odd.
fn session_bytes() -> impl Strategy<Value = skiff_fuzz::Input> {
    let session = port_forward_session();
    let seeds = vec![
        encode_all(&session),
        encode_all(&session[1..4]),
        encode_all(&[Frame::Ping { id: 9 }]),
    ];
    mutated_bytes(
        seeds,
        &[
            b"\x80\x03\x00\x01",
            b"\x80\x02",
            b"\x00\xff\xff\xff",
            b"\x00\x00\x00\x00",
            b"\x78\xbb",
            b"\x80\x03\x00\x04\x00\x00\x00\x0c\x7f\xff\xff\xff",
        ],
        6,
    )
}

#[test]
fn fuzz_spdy_decoder() {
    run(
        "fuzz_spdy_decoder",
        1500,
        (session_bytes(), prop::collection::vec(any::<usize>(), 0..6)),
        |(bytes, cuts)| {
            let (whole, whole_err) = decode_in_pieces(&bytes, &[]);
            let (pieces, pieces_err) = decode_in_pieces(&bytes, &cuts);
            if whole != pieces || whole_err != pieces_err {
                return Err(format!(
                    "decoding depends on the cuts {cuts:?}: {whole:?} {whole_err:?} vs {pieces:?} {pieces_err:?}"
                ));
            }
            Ok(())
        },
    );
}

fn frame() -> impl Strategy<Value = Frame> {
    let name = "[a-z0-9-]{1,12}";
    let value = "[ -~]{0,16}";
    let hdrs = prop::collection::vec((name, prop::collection::vec(value, 1..3)), 0..4).prop_map(|pairs| {
        let mut h = Headers::new();
        for (n, values) in pairs {
            if h.get(&n).is_none() {
                for v in values {
                    h.add(&n, &v);
                }
            }
        }
        h
    });
    let id = 1u32..0x7fff_ffff;
    prop_oneof![
        (
            id.clone(),
            0u32..0x7fff_ffff,
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            hdrs.clone()
        )
            .prop_map(
                |(stream_id, associated_to, priority, slot, flags, headers)| Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority: priority & 0x7,
                    slot,
                    flags,
                    headers
                }
            ),
        (id.clone(), any::<u8>(), hdrs.clone()).prop_map(|(stream_id, flags, headers)| Frame::SynReply {
            stream_id,
            flags,
            headers
        }),
        (id.clone(), 1u32..12).prop_map(|(stream_id, status)| Frame::RstStream { stream_id, status }),
        (
            any::<u8>(),
            prop::collection::vec((any::<u8>(), 0u32..0xff_ffff, any::<u32>()), 0..4)
        )
            .prop_map(|(flags, e)| Frame::Settings {
                flags,
                entries: e
                    .into_iter()
                    .map(|(flags, id, value)| Setting { flags, id, value })
                    .collect()
            }),
        (1u32..u32::MAX).prop_map(|id| Frame::Ping { id }),
        (0u32..0x7fff_ffff, 0u32..3).prop_map(|(last_good_stream_id, status)| Frame::GoAway {
            last_good_stream_id,
            status
        }),
        (id.clone(), any::<u8>(), hdrs).prop_map(|(stream_id, flags, headers)| Frame::Headers {
            stream_id,
            flags,
            headers
        }),
        (id.clone(), 1u32..0x7fff_ffff).prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
        (id, any::<u8>(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(stream_id, flags, d)| Frame::Data {
            stream_id,
            flags,
            data: Bytes::from(d)
        }),
    ]
}

/// What the encoder writes, the decoder reads back as the same frames (one compression context
/// per direction, as in a session).
#[test]
fn fuzz_spdy_round_trip() {
    run(
        "fuzz_spdy_round_trip",
        800,
        prop::collection::vec(frame(), 1..8),
        |frames| {
            let mut encoder = Encoder::new().map_err(|e| e.to_string())?;
            let mut decoder = Decoder::new();
            for f in frames {
                let Ok(bytes) = encoder.encode(&f) else { continue };
                decoder.push(&bytes);
                let back = decoder
                    .next_frame()
                    .map_err(|e| format!("{f:?} encodes to bytes that fail: {e}"))?;
                if back.as_ref() != Some(&f) {
                    return Err(format!("{f:?} decodes as {back:?}"));
                }
            }
            Ok(())
        },
    );
}

/// Whole port-forward sessions, end to end through the agent's server side: mutated client
/// bytes in, the session must end once they end (no hang, no panic), and everything the server
/// wrote must decode. Forwarded connections target an address that is not an IP, so no
/// connection leaves the process.
#[test]
fn fuzz_port_forward_session() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let strategy = (session_bytes(), prop::collection::vec(any::<usize>(), 0..4));
    run("fuzz_port_forward_session", 300, strategy, |(bytes, cuts)| {
        rt.block_on(async {
            let (to_server, incoming) = futures::channel::mpsc::unbounded::<Bytes>();
            let (outgoing, from_server) = futures::channel::mpsc::unbounded::<Bytes>();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort_unstable();
            points.push(bytes.len());
            let mut start = 0;
            for end in points {
                if end > start {
                    let _ = to_server.unbounded_send(Bytes::copy_from_slice(&bytes[start..end]));
                    start = end;
                }
            }
            drop(to_server);
            let target = crate::server::PortForwardTarget {
                pod: "sandbox".into(),
                uid: String::new(),
                ip: "no-ip".into(),
            };
            let served = crate::server::serve_port_forward(incoming, outgoing, target);
            tokio::time::timeout(std::time::Duration::from_secs(10), served)
                .await
                .map_err(|_| "the session did not end after its input ended".to_string())?;
            let written: Vec<u8> = from_server.collect::<Vec<Bytes>>().await.concat();
            let (_, err) = decode_in_pieces(&written, &[]);
            if let Some(e) = err {
                return Err(format!("the server wrote a malformed frame: {e}"));
            }
            Ok(())
        })
    });
}

#[test]
fn fuzz_endpoint_queries() {
    let seeds = [
        "command=sh&command=-c&command=echo%20hi&stdin=true&stdout=1&stderr=true&tty=false&container=c",
        "ports=8080,9090&port=1",
        "follow=true&tailLines=10&timestamps=1&previous=false&sinceSeconds=5&limitBytes=100",
        "input=1&output=1&error=1",
    ];
    run(
        "fuzz_endpoint_queries",
        1500,
        mutated_text(&seeds, &[b"%", b"%2", b"+", b"&", b"="], 6),
        |q| {
            let params = crate::server::parse_query(&q);
            // A parsed query keeps every key=value pair the raw one had.
            let pairs = q.split('&').filter(|p| !p.is_empty()).count();
            if params.len() != pairs {
                return Err(format!("{q:?} parses to {} pairs, not {pairs}", params.len()));
            }
            Ok(())
        },
    );
}
