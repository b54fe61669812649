//! `strata key list|add|passwd|remove`: the key slots of an encrypted
//! repository (the master key stays; each slot wraps it with a password).
//! A cloud tier attached to the repository gets the same slots, so the
//! bucket alone still opens with the current passwords.

use crate::cli::{open, Cli};
use crate::output::{fmt_time, Out};
use crate::password::read_new_password;
use anyhow::Result;
use clap::Subcommand;
use serde_json::json;
use std::path::PathBuf;
use strata_store::{repo::keys, Repository};

#[derive(Subcommand)]
pub enum KeyCmd {
    /// List the key slots (`*` marks the one your password opened).
    List,
    /// Add a password: a new slot for the same master key.
    Add {
        /// Read the new password from this file (first line); else
        /// $STRATA_NEW_PASSWORD, else a prompt.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
    /// Change the password of the slot your password opened.
    Passwd {
        /// Read the new password from this file (first line); else
        /// $STRATA_NEW_PASSWORD, else a prompt.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
    /// Remove a key slot by id (a unique prefix will do); not the one in
    /// use, not the last.
    Remove {
        /// The slot's id, as `strata key list` shows it.
        id: String,
    },
}

pub fn run(cli: &Cli, out: &Out, cmd: &KeyCmd) -> Result<i32> {
    let repo = open(cli)?;
    match cmd {
        KeyCmd::List => {
            let list = keys::list(&repo)?;
            out.result(&serde_json::to_value(&list)?, || {
                let mut t = format!("  {:<34} {:<12} {:<20} created", "id", "user", "host");
                for k in &list {
                    t += &format!(
                        "\n{} {:<34} {:<12} {:<20} {}",
                        if k.current { '*' } else { ' ' },
                        k.id,
                        k.user,
                        k.host,
                        match (&k.damaged, k.created_ns) {
                            (Some(e), _) => format!("DAMAGED: {e}"),
                            (None, 0) => "-".into(),
                            (None, t) => fmt_time(t),
                        }
                    );
                }
                t
            });
        }
        KeyCmd::Add { new_password_file } => {
            let pw = zeroize::Zeroizing::new(read_new_password(new_password_file.as_deref())?);
            let id = keys::add(&repo, &pw)?;
            sync_cloud(out, &repo);
            out.result(&json!({"added": id}), || format!("added key {id}"));
        }
        KeyCmd::Passwd { new_password_file } => {
            let pw = zeroize::Zeroizing::new(read_new_password(new_password_file.as_deref())?);
            let id = keys::passwd(&repo, &pw)?;
            sync_cloud(out, &repo);
            out.result(&json!({"added": id}), || {
                format!("password changed (now key {id})")
            });
        }
        KeyCmd::Remove { id } => {
            let gone = keys::remove(&repo, id)?;
            sync_cloud(out, &repo);
            out.result(&json!({"removed": gone}), || format!("removed key {gone}"));
        }
    }
    Ok(0)
}

/// The cloud tier's bucket takes the repository's slots; a failure is a
/// warning (the local change stands; the next key command retries).
fn sync_cloud(out: &Out, repo: &Repository) {
    let res = (|| -> Result<()> {
        if strata_store::tier::attached(repo)?.is_some() {
            let cloud = crate::cli::tiers(repo).cloud()?;
            keys::sync_slots(repo.backend(), cloud.backend())?;
        }
        Ok(())
    })();
    if let Err(e) = res {
        out.warn(&format!(
            "the cloud tier's bucket keeps its old keys: {e:#}; run the key command again to retry"
        ));
    }
}
