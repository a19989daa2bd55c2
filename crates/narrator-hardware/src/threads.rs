//! Thread priorities: background work (encoding a book, assembling a job) that should
//! take only the cycles inference leaves.

/// How much nicer than the rest of the process background threads run: where every core
/// is busy they get about a tenth of the share of the others (Linux CFS weights 110 vs
/// 1024 for nice 10 vs 0).
pub const BACKGROUND_NICE_STEP: i32 = 10;

/// Lowers the calling thread (only it: on Linux a thread id is a process id to
/// `setpriority`) by [`BACKGROUND_NICE_STEP`], to at most nice 19. Lowering needs no
/// privilege; elsewhere than Linux it does nothing.
#[allow(unsafe_code)]
pub fn lower_current_thread_priority() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let nice = (current_thread_nice().unwrap_or(0) + BACKGROUND_NICE_STEP).min(19);
        // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The calling thread's nice value (Linux; `None` elsewhere or when it cannot be read).
pub fn current_thread_nice() -> Option<i32> {
    // Field 19 of /proc/thread-self/stat, counted after the command name's closing ')'.
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(16)?.parse().ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn only_the_calling_thread_is_lowered() {
        let before = current_thread_nice().expect("this thread's nice value");
        let lowered = std::thread::spawn(|| {
            lower_current_thread_priority().expect("lowering needs no privilege");
            current_thread_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(lowered, Some((before + BACKGROUND_NICE_STEP).min(19)));
        assert_eq!(current_thread_nice(), Some(before));
    }
}
