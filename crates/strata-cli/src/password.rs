//! Where passwords come from: `--password-file`, `--password-command`
//! (`$STRATA_PASSWORD_COMMAND`), `$STRATA_PASSWORD`, or a prompt on a
//! terminal — in that order, as restic takes them. The library never reads
//! the environment; it is handed the bytes.

use std::io::IsTerminal;
use std::path::Path;
use strata_store::StoreError;

/// Where one password may come from, in order.
pub(crate) struct Sources<'a> {
    pub file: Option<&'a Path>,
    pub command: Option<&'a str>,
    /// The environment variable holding it.
    pub env: &'static str,
    /// The flags that give it, for the error message.
    pub flags: &'static str,
    pub question: &'static str,
}

impl Sources<'_> {
    pub(crate) fn read(&self, confirm: bool) -> Result<Vec<u8>, StoreError> {
        if let Some(f) = self.file {
            return from_file(f);
        }
        if let Some(c) = self.command {
            return from_command(c);
        }
        if let Ok(p) = std::env::var(self.env) {
            return Ok(p.into_bytes());
        }
        prompt(self.question, confirm).unwrap_or_else(|| {
            Err(StoreError::Invalid(format!(
                "the repository is encrypted: set ${}, use {}, or run on a terminal",
                self.env, self.flags
            )))
        })
    }
}

/// A new password (`strata key add|passwd`): `--new-password-file`,
/// `$STRATA_NEW_PASSWORD`, or a prompt asked twice.
pub(crate) fn read_new_password(file: Option<&Path>) -> Result<Vec<u8>, StoreError> {
    if let Some(f) = file {
        return from_file(f);
    }
    if let Ok(p) = std::env::var("STRATA_NEW_PASSWORD") {
        return Ok(p.into_bytes());
    }
    prompt("new password: ", true).unwrap_or_else(|| {
        Err(StoreError::Invalid(
            "no new password: use --new-password-file, set $STRATA_NEW_PASSWORD, or run on a terminal".into(),
        ))
    })
}

fn from_file(f: &Path) -> Result<Vec<u8>, StoreError> {
    let s = std::fs::read_to_string(f).map_err(|e| {
        StoreError::Invalid(format!(
            "cannot read the password file {}: {e}",
            f.display()
        ))
    })?;
    Ok(s.lines().next().unwrap_or("").as_bytes().to_vec())
}

fn from_command(cmd: &str) -> Result<Vec<u8>, StoreError> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| StoreError::Invalid(format!("cannot run the password command: {e}")))?;
    if !out.status.success() {
        return Err(StoreError::Invalid(format!(
            "the password command failed ({})",
            out.status
        )));
    }
    let first = out.stdout.split(|b| *b == b'\n').next().unwrap_or(&[]);
    Ok(first.strip_suffix(b"\r").unwrap_or(first).to_vec())
}

/// Asks on the terminal, or `None` when there is none.
fn prompt(question: &str, confirm: bool) -> Option<Result<Vec<u8>, StoreError>> {
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return None;
    }
    let ask =
        |q: &str| rpassword::prompt_password(q).map_err(|e| StoreError::io("read", "password", e));
    Some((|| {
        let p = ask(question)?;
        if confirm && ask("repeat password: ")? != p {
            return Err(StoreError::Invalid("passwords do not match".into()));
        }
        Ok(p.into_bytes())
    })())
}
