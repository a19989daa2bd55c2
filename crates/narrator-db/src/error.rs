//! The database's errors. A constraint the schema enforces comes back as a domain error
//! (unknown job, duplicate segment, empty job), never as a string to match on; everything
//! else keeps sqlx's error as its source. [`DbError::kind`] is the stable word used as a
//! metric label and a `failure_kind`.

use uuid::Uuid;

/// A failed database operation.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database could not be reached (connection refused, pool timed out or closed).
    #[error("cannot reach the database: {0}; is Postgres running and the database URL right?")]
    Unavailable(#[source] sqlx::Error),
    /// The TLS handshake with the database failed: its certificate was refused.
    #[error(
        "TLS to the database failed: {problem}; for a private CA add sslrootcert=<CA file> to the database URL (or set PGSSLROOTCERT), and use sslmode=verify-full"
    )]
    Tls {
        /// The cause, named.
        problem: narrator_net::TlsProblem,
        /// sqlx's error.
        #[source]
        source: sqlx::Error,
    },
    /// No job has this id.
    #[error("job {0} does not exist")]
    JobNotFound(Uuid),
    /// The job has no segment with this index.
    #[error("job {job} has no segment {index}")]
    SegmentNotFound {
        /// The job.
        job: Uuid,
        /// The segment index asked for.
        index: u32,
    },
    /// A plan lists the same segment index twice.
    #[error("job {0}: the plan lists a segment index twice")]
    DuplicateSegment(Uuid),
    /// A plan without segments.
    #[error("a job needs at least one segment; the plan has none")]
    EmptyJob,
    /// Another claim of the job was running, and this one was asked not to wait for it
    /// ([`crate::ClaimLimits::skip_when_busy`]): nothing was claimed; try again shortly.
    #[error("another claim of job {0} is running; nothing was claimed")]
    ClaimBusy(Uuid),
    /// A job id given as text is not a UUID.
    #[error("'{text}' is not a job id (a job id is a UUID such as 0b0e5b6a-...)")]
    BadJobId {
        /// The text given.
        text: String,
        /// Why it did not parse.
        #[source]
        source: uuid::Error,
    },
    /// A state store bound to one job was asked about another.
    #[error("this state store records job {bound}, not {asked}")]
    WrongJob {
        /// The job the store is bound to.
        bound: Uuid,
        /// The job asked for.
        asked: String,
    },
    /// A value does not fit its column.
    #[error("{what} = {value} does not fit in the database")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A row holds a value this version does not know (a newer schema, or hand edits).
    #[error("unexpected value {value:?} in column {column}")]
    Corrupt {
        /// The column.
        column: &'static str,
        /// What it held.
        value: String,
    },
    /// A constraint this crate does not map was violated.
    #[error("the database rejected the change (constraint {constraint}): {source}")]
    Constraint {
        /// The constraint's name.
        constraint: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// Any other database error.
    #[error("database error: {0}")]
    Query(#[source] sqlx::Error),
    /// Applying the migrations failed.
    #[error("cannot apply the database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// SQLSTATEs that mean the server, not the statement, is the problem: connection
/// exceptions (class 08), insufficient resources (53), operator intervention (57: shut
/// down, restarting, statement timeout) and system errors (58).
fn server_trouble(code: &str) -> bool {
    ["08", "53", "57", "58"].iter().any(|c| code.starts_with(c))
}

/// How sqlx's error is retried. A database error by its SQLSTATE; without one, by its
/// kind: the connection or pool failing is an outage; a row, column or value this
/// version cannot read, and a bad configuration, never get better; a protocol error
/// (a connection in a bad state) may.
fn sqlx_class(e: &sqlx::Error) -> narrator_core::RetryClass {
    use narrator_core::RetryClass;
    use sqlx::Error as E;
    match e {
        E::Database(d) => match d.code() {
            Some(code) if server_trouble(&code) => RetryClass::Infrastructure,
            _ => RetryClass::Transient,
        },
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
            RetryClass::Infrastructure
        }
        E::Protocol(_) => RetryClass::Transient,
        _ => RetryClass::Permanent,
    }
}

impl DbError {
    /// How an operation that failed with this error is retried: the database being away,
    /// restarting or timing out is an outage (not the segment's fault); a row or value
    /// that is wrong never gets better; anything else may.
    pub fn retry_class(&self) -> narrator_core::RetryClass {
        use narrator_core::RetryClass;
        match self {
            Self::Unavailable(_) | Self::Tls { .. } => RetryClass::Infrastructure,
            Self::Query(e) => sqlx_class(e),
            Self::ClaimBusy(_) => RetryClass::Transient,
            Self::JobNotFound(_)
            | Self::SegmentNotFound { .. }
            | Self::DuplicateSegment(_)
            | Self::EmptyJob
            | Self::BadJobId { .. }
            | Self::WrongJob { .. }
            | Self::OutOfRange { .. }
            | Self::Corrupt { .. }
            | Self::Constraint { .. }
            | Self::Migrate(_) => RetryClass::Permanent,
        }
    }

    /// Stable word for metrics and `failure_kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "db_unavailable",
            Self::Tls { .. } => "db_tls",
            Self::JobNotFound(_) => "job_not_found",
            Self::SegmentNotFound { .. } => "segment_not_found",
            Self::DuplicateSegment(_) => "duplicate_segment",
            Self::EmptyJob => "empty_job",
            Self::ClaimBusy(_) => "claim_busy",
            Self::BadJobId { .. } => "bad_job_id",
            Self::WrongJob { .. } => "wrong_job",
            Self::OutOfRange { .. } => "db_out_of_range",
            Self::Corrupt { .. } => "db_corrupt",
            Self::Constraint { .. } => "db_constraint",
            Self::Query(_) => "db_query",
            Self::Migrate(_) => "db_migrate",
        }
    }

    /// Classifies a failed connection: a refused certificate is [`DbError::Tls`],
    /// anything else [`DbError::Unavailable`].
    pub(crate) fn on_connect(e: sqlx::Error) -> Self {
        match narrator_net::tls_problem(&e) {
            Some(problem) => Self::Tls { problem, source: e },
            None => Self::Unavailable(e),
        }
    }

    /// Classifies an sqlx error raised while working on `job`: the schema's constraint
    /// names become domain errors, connectivity becomes [`DbError::Unavailable`].
    pub(crate) fn on_job(job: Uuid, e: sqlx::Error) -> Self {
        let constraint = e
            .as_database_error()
            .and_then(|d| d.constraint())
            .map(str::to_owned);
        match constraint.as_deref() {
            Some("segments_pkey") => Self::DuplicateSegment(job),
            Some("segments_job_id_fkey") => Self::JobNotFound(job),
            Some("jobs_segments_total_check") => Self::EmptyJob,
            Some(c) => Self::Constraint {
                constraint: c.to_owned(),
                source: e,
            },
            None => Self::from(e),
        }
    }
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        if let Some(problem) = narrator_net::tls_problem(&e) {
            return Self::Tls { problem, source: e };
        }
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Self::Unavailable(e),
            sqlx::Error::Database(ref d) if d.code().is_some_and(|c| server_trouble(&c)) => {
                Self::Unavailable(e)
            }
            e => match e
                .as_database_error()
                .and_then(|d| d.constraint())
                .map(str::to_owned)
            {
                Some(constraint) => Self::Constraint {
                    constraint,
                    source: e,
                },
                None => Self::Query(e),
            },
        }
    }
}

/// `u32` → `integer` column.
pub(crate) fn int4(what: &'static str, v: u32) -> Result<i32, DbError> {
    i32::try_from(v).map_err(|_| DbError::OutOfRange {
        what,
        value: u64::from(v),
    })
}

/// `u64` → `bigint` column.
pub(crate) fn int8(what: &'static str, v: u64) -> Result<i64, DbError> {
    i64::try_from(v).map_err(|_| DbError::OutOfRange { what, value: v })
}

/// A non-negative integer read back from the database.
pub(crate) fn unsigned<T: TryFrom<i64>>(column: &'static str, v: i64) -> Result<T, DbError> {
    T::try_from(v).map_err(|_| DbError::Corrupt {
        column,
        value: v.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use narrator_core::RetryClass;

    use super::DbError;

    fn class(e: sqlx::Error) -> RetryClass {
        DbError::Query(e).retry_class()
    }

    #[test]
    fn errors_without_a_sqlstate_are_classed_by_their_kind() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(class(sqlx::Error::Io(refused)), RetryClass::Infrastructure);
        assert_eq!(class(sqlx::Error::PoolTimedOut), RetryClass::Infrastructure);
        assert_eq!(class(sqlx::Error::PoolClosed), RetryClass::Infrastructure);
        assert_eq!(
            class(sqlx::Error::Protocol("unexpected message".into())),
            RetryClass::Transient
        );
        // Wrong rows, columns and values never get better: not an outage to wait out.
        assert_eq!(class(sqlx::Error::RowNotFound), RetryClass::Permanent);
        assert_eq!(
            class(sqlx::Error::ColumnNotFound("text_digest".into())),
            RetryClass::Permanent
        );
        assert_eq!(
            class(sqlx::Error::Decode("not a UUID".into())),
            RetryClass::Permanent
        );
        assert_eq!(
            class(sqlx::Error::Configuration("bad URL".into())),
            RetryClass::Permanent
        );
    }
}
