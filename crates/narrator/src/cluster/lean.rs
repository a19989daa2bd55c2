//! A build without the `fleet` feature (README command 1 builds it so: no Postgres,
//! RabbitMQ, S3 or metrics listener to compile). The distributed commands, and the
//! database flags of `plan` and `bench`, say that this build leaves them out and how to
//! get them; everything embedded is the same code as in the full build.

/// The one error for everything this build leaves out.
pub(crate) fn left_out(what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} is not in this build of narrator (built without the `fleet` feature): \
         build it with the default features, `cargo build --release -p narrator`, \
         and use target/release/narrator"
    )
}

pub(crate) mod fleet {
    //! The database seams of `plan` and `bench`: connecting is the error, so there is
    //! never a connection to use.

    use narrator_hardware::{Calibration, Catalog};
    use narrator_pipeline::BenchFigures;

    use super::left_out;

    /// No database connection can exist in this build.
    pub(crate) enum Db {}

    pub(crate) async fn connect(_url: &str) -> anyhow::Result<Db> {
        Err(left_out("--database-url (the fleet's calibrations)"))
    }

    pub(crate) async fn load_into(db: &Db, _: &mut Catalog) -> anyhow::Result<()> {
        match *db {}
    }

    pub(crate) async fn share(db: &Db, _: &Calibration, _: &str) -> anyhow::Result<bool> {
        match *db {}
    }

    pub(crate) async fn bench_store(_url: &str) -> anyhow::Result<Db> {
        Err(left_out(
            "storing bench results in Postgres (--database-url; pass --no-store to only print them)",
        ))
    }

    pub(crate) async fn print_bench_table(_url: Option<&str>, _json: bool) -> anyhow::Result<()> {
        Err(left_out("`narrator bench --fleet`"))
    }

    pub(crate) async fn record_bench(
        db: &Db,
        _: crate::bench::Measured<'_>,
        _: &BenchFigures,
        _: serde_json::Value,
    ) -> anyhow::Result<()> {
        match *db {}
    }
}
