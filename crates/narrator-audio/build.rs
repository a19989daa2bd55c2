//! Tells the M4B sink which FFmpeg API it compiles against: FFmpeg 7 removed the
//! `channels` fields that 5.1 (Debian 12) still needs set. ffmpeg-sys-next detects the
//! version and passes it to dependents as `DEP_FFMPEG_FFMPEG_7_0`.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(ffmpeg7)");
    println!("cargo:rerun-if-env-changed=DEP_FFMPEG_FFMPEG_7_0");
    if std::env::var("DEP_FFMPEG_FFMPEG_7_0").as_deref() == Ok("true") {
        println!("cargo:rustc-cfg=ffmpeg7");
    }
}
