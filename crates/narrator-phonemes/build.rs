//! Links Debian's libespeak-ng (>= 1.51) found through pkg-config.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(err) = pkg_config::Config::new()
        .atleast_version("1.51")
        .probe("espeak-ng")
    {
        // Fail with one line that says what to do instead of a linker error later.
        panic!(
            "libespeak-ng (>= 1.51) not found through pkg-config: run ops/setup.sh \
             (installs libespeak-ng-dev and pkg-config). Details: {err}"
        );
    }
}
