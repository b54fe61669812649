//! A restored name's metadata: extended attributes and times, set on
//! the name itself (never through a symlink).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The set-user-id and set-group-id bits of a mode.
pub(super) const SET_ID_BITS: u32 = 0o6000;
/// The extended attribute that holds a file's capabilities.
pub(super) const CAPABILITY_XATTR: &[u8] = b"security.capability";

pub(super) fn set_times(p: &Path, mtime_ns: i64) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    let times = [ts, ts];
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn set_xattr(p: &Path, name: &[u8], value: &[u8]) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes())?;
    let n = CString::new(name)?;
    // SAFETY: valid C strings and a value buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
