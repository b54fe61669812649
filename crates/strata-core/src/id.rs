//! Typed ids of a repository's objects. A snapshot, a recipe and a recipe
//! part are named by a hash of their stored bytes (64 lowercase hex
//! digits); a data container by 16 random bytes. Every id read from a
//! repository or given by a user is parsed into its type, so a name that
//! could reach outside its object's path (`../`, a `/`, anything but hex)
//! is refused where it enters, and an id of one kind is never passed where
//! another's is meant.

use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Whether `s` is 64 lowercase hex digits.
fn is_hash_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Defines an id of 64 lowercase hex digits whose objects are `PREFIX` +
/// the id.
macro_rules! hash_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The prefix of the names of the objects it names.
            pub const PREFIX: &'static str = $prefix;

            /// Parses an id: 64 lowercase hex digits.
            pub fn parse(s: &str) -> Result<Self> {
                match is_hash_hex(s) {
                    true => Ok($name(s.to_string())),
                    false => Err(CoreError::BadId {
                        what: $what,
                        id: s.chars().take(80).collect(),
                    }),
                }
            }

            /// The id of the object whose hash is `h`.
            pub fn of_hash(h: &blake3::Hash) -> Self {
                $name(h.to_hex().to_string())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The name of the object it names.
            pub fn object_name(&self) -> String {
                format!("{}{}", $prefix, self.0)
            }

            /// The id in object name `name`, if it names such an object.
            pub fn from_object_name(name: &str) -> Option<Self> {
                Self::parse(name.strip_prefix($prefix)?).ok()
            }

            /// Its first 8 digits, as people are shown it.
            pub fn short(&self) -> &str {
                &self.0[..8]
            }
        }

        impl TryFrom<String> for $name {
            type Error = CoreError;
            fn try_from(s: String) -> Result<Self> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = CoreError;
            fn from_str(s: &str) -> Result<Self> {
                Self::parse(s)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, o: &str) -> bool {
                self.0 == o
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, o: &&str) -> bool {
                self.0 == *o
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, o: &String) -> bool {
                &self.0 == o
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

hash_id!(
    /// A snapshot's id: the hash of its sealed object (`snapshots/ID`).
    SnapshotId,
    "snapshots/",
    "snapshot"
);

hash_id!(
    /// A recipe's id: the hash of its sealed index object (`recipes/ID`).
    RecipeId,
    "recipes/",
    "recipe"
);

hash_id!(
    /// A recipe part's id: the keyed hash of its bytes (`parts/ID`).
    PartId,
    "parts/",
    "recipe part"
);

/// Identity of a data container (random, never reused).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerId(pub [u8; 16]);

impl ContainerId {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let v = hex::decode(s).ok()?;
        Some(ContainerId(v.try_into().ok()?))
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "C({})", self.to_hex())
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only 64 lowercase hex digits are an id; anything that could reach
    /// outside an object's path is refused; the encoding is a string's.
    #[test]
    fn ids_parse_only_hash_hex() {
        let good = "ab".repeat(32);
        let id = SnapshotId::parse(&good).unwrap();
        assert_eq!(id.object_name(), format!("snapshots/{good}"));
        assert_eq!(
            SnapshotId::from_object_name(&id.object_name()),
            Some(id.clone())
        );
        assert_eq!(RecipeId::from_object_name(&id.object_name()), None);
        assert_eq!(id.short(), "abababab");
        for bad in [
            "".to_string(),
            "ab".repeat(31),
            "AB".repeat(32),
            format!("../{}", "a".repeat(61)),
            format!("{}/", "a".repeat(63)),
            "g".repeat(64),
        ] {
            assert!(PartId::parse(&bad).is_err(), "{bad:?}");
        }
        let enc = postcard::to_allocvec(&id).unwrap();
        assert_eq!(enc, postcard::to_allocvec(&good).unwrap());
        let back: SnapshotId = postcard::from_bytes(&enc).unwrap();
        assert_eq!(back, id);
        let evil = postcard::to_allocvec(&"../x".to_string()).unwrap();
        assert!(postcard::from_bytes::<RecipeId>(&evil).is_err());
    }
}
