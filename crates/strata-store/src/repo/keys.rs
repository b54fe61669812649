//! Key slots of an encrypted repository (`strata key …`): the master key
//! never changes; each slot (`keys/ID`, a [`KeySlot`]) wraps it with one
//! password. Opening tries `keys/default` first, then the others, so any
//! slot's password opens the repository; changing a password adds a slot
//! and removes the old one, re-encrypting nothing.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use std::sync::Arc;
use strata_core::crypto::{random_bytes, KdfCost, KeyFile, Kind, MasterKey, Sealer};
use strata_core::format::{decode_key_slot, encode_key_slot, KeySlot};
use strata_core::CoreError;

/// One key slot as `strata key list` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KeyInfo {
    /// The slot's id (`default` for the one `init` made).
    pub id: String,
    pub host: String,
    pub user: String,
    /// When it was added (0: before slots recorded it).
    pub created_ns: i64,
    /// The slot the current password opened.
    pub current: bool,
    /// Why the slot cannot be read, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// Wraps `mk` with `password` into the slot object `name`.
pub(crate) fn write_slot(
    backend: &Arc<dyn Backend>,
    name: &str,
    mk: &MasterKey,
    password: &[u8],
    cost: KdfCost,
) -> Result<()> {
    let slot = KeySlot {
        key: KeyFile::wrap(mk, password, cost)?,
        host: crate::repo::lock::hostname(),
        user: crate::repo::lock::username(),
        created_ns: now_ns(),
    };
    let env = Sealer::plain(3).seal(Kind::Key, &encode_key_slot(&slot)?, false)?;
    backend.put(name, &env)?;
    Ok(())
}

fn read_slot(backend: &Arc<dyn Backend>, name: &str) -> Result<KeySlot> {
    let raw = backend.get(name)?;
    let bytes = Sealer::plain(3)
        .open(Kind::Key, &raw)
        .map_err(|e| StoreError::corrupt(name, e))?;
    decode_key_slot(&bytes).map_err(|e| StoreError::corrupt(name, e))
}

/// Slot object names, `keys/default` first.
fn slot_names(backend: &Arc<dyn Backend>) -> Result<Vec<String>> {
    let mut names: Vec<String> = backend.list("keys/")?.into_iter().map(|o| o.name).collect();
    names.sort_by_key(|n| (n != "keys/default", n.clone()));
    Ok(names)
}

/// The master key `password` unwraps, and the slot that held it.
pub(crate) fn unlock(backend: &Arc<dyn Backend>, password: &[u8]) -> Result<(MasterKey, String)> {
    let names = slot_names(backend)?;
    if names.is_empty() {
        return Err(StoreError::Invalid(
            "the repository is encrypted but has no key slot (keys/ is empty): it cannot be opened"
                .into(),
        ));
    }
    let mut damaged = Vec::new();
    let mut refused = false;
    let mut failed = None;
    for name in names {
        let slot = match read_slot(backend, &name) {
            Ok(s) => s,
            Err(e) => {
                // One damaged slot must not lock out the others.
                damaged.push(format!("{name}: {e}"));
                continue;
            }
        };
        match slot.key.unwrap_key(password) {
            Ok(mk) => return Ok((mk, name)),
            Err(CoreError::WrongPassword) => refused = true,
            // A slot whose parameters this build cannot use: try the rest.
            Err(e) => failed = Some(StoreError::from(e)),
        }
    }
    for d in &damaged {
        tracing::warn!("key slot {d} (`strata key remove` drops it)");
    }
    if refused || damaged.is_empty() && failed.is_none() {
        return Err(StoreError::Core(CoreError::WrongPassword));
    }
    Err(failed.unwrap_or_else(|| {
        StoreError::Invalid(format!("no key slot can be read: {}", damaged.join("; ")))
    }))
}

fn master(repo: &Repository) -> Result<&(MasterKey, String)> {
    repo.key().ok_or_else(|| {
        StoreError::Invalid("the repository is not encrypted: it has no keys".into())
    })
}

/// Every slot (damaged ones are reported as errors).
pub fn list(repo: &Repository) -> Result<Vec<KeyInfo>> {
    let (_, current) = master(repo)?;
    let mut out = Vec::new();
    for name in slot_names(repo.backend())? {
        let id = name.trim_start_matches("keys/").to_string();
        let current = &name == current;
        out.push(match read_slot(repo.backend(), &name) {
            Ok(slot) => KeyInfo {
                id,
                host: slot.host,
                user: slot.user,
                created_ns: slot.created_ns,
                current,
                damaged: None,
            },
            Err(e) => KeyInfo {
                id,
                host: String::new(),
                user: String::new(),
                created_ns: 0,
                current,
                damaged: Some(e.to_string()),
            },
        });
    }
    Ok(out)
}

/// Adds a slot opened by `password`; returns its id.
pub fn add(repo: &Repository, password: &[u8]) -> Result<String> {
    let _lock = crate::repo::lock::acquire(repo, true, "key")?;
    add_locked(repo, password)
}

fn add_locked(repo: &Repository, password: &[u8]) -> Result<String> {
    let (mk, current) = master(repo)?;
    // As costly as the slot in use (set at init).
    let cost = read_slot(repo.backend(), current)?.key.kdf.cost();
    if password.is_empty() {
        return Err(StoreError::Invalid("the new password is empty".into()));
    }
    let mut id = [0u8; 16];
    random_bytes(&mut id)?;
    let id = hex::encode(id);
    write_slot(repo.backend(), &format!("keys/{id}"), mk, password, cost)?;
    Ok(id)
}

/// Removes slot `id` (a unique prefix will do). The slot in use and the
/// last slot are refused: either would lock everyone out.
pub fn remove(repo: &Repository, id: &str) -> Result<String> {
    let _lock = crate::repo::lock::acquire(repo, true, "key")?;
    let (_, current) = master(repo)?;
    let names = slot_names(repo.backend())?;
    still_there(&names, current)?;
    let m: Vec<&String> = names
        .iter()
        .filter(|n| n.trim_start_matches("keys/").starts_with(id) && !id.is_empty())
        .collect();
    let name = match m.as_slice() {
        [one] => *one,
        [] => {
            return Err(StoreError::Invalid(format!(
                "no key {id:?} (see `strata key list`)"
            )))
        }
        _ => {
            return Err(StoreError::Invalid(format!(
                "key id {id:?} is ambiguous: give more of it"
            )))
        }
    };
    if name == current {
        return Err(StoreError::Invalid(
            "this is the key your password opened: open with another key's password to remove it, or use `strata key passwd`".into(),
        ));
    }
    if names.len() < 2 {
        return Err(StoreError::Invalid("the last key cannot be removed".into()));
    }
    repo.backend().delete(name)?;
    Ok(name.trim_start_matches("keys/").to_string())
}

/// Refuses to change keys when the slot this process opened is gone
/// (another `key` command removed it meanwhile): removing any other slot
/// could then leave none.
fn still_there(names: &[String], current: &str) -> Result<()> {
    if names.iter().any(|n| n == current) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "the key this command opened ({current}) was removed meanwhile; open the repository again"
        )))
    }
}

/// Changes the password of the slot in use: a new slot first, then the
/// old one removed (a crash in between leaves both, never neither).
pub fn passwd(repo: &Repository, password: &[u8]) -> Result<String> {
    let _lock = crate::repo::lock::acquire(repo, true, "key")?;
    let (_, current) = master(repo)?;
    still_there(&slot_names(repo.backend())?, current)?;
    let id = add_locked(repo, password)?;
    repo.backend().delete(current)?;
    Ok(id)
}

/// Makes `to`'s key slots the same as `from`'s (a cloud tier opens with
/// the same passwords as its repository, for disaster recovery): copies
/// every slot, then removes slots `from` no longer has.
pub fn sync_slots(from: &Arc<dyn Backend>, to: &Arc<dyn Backend>) -> Result<usize> {
    let names = slot_names(from)?;
    for n in &names {
        to.put(n, &from.get(n)?)?;
    }
    for old in slot_names(to)? {
        if !names.contains(&old) {
            to.delete(&old)?;
        }
    }
    Ok(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InitOptions;

    fn open(b: &Arc<dyn Backend>, pw: &[u8]) -> Result<Repository> {
        let pw = pw.to_vec();
        Repository::open(b.clone(), &move || Ok(pw.clone()))
    }

    #[test]
    fn slots_add_open_change_and_remove() {
        let b: Arc<dyn Backend> = Arc::new(strata_backend::MemoryBackend::default());
        let opts = InitOptions {
            password: Some(b"one".to_vec()),
            kdf: KdfCost {
                memory_kib: 256,
                iterations: 1,
            },
            ..Default::default()
        };
        let repo = Repository::init(b.clone(), opts).unwrap();
        let two = add(&repo, b"two").unwrap();
        // Either password opens it; a third does not.
        assert!(open(&b, b"one").is_ok());
        let r2 = open(&b, b"two").unwrap();
        assert!(matches!(
            open(&b, b"three"),
            Err(StoreError::Core(CoreError::WrongPassword))
        ));
        let keys = list(&r2).unwrap();
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().any(|k| k.id == two && k.current));
        assert!(keys.iter().all(|k| k.created_ns > 0 && !k.host.is_empty()));
        // The slot in use is refused; the other goes.
        assert!(remove(&r2, &two[..6]).is_err());
        assert_eq!(remove(&r2, "default").unwrap(), "default");
        assert!(open(&b, b"one").is_err());
        // The last one stays; passwd swaps it.
        let new = passwd(&r2, b"three").unwrap();
        // New slots cost what the first did.
        assert!(list(&r2).is_ok());
        let slot = read_slot(&b, &format!("keys/{new}")).unwrap();
        assert_eq!(slot.key.kdf.cost().memory_kib, 256);
        assert!(open(&b, b"two").is_err());
        let r3 = open(&b, b"three").unwrap();
        assert_eq!(list(&r3).unwrap().len(), 1);
        assert!(remove(&r3, &new).is_err());
        // A damaged slot: the password still opens, a wrong one is still
        // a wrong password, and the list shows it.
        b.put("keys/00aa", b"garbage").unwrap();
        assert!(open(&b, b"three").is_ok());
        assert!(matches!(
            open(&b, b"nope"),
            Err(StoreError::Core(CoreError::WrongPassword))
        ));
        let l = list(&r3).unwrap();
        assert!(l.iter().any(|k| k.id == "00aa" && k.damaged.is_some()));
        assert_eq!(remove(&r3, "00aa").unwrap(), "00aa");
    }
}
