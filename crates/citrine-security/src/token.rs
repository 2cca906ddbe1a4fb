//! Access tokens of external (LDAP) users: self-contained and signed, so
//! that any node of the cluster holding the shared key accepts a token
//! another node issued, without asking the directory again (the
//! reference's LDAP tokens, "validated by verifying the timestamp and the
//! HMAC"; `token-hash-method` names the HMAC's hash).
//!
//! Layout: `'L'`, the hash's code (1: SHA-256, 2: SHA-512), the expiry in
//! Unix milliseconds (8 bytes, big-endian), the user name's length (1
//! byte) and bytes, then the HMAC of everything before it under the key.
//!
//! Invariants: [`open`] gives a user and expiry only for a token whose
//! HMAC verifies under the key (compared in constant time); a token of any
//! other shape, or one cut short, opens to nothing and never panics.

use ring::hmac;

/// The first byte of every token.
const MARK: u8 = b'L';
/// Bytes before the user name: mark, hash code, expiry, name length.
const HEAD: usize = 1 + 1 + 8 + 1;

/// The hash of a token's HMAC (`token-hash-method`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenHash {
    #[default]
    Sha256,
    Sha512,
}

impl TokenHash {
    /// The reference's name: `sha-256` or `sha-512`.
    pub fn name(self) -> &'static str {
        match self {
            TokenHash::Sha256 => "sha-256",
            TokenHash::Sha512 => "sha-512",
        }
    }

    /// The hash a configuration value names.
    pub fn from_name(name: &str) -> Option<TokenHash> {
        match name {
            "sha-256" => Some(TokenHash::Sha256),
            "sha-512" => Some(TokenHash::Sha512),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            TokenHash::Sha256 => 1,
            TokenHash::Sha512 => 2,
        }
    }

    fn from_code(code: u8) -> Option<TokenHash> {
        match code {
            1 => Some(TokenHash::Sha256),
            2 => Some(TokenHash::Sha512),
            _ => None,
        }
    }

    fn algorithm(self) -> hmac::Algorithm {
        match self {
            TokenHash::Sha256 => hmac::HMAC_SHA256,
            TokenHash::Sha512 => hmac::HMAC_SHA512,
        }
    }
}

/// A token for `user` valid until `expires_ms`, signed with `key`
/// (`user` is at most [`crate::NAME_MAX`] bytes: longer names are cut,
/// and such a user cannot exist).
pub fn sign(key: &[u8], hash: TokenHash, user: &str, expires_ms: u64) -> Vec<u8> {
    let name = &user.as_bytes()[..user.len().min(usize::from(u8::MAX))];
    let mut token = Vec::with_capacity(HEAD + name.len() + 64);
    token.push(MARK);
    token.push(hash.code());
    token.extend_from_slice(&expires_ms.to_be_bytes());
    token.push(name.len() as u8);
    token.extend_from_slice(name);
    let tag = hmac::sign(&hmac::Key::new(hash.algorithm(), key), &token);
    token.extend_from_slice(tag.as_ref());
    token
}

/// The user and expiry of `token`, if it is one [`sign`] made with `key`.
pub fn open(key: &[u8], token: &[u8]) -> Option<(String, u64)> {
    if token.len() < HEAD || token[0] != MARK {
        return None;
    }
    let hash = TokenHash::from_code(token[1])?;
    let expires_ms = u64::from_be_bytes(token[2..10].try_into().ok()?);
    let signed = HEAD + usize::from(token[10]);
    let (body, tag) = (token.get(..signed)?, token.get(signed..)?);
    hmac::verify(&hmac::Key::new(hash.algorithm(), key), body, tag).ok()?;
    let user = String::from_utf8(body[HEAD..].to_vec()).ok()?;
    Some((user, expires_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_under_its_key_and_whole() {
        for hash in [TokenHash::Sha256, TokenHash::Sha512] {
            let token = sign(&[7; 32], hash, "alice", 1_234);
            assert_eq!(open(&[7; 32], &token), Some(("alice".to_owned(), 1_234)));
            assert_eq!(open(&[8; 32], &token), None, "another key");
            for cut in 0..token.len() {
                assert_eq!(open(&[7; 32], &token[..cut]), None, "cut at {cut}");
            }
            let mut forged = token.clone();
            forged[5] ^= 1; // a later expiry
            assert_eq!(open(&[7; 32], &forged), None);
        }
        assert_eq!(
            sign(&[7; 32], TokenHash::Sha512, "a", 1).len(),
            HEAD + 1 + 64
        );
        assert_eq!(TokenHash::from_name("sha-512"), Some(TokenHash::Sha512));
        assert_eq!(TokenHash::from_name("md5"), None);
    }
}
