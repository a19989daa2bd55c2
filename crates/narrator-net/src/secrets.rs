//! Secrets from files: `NAME_FILE=/run/secrets/x` stands for `NAME=<the file's content>`,
//! the convention of Docker and Kubernetes secrets mounted as files.

use std::path::PathBuf;

/// The variables narrator reads that may hold a secret, each of which may come from
/// `NAME_FILE` instead.
pub const FILE_SECRETS: &[&str] = &[
    "NARRATOR_DATABASE_URL",
    "NARRATOR_AMQP_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
];

/// A `NAME_FILE` variable that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Both `NAME` and `NAME_FILE` are set: which one wins would be a guess.
    #[error("both {name} and {name}_FILE are set; unset one of them")]
    Both {
        /// `NAME`.
        name: String,
    },
    /// The file cannot be read.
    #[error(
        "{name}_FILE={}: cannot read it ({source}); mount the secret there or unset {name}_FILE",
        .path.display()
    )]
    Unreadable {
        /// `NAME`.
        name: String,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty (after its trailing newline is removed).
    #[error("{name}_FILE={}: the file is empty; write the secret into it", .path.display())]
    Empty {
        /// `NAME`.
        name: String,
        /// The file.
        path: PathBuf,
    },
}

/// For each of `names` whose `NAME_FILE` is set (per `var`, e.g. `std::env::var`), the
/// pair `(NAME, content)`: the file's content without its trailing line break. Nothing is
/// set here; the caller puts the values where its settings are read from.
pub fn file_secrets(
    names: &[&str],
    var: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, SecretError> {
    let mut found = Vec::new();
    for name in names {
        let Some(path) = var(&format!("{name}_FILE")).filter(|p| !p.is_empty()) else {
            continue;
        };
        if var(name).is_some_and(|v| !v.is_empty()) {
            return Err(SecretError::Both {
                name: (*name).to_owned(),
            });
        }
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).map_err(|source| SecretError::Unreadable {
            name: (*name).to_owned(),
            path: path.clone(),
            source,
        })?;
        let value = text.strip_suffix('\n').unwrap_or(&text);
        let value = value.strip_suffix('\r').unwrap_or(value);
        if value.is_empty() {
            return Err(SecretError::Empty {
                name: (*name).to_owned(),
                path,
            });
        }
        found.push(((*name).to_owned(), value.to_owned()));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn a_file_stands_for_its_variable() {
        let dir = tempfile::tempdir().expect("dir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "wJalrXUtnFEMI/K7MDENG\n").expect("write");
        let url = dir.path().join("url");
        std::fs::write(&url, "postgres://app:pw@db/narrator").expect("write");
        let got = file_secrets(
            FILE_SECRETS,
            vars(&[
                (
                    "AWS_SECRET_ACCESS_KEY_FILE",
                    secret.to_str().expect("utf-8"),
                ),
                ("NARRATOR_DATABASE_URL_FILE", url.to_str().expect("utf-8")),
                ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ]),
        )
        .expect("secrets");
        assert_eq!(
            got,
            vec![
                (
                    "NARRATOR_DATABASE_URL".to_owned(),
                    "postgres://app:pw@db/narrator".to_owned()
                ),
                (
                    "AWS_SECRET_ACCESS_KEY".to_owned(),
                    "wJalrXUtnFEMI/K7MDENG".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn both_set_missing_file_and_empty_file_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").expect("write");
        let e = file_secrets(
            FILE_SECRETS,
            vars(&[
                ("NARRATOR_AMQP_URL", "amqp://h"),
                ("NARRATOR_AMQP_URL_FILE", "/x"),
            ]),
        )
        .expect_err("both");
        assert_eq!(
            e.to_string(),
            "both NARRATOR_AMQP_URL and NARRATOR_AMQP_URL_FILE are set; unset one of them"
        );
        let e = file_secrets(
            FILE_SECRETS,
            vars(&[("AWS_SESSION_TOKEN_FILE", "/nonexistent/token")]),
        )
        .expect_err("missing");
        assert!(
            e.to_string().starts_with(
                "AWS_SESSION_TOKEN_FILE=/nonexistent/token: cannot read it (No such file"
            ),
            "{e}"
        );
        let e = file_secrets(
            FILE_SECRETS,
            vars(&[("AWS_ACCESS_KEY_ID_FILE", empty.to_str().expect("utf-8"))]),
        )
        .expect_err("empty");
        assert!(e.to_string().contains("the file is empty"), "{e}");
    }

    #[test]
    fn unset_and_empty_file_variables_are_ignored() {
        let got = file_secrets(
            FILE_SECRETS,
            vars(&[("NARRATOR_AMQP_URL_FILE", ""), ("AWS_ACCESS_KEY_ID", "x")]),
        )
        .expect("nothing");
        assert!(got.is_empty());
    }
}
