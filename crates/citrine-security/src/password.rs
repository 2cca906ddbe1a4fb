//! Passwords. Clients never send a clear password (internal auth): they send
//! the bcrypt hash of it with the fixed salt [`CLIENT_SALT`] (cost 10), both
//! when setting it (PASSWORD field) and when logging in (CREDENTIAL field).
//! That 60-character string is the secret; the server keeps only a bcrypt
//! hash of it, with a salt of its own ([`stored_hash`]), and checks a login
//! by verifying the credential against that ([`verify`]).
//!
//! Invariant: nothing here stores or logs the credential itself.

use base64::Engine;

/// The salt every client hashes passwords with (bcrypt `$2a$10$` + 22 chars).
pub const CLIENT_SALT: &str = "$2a$10$7EqJtq98hPqEX7fNZaFWoO";

/// Cost of the server-side hash of a credential.
pub const STORED_COST: u32 = 10;

/// The length of every bcrypt hash string.
pub const HASH_LEN: usize = 60;

/// The credential a client sends for `password`: bcrypt with the fixed salt.
pub fn client_hash(password: &str) -> Option<String> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::BCRYPT,
        base64::engine::GeneralPurposeConfig::new()
            .with_encode_padding(false)
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let salt = engine.decode(&CLIENT_SALT[7..]).ok()?;
    let salt: [u8; 16] = salt.get(..16)?.try_into().ok()?;
    let parts = bcrypt::hash_with_salt(password, 10, salt).ok()?;
    Some(parts.format_for_version(bcrypt::Version::TwoA))
}

/// Whether `credential` looks like what a client sends: a bcrypt hash string.
pub fn well_formed(credential: &[u8]) -> bool {
    credential.len() == HASH_LEN && credential.starts_with(b"$2")
}

/// What the server keeps for `credential`: bcrypt of it with `salt` (16
/// random bytes the caller draws) at `cost`.
pub fn stored_hash(credential: &[u8], salt: [u8; 16], cost: u32) -> Option<String> {
    bcrypt::hash_with_salt(credential, cost, salt)
        .ok()
        .map(|parts| parts.format_for_version(bcrypt::Version::TwoB))
}

/// Whether `credential` is the one `stored` was made from.
pub fn verify(credential: &[u8], stored: &str) -> bool {
    bcrypt::verify(credential, stored).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_hash_is_the_fixed_salt_bcrypt() {
        let hash = client_hash("admin").expect("hash");
        assert_eq!(hash.len(), HASH_LEN);
        assert!(hash.starts_with(CLIENT_SALT));
        // That it equals what the clients compute is shown end to end by
        // the Python client logging in as admin/admin (tests/security).
        assert_ne!(client_hash("admin2").expect("hash"), hash);
        assert!(well_formed(hash.as_bytes()));
    }

    #[test]
    fn stored_hash_verifies_only_its_credential() {
        let credential = client_hash("secret").expect("hash");
        let stored = stored_hash(credential.as_bytes(), [7; 16], 4).expect("stored");
        assert_ne!(stored, credential);
        assert!(verify(credential.as_bytes(), &stored));
        let other = client_hash("secreT").expect("hash");
        assert!(!verify(other.as_bytes(), &stored));
        assert!(!verify(credential.as_bytes(), "not a hash"));
    }
}
