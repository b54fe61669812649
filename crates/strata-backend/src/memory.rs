//! A backend in memory: a sorted map of names to bytes. For tests and
//! scratch repositories; it obeys the same grammar and semantics as the
//! others (the conformance suite runs on it).

use crate::object::{check_name, check_prefix, Backend, BackendError, ObjectInfo, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default, Clone)]
pub struct MemoryBackend {
    objects: Arc<Mutex<BTreeMap<String, Arc<Vec<u8>>>>>,
}

impl MemoryBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Vec<u8>>>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for MemoryBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        check_name("write", name)?;
        self.map().insert(name.to_string(), Arc::new(data.to_vec()));
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        check_name("read", name)?;
        let o = self.map().get(name).cloned();
        o.map(|b| b.to_vec())
            .ok_or_else(|| BackendError::not_found("read", name))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        check_name("read", name)?;
        let o = self
            .map()
            .get(name)
            .cloned()
            .ok_or_else(|| BackendError::not_found("read", name))?;
        crate::object::slice_range(name, &o, offset, len)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_prefix(prefix)?;
        Ok(self
            .map()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectInfo {
                name: k.clone(),
                size: v.len() as u64,
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        check_name("delete", name)?;
        self.map().remove(name);
        Ok(())
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        check_name("stat", name)?;
        Ok(self.map().get(name).map(|o| o.len() as u64))
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
