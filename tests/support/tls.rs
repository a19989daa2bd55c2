//! TLS for the tests: a throwaway PKI (a CA, a second unrelated CA, and a server
//! certificate the first CA signed for `localhost` and `127.0.0.1` only) and a TLS
//! terminating proxy that puts HTTPS in front of a plain-HTTP server (the S3 test server).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Certificates written as PEM files in a temporary folder.
pub struct TestPki {
    /// The CA that signed the server certificate.
    pub ca: PathBuf,
    /// A CA that signed nothing the servers present.
    pub other_ca: PathBuf,
    /// The server certificate (valid for `localhost` and `127.0.0.1`, not `127.0.0.2`).
    pub server_cert: PathBuf,
    /// Its private key (PKCS#8).
    pub server_key: PathBuf,
    server_der: Vec<u8>,
    key_der: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("CA certificate");
    (params, key, cert.pem())
}

impl TestPki {
    /// Makes the certificates.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("pki dir");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write pem");
            path
        };
        let (ca_params, ca_key, ca_pem) = ca("narrator test CA");
        let (_, _, other_pem) = ca("some other CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "narrator test server");
        let server = params
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        Self {
            ca: write("ca.pem", &ca_pem),
            other_ca: write("other-ca.pem", &other_pem),
            server_cert: write("server.pem", &server.pem()),
            server_key: write("server.key", &server_key.serialize_pem()),
            server_der: server.der().to_vec(),
            key_der: server_key.serialize_der(),
            _dir: dir,
        }
    }

    /// Copies the server's certificate and key into `dir` (for a server that runs as
    /// another user), returning `(certificate, key)`.
    pub fn copy_server_files(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let cert = dir.join("server.pem");
        let key = dir.join("server.key");
        std::fs::copy(&self.server_cert, &cert).expect("copy cert");
        std::fs::copy(&self.server_key, &key).expect("copy key");
        std::fs::copy(&self.ca, dir.join("ca.pem")).expect("copy ca");
        set_mode(&key, 0o600);
        (cert, key)
    }

    fn server_config(&self) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![rustls::pki_types::CertificateDer::from(
                    self.server_der.clone(),
                )],
                rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
            )
            .expect("server config")
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// HTTPS on every loopback address (127.0.0.1, and 127.0.0.2 which the certificate does
/// not name) at `port`, in front of plain HTTP on 127.0.0.1:`upstream`, with the
/// [`TestPki`] server certificate. Runs on its own thread until dropped.
pub struct TlsProxy {
    /// Its port.
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsProxy {
    /// Starts the proxy.
    pub fn start(pki: &TestPki, upstream: u16) -> Self {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_config()));
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (client, _) = tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok(pair) => pair,
                            Err(_) => continue,
                        },
                        _ = &mut stopped => return,
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        // A refused handshake (the client does not trust the CA) just ends.
                        let Ok(mut tls) = acceptor.accept(client).await else {
                            return;
                        };
                        let Ok(mut server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                    });
                }
            });
        });
        Self {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
