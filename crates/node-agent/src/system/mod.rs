//! The machine the agent runs on: cgroups ([`cgroups`]), resource sampling
//! from `/proc` ([`monitor`]), the agent as its browsers' subreaper
//! ([`reaper`]), files an instance downloaded ([`downloads`]), and how the
//! agent writes in folders the browser owns ([`files`]), and [`remount`].

pub mod cgroups;
pub mod dirs;
pub mod downloads;
pub mod files;
pub mod monitor;
pub mod process;
pub mod reaper;

/// Changes the flags of the mount at `target` (`flags` carries
/// `MS_REMOUNT | MS_BIND` and the flags the mount is to have).
pub fn remount(target: &std::ffi::CStr, flags: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: a valid C string and the null pointers mount(2) accepts for a
    // remount.
    let done = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
