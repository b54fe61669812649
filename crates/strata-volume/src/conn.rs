//! A connection's stream, whatever carries it: TCP, a Unix socket, or
//! the plaintext side of TLS.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connection's stream (TCP, Unix, or the plaintext side of TLS).
pub(crate) trait Conn: Read + Write + Send + 'static {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>>;
    fn set_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    /// Ends both directions (a thread blocked reading it returns).
    fn shutdown(&self);
}
impl Conn for TcpStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, std::net::Shutdown::Both);
    }
}
impl Conn for UnixStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
    fn shutdown(&self) {
        let _ = UnixStream::shutdown(self, std::net::Shutdown::Both);
    }
}
