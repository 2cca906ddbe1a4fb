//! Key → digest, exactly as the official clients compute it: RIPEMD-160 over
//! the set name, one byte of key particle type, and the key bytes (integers
//! and doubles as 8 bytes big-endian, strings as UTF-8, blobs raw). The
//! namespace is not part of the digest.

use citrine_types::{Digest, ParticleType};
use ripemd::{Digest as _, Ripemd160};

/// A user key as the clients send it in field 2 (or compute the digest from).
#[derive(Clone, Debug, PartialEq)]
pub enum UserKey {
    Integer(i64),
    Float(f64),
    String(String),
    Blob(Vec<u8>),
}

impl UserKey {
    /// The particle type byte of this key.
    pub fn particle_type(&self) -> ParticleType {
        match self {
            UserKey::Integer(_) => ParticleType::Integer,
            UserKey::Float(_) => ParticleType::Float,
            UserKey::String(_) => ParticleType::String,
            UserKey::Blob(_) => ParticleType::Blob,
        }
    }

    /// The key's value bytes as hashed and as sent on the wire.
    pub fn value_bytes(&self) -> Vec<u8> {
        match self {
            UserKey::Integer(value) => value.to_be_bytes().to_vec(),
            UserKey::Float(value) => value.to_bits().to_be_bytes().to_vec(),
            UserKey::String(value) => value.as_bytes().to_vec(),
            UserKey::Blob(value) => value.clone(),
        }
    }

    /// Field-2 encoding: particle type byte then value bytes.
    pub fn to_field(&self) -> Vec<u8> {
        let mut out = vec![self.particle_type() as u8];
        out.extend_from_slice(&self.value_bytes());
        out
    }

    /// Decodes a field-2 payload (the inverse of [`UserKey::to_field`]).
    /// `None` for an unknown particle type or a number that is not 8 bytes.
    pub fn from_field(data: &[u8]) -> Option<UserKey> {
        let (&particle, value) = data.split_first()?;
        let word = || -> Option<[u8; 8]> { value.try_into().ok() };
        Some(match particle {
            p if p == ParticleType::Integer as u8 => UserKey::Integer(i64::from_be_bytes(word()?)),
            p if p == ParticleType::Float as u8 => {
                UserKey::Float(f64::from_bits(u64::from_be_bytes(word()?)))
            }
            p if p == ParticleType::String as u8 => {
                UserKey::String(String::from_utf8(value.to_vec()).ok()?)
            }
            p if p == ParticleType::Blob as u8 => UserKey::Blob(value.to_vec()),
            _ => return None,
        })
    }
}

/// Computes the digest from the raw pieces.
pub fn compute(set: &[u8], key_particle_type: u8, key_bytes: &[u8]) -> Digest {
    let mut hasher = Ripemd160::new();
    hasher.update(set);
    hasher.update([key_particle_type]);
    hasher.update(key_bytes);
    let output = hasher.finalize();
    let mut digest = [0u8; 20];
    digest.copy_from_slice(&output);
    Digest(digest)
}

/// Computes the digest of a user key in a set (empty set name for none).
pub fn of_key(set: &str, key: &UserKey) -> Digest {
    compute(
        set.as_bytes(),
        key.particle_type() as u8,
        &key.value_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(digest: Digest) -> String {
        digest.to_hex()
    }

    #[test]
    fn client_test_vectors() {
        assert_eq!(
            hex(of_key("set", &UserKey::Integer(0))),
            "93d943aae37b017ad7e011b0c1d2e2143c2fb37d"
        );
        assert_eq!(
            hex(of_key("set", &UserKey::Integer(-1))),
            "22116d253745e29fc63fdf760b6e26f7e197e01d"
        );
        assert_eq!(
            hex(of_key("set", &UserKey::String(String::new()))),
            "2819b1ff6e346a43b4f5f6b77a88bc3eaac22a83"
        );
        assert_eq!(
            hex(of_key("set", &UserKey::String("s".into()))),
            "607cddba7cd111745ef0a3d783d57f0e83c8f311"
        );
        let digest = of_key("demo", &UserKey::String("key1".into()));
        assert_eq!(hex(digest), "ec91192d4b7f8ce35d5d78d34bca65cbaaaac960");
        assert_eq!(digest.partition().get(), 492);
    }

    #[test]
    fn key_fields_round_trip() {
        for key in [
            UserKey::Integer(-7),
            UserKey::Float(2.5),
            UserKey::String("k".into()),
            UserKey::Blob(vec![0, 255]),
        ] {
            assert_eq!(UserKey::from_field(&key.to_field()), Some(key));
        }
        assert_eq!(UserKey::from_field(&[]), None);
        assert_eq!(UserKey::from_field(&[1, 0, 0]), None, "short integer");
        assert_eq!(UserKey::from_field(&[3, 0xff]), None, "not UTF-8");
        assert_eq!(UserKey::from_field(&[9, 1]), None, "unknown particle type");
    }
}
