//! Embeds the schema's migrations (the repository's `migrations/`, one `VERSION_name.sql`
//! each) into the library: `$OUT_DIR/migrations.rs` lists them in version order. Done here
//! rather than with sqlx's `migrate!` macro, which would compile sqlx's Postgres driver a
//! second time for the host (about a minute of every first build on two cores).

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the repository's migrations/ folder") {
        let path = entry.expect("a migrations/ entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let Some(stem) = name.strip_suffix(".sql") else {
            continue;
        };
        let (version, description) = stem
            .split_once('_')
            .unwrap_or_else(|| panic!("migration {name}: expected VERSION_description.sql"));
        let version: i64 = version
            .parse()
            .unwrap_or_else(|_| panic!("migration {name}: its version is not a number"));
        println!("cargo:rerun-if-changed={}", path.display());
        // sqlx records the description with spaces for underscores (as its macro does).
        found.push((version, description.replace('_', " "), path));
    }
    found.sort_by_key(|m| m.0);
    let mut out = String::from("&[\n");
    for (version, description, path) in &found {
        let path = path.canonicalize().expect("migration path");
        writeln!(
            out,
            "    ({version}, {description:?}, include_str!({:?})),",
            path.display().to_string()
        )
        .expect("write to a String");
    }
    out.push_str("]\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("migrations.rs");
    std::fs::write(dest, out).expect("write migrations.rs");
}
