//! The client against a real etcd that serves TLS and asks for client certificates, as a
//! production cluster's members do (`--client-cert-auth`): with the CA and a certificate it
//! reads and writes; without a certificate, or trusting another CA, every call fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};
use skiff_etcd::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A certificate and key signed by `ca`, for a server on 127.0.0.1 or a client.
fn leaf(ca: &Ca, name: &str, server: bool) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    if server {
        params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tls(ca: &str, client: Option<&(String, String)>) -> ConnectOptions {
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert.as_str(), key.as_str()));
    }
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_tls(tls)
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let authority = ca("etcd-ca");
    let (server_cert, server_key) = leaf(&authority, "etcd", true);
    let client = leaf(&authority, "skiff", false);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_file = write("ca.crt", &authority.pem);
    let cert_file = write("server.crt", &server_cert);
    let key_file = write("server.key", &server_key);
    let (port, peer) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{port}");
    let _etcd = Etcd(
        Command::new(skiff_testkit::etcd_binary())
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
            .arg("--cert-file")
            .arg(&cert_file)
            .arg("--key-file")
            .arg(&key_file)
            .arg("--trusted-ca-file")
            .arg(&ca_file)
            .arg("--client-cert-auth")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd"),
    );

    let endpoints = [format!("127.0.0.1:{port}")];
    let mut ok = Client::connect(&endpoints, Some(tls(&authority.pem, Some(&client))))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match ok.put("/k", "v", None).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("etcd not answering yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("etcd over TLS never answered: {e}"),
        }
    }
    let got = ok.kv_client().get("/k", Some(GetOptions::new())).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");

    // No client certificate: the member refuses the handshake.
    let anonymous = Client::connect(&endpoints, Some(tls(&authority.pem, None)))
        .await
        .unwrap();
    assert!(anonymous.kv_client().get("/k", None).await.is_err());
    // A member whose certificate another CA signed is not trusted.
    let other = ca("other-ca");
    let wrong = Client::connect(&endpoints, Some(tls(&other.pem, Some(&client))))
        .await
        .unwrap();
    assert!(wrong.kv_client().get("/k", None).await.is_err());
}
