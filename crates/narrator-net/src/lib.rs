//! How narrator reaches its services (Postgres, RabbitMQ, S3), the parts every client
//! shares:
//!
//! - [`redact`]: a URL made safe to print, done with a URL parser: the password of the
//!   user info and the values of password-like query parameters become `***`;
//! - [`file_secrets`]: `NAME_FILE` variables (how Docker and Kubernetes mount secrets)
//!   read into `NAME`;
//! - [`tls_problem`]: a failed TLS handshake named by its cause (unknown CA, wrong host
//!   name, expired certificate), found in an error's source chain.

mod redact;
mod secrets;
mod tls;

pub use redact::redact;
pub use secrets::{FILE_SECRETS, SecretError, file_secrets};
pub use tls::{TlsProblem, tls_problem};
