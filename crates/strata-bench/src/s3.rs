//! A real S3 server on loopback for the `+s3` systems (`strata-INDEX+s3`,
//! `restic+s3`): versitygw with its posix backend, its data in the run's
//! work directory, so each bucket is a directory whose size the runner
//! measures like any repository's. Started by the runner when a system
//! asks for it, stopped when the run ends (`scripts/s3-server install`
//! installs versitygw).

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "strata";
pub const SECRET_KEY: &str = "strata-secret";

/// Where the `+s3` systems keep their repositories.
#[derive(Clone, Debug)]
pub struct S3Target {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The server's data directory: bucket `B` is `data/B`.
    pub data: PathBuf,
}

impl S3Target {
    /// The bucket of system `name` (letters, digits and `-` only).
    pub fn bucket(name: &str) -> String {
        let s: String = name
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!("bench-{s}")
    }

    pub fn bucket_dir(&self, name: &str) -> PathBuf {
        self.data.join(Self::bucket(name))
    }

    /// The credentials and endpoint, as environment variables.
    pub fn env(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_DEFAULT_REGION", "us-east-1".to_string()),
        ]
    }
}

/// A running versitygw; killed when dropped.
pub struct S3Server {
    child: Child,
    pub target: S3Target,
}

fn versitygw() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("versitygw"))
                .collect()
        })
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("HOME") {
        c.push(Path::new(&h).join("go/bin/versitygw"));
    }
    c.into_iter().find(|p| p.is_file())
}

impl S3Server {
    /// Starts a server with its data (and log) in `dir`.
    pub fn start(dir: &Path) -> Result<Self> {
        let bin = versitygw().ok_or_else(|| {
            anyhow!("the +s3 systems need versitygw: run `scripts/s3-server install`")
        })?;
        let data = dir.join("data");
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(&data)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.join("versitygw.log"))?;
        let child = Command::new(&bin)
            .env("ROOT_ACCESS_KEY", ACCESS_KEY)
            .env("ROOT_SECRET_KEY", SECRET_KEY)
            .args(["--port", &format!("127.0.0.1:{port}"), "--quiet", "posix"])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut s = S3Server {
            child,
            target: S3Target {
                endpoint: format!("http://127.0.0.1:{port}"),
                data,
            },
        };
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = s.child.try_wait() {
                bail!(
                    "versitygw exited at start ({st}); see {}/versitygw.log",
                    dir.display()
                );
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("versitygw did not listen on port {port} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("S3 server (versitygw) at {}", s.target.endpoint);
        Ok(s)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_are_valid() {
        assert_eq!(
            S3Target::bucket("strata-segment+s3"),
            "bench-strata-segment-s3"
        );
        assert_eq!(S3Target::bucket("restic+s3"), "bench-restic-s3");
    }
}
