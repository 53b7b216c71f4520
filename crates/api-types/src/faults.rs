//! Fault points for the crash tests: named places where a test build can be
//! told, through `FLOTILLA_FAULTS="name=stall:4000,other=exit"`, to stall
//! (milliseconds), to hold until a file exists (`until:/path`: the test
//! decides when it goes on), or to die at once (as a `kill -9` would leave
//! things), so that a crash between two steps is reproduced exactly instead
//! of by luck.
//! Compiled only with the `fault-points` feature (the test suite's build,
//! `scripts/test`); otherwise every point is an empty function.

/// Reaches the fault point `name`.
#[cfg(feature = "fault-points")]
pub async fn point(name: &str) {
    let Ok(spec) = std::env::var("FLOTILLA_FAULTS") else {
        return;
    };
    for entry in spec.split(',') {
        match entry.trim().split_once('=') {
            Some((point, action)) if point == name => act(name, action).await,
            _ => {}
        }
    }
}

#[cfg(feature = "fault-points")]
async fn act(name: &str, action: &str) {
    if let Some(millis) = action.strip_prefix("stall:") {
        let millis = millis.parse().unwrap_or(0);
        eprintln!("fault point {name}: stalling {millis} ms");
        tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
    } else if let Some(path) = action.strip_prefix("until:") {
        eprintln!("fault point {name}: holding until {path} exists");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while !std::path::Path::new(path).exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    } else if action == "exit" {
        eprintln!("fault point {name}: exiting at once");
        // SAFETY: _exit ends the process at once, as a crash would: no
        // destructor, no flush, no graceful shutdown.
        unsafe { libc_exit(137) };
    }
}

#[cfg(feature = "fault-points")]
unsafe extern "C" {
    #[link_name = "_exit"]
    fn libc_exit(status: i32) -> !;
}

/// Reaches the fault point `name` (nothing happens in this build).
#[cfg(not(feature = "fault-points"))]
#[inline(always)]
pub async fn point(_name: &str) {}
