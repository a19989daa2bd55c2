//! URLs made safe to print.

/// Query parameters whose value is hidden: any whose lower-cased name contains one of
/// these (`password`, `sslpassword`, `X-Amz-Signature`, `access_token`, `sslkey`, ...).
const SECRET_PARAMS: &[&str] = &[
    "pass",
    "pwd",
    "secret",
    "token",
    "signature",
    "credential",
    "key",
    "auth",
];

const HIDDEN: &str = "***";

/// `url` with its password and password-like query parameter values replaced by `***`.
/// The user name, host, port, path and other parameters stay as given. Text that does not
/// parse as a URL is returned with everything between `://` and the last `@` hidden.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        // Unchanged when there is nothing to hide (the parser would normalize, e.g. add a
        // trailing `/`).
        Ok(parsed) => redact_parsed(parsed).unwrap_or_else(|| url.to_owned()),
        Err(_) => redact_unparsed(url),
    }
}

/// The redacted URL, or `None` when it holds nothing to hide.
fn redact_parsed(mut url: url::Url) -> Option<String> {
    let mut changed = false;
    if url.password().is_some() {
        // Fails only for URLs that cannot have user info (`data:`, ...), which have none.
        changed |= url.set_password(Some(HIDDEN)).is_ok();
    }
    if let Some(query) = url.query() {
        let hidden = redact_query(query);
        if hidden != query {
            url.set_query(Some(&hidden));
            changed = true;
        }
    }
    changed.then(|| url.to_string())
}

/// `a=1&password=x&b` → `a=1&password=***&b`, keeping every other byte as given.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}={HIDDEN}"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn is_secret(name: &str) -> bool {
    let decoded = url::form_urlencoded::parse(name.as_bytes())
        .next()
        .map(|(k, _)| k.to_ascii_lowercase())
        .unwrap_or_default();
    SECRET_PARAMS.iter().any(|s| decoded.contains(s))
}

fn redact_unparsed(text: &str) -> String {
    let Some(start) = text.find("://").map(|i| i + 3) else {
        return text.to_owned();
    };
    match text[start..].rfind('@') {
        Some(at) => format!("{}{HIDDEN}{}", &text[..start], &text[start + at..]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn the_password_of_the_user_info_is_hidden() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact("amqps://narrator:p%40ss@mq.example.com/prod?heartbeat=30"),
            "amqps://narrator:***@mq.example.com/prod?heartbeat=30"
        );
        assert_eq!(
            redact("postgres://app:hunter2@db.internal:5432/narrator?sslmode=verify-full"),
            "postgres://app:***@db.internal:5432/narrator?sslmode=verify-full"
        );
    }

    #[test]
    fn urls_without_secrets_are_unchanged() {
        for url in [
            "amqp://127.0.0.1:5672",
            "amqp://user@h",
            "postgres://postgres@127.0.0.1:5432/postgres",
            "postgres://postgres@127.0.0.1/db?sslmode=require&sslrootcert=/etc/ca/root.pem",
            "https://s3.eu-west-1.amazonaws.com",
        ] {
            assert_eq!(redact(url), url);
        }
    }

    #[test]
    fn password_like_query_parameters_are_hidden() {
        assert_eq!(
            redact("postgres://db.internal/narrator?user=app&password=hunter2&sslmode=require"),
            "postgres://db.internal/narrator?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            redact(
                "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKID%2F2026&X-Amz-Signature=abc&X-Amz-Expires=60"
            ),
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60"
        );
        assert_eq!(
            redact("postgres://h/db?sslpassword=x&sslkey=/k.pem&application_name=narrator"),
            "postgres://h/db?sslpassword=***&sslkey=***&application_name=narrator"
        );
        // The name is matched decoded and case-insensitively.
        assert_eq!(
            redact("amqp://h/?PassWord=x&%70assword=y"),
            "amqp://h/?PassWord=***&%70assword=***"
        );
    }

    #[test]
    fn both_places_at_once() {
        assert_eq!(
            redact("postgres://a:b@h/db?password=c"),
            "postgres://a:***@h/db?password=***"
        );
    }

    #[test]
    fn text_that_is_not_a_url_still_loses_its_user_info() {
        // A port that is not a number: the parser refuses it.
        assert_eq!(
            redact("amqp://guest:s3cr@t@host:port/x"),
            "amqp://***@host:port/x"
        );
        assert_eq!(redact("not a url"), "not a url");
    }
}
