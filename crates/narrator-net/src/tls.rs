//! A failed TLS handshake, named by its cause.

use std::error::Error;

/// Why the TLS handshake with a server failed, as a user can act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsProblem {
    /// The server's certificate is not signed by a CA this client trusts.
    UnknownCa,
    /// The certificate is valid, but not for the host name connected to.
    WrongHost,
    /// The certificate has expired or is not valid yet.
    Expired,
    /// Any other certificate or handshake failure (rustls's description).
    Other(String),
}

impl std::fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsProblem::UnknownCa => f.write_str(
                "the server's TLS certificate is not signed by a trusted CA (give the server's CA file)",
            ),
            TlsProblem::WrongHost => f.write_str(
                "the server's TLS certificate is not valid for this host name (connect with a name the certificate lists)",
            ),
            TlsProblem::Expired => {
                f.write_str("the server's TLS certificate has expired or is not valid yet")
            }
            TlsProblem::Other(text) => write!(f, "TLS failed: {text}"),
        }
    }
}

/// The TLS problem somewhere in `err`'s source chain (also inside `std::io::Error`s,
/// whose `source` skips the error they wrap), or `None` when the failure was not TLS.
pub fn tls_problem(err: &(dyn Error + 'static)) -> Option<TlsProblem> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(problem) = as_problem(e) {
            return Some(problem);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| tls_problem(inner))
        {
            return Some(inner);
        }
        next = e.source();
    }
    None
}

fn as_problem(e: &(dyn Error + 'static)) -> Option<TlsProblem> {
    use rustls::CertificateError as C;
    let rustls_error = e.downcast_ref::<rustls::Error>()?;
    Some(match rustls_error {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            TlsProblem::UnknownCa
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => TlsProblem::WrongHost,
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => TlsProblem::Expired,
        other => TlsProblem::Other(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn found_through_io_errors_and_sources() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(tls_problem(&Outer(io)), Some(TlsProblem::UnknownCa));
        let io = std::io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ));
        assert_eq!(tls_problem(&io), Some(TlsProblem::WrongHost));
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(tls_problem(&Outer(plain)), None);
    }
}
