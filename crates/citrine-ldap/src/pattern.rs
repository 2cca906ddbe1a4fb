//! The `security.ldap` patterns and what comes back: `${un}` (the user's
//! name) and `${dn}` (its distinguished name) put into a DN pattern or a
//! search filter, and role names read from the DNs the directory returns.
//!
//! Invariants: a substituted value is always escaped for where it goes
//! (RFC 4514 in a DN, RFC 4515 in a filter), so a user name cannot change
//! the shape of a DN or a filter; a role name is the value of a DN's first
//! component, unescaped.

use ldap3::{dn_escape, ldap_escape};

/// `pattern` with `${un}` replaced by `user`, escaped as a DN value.
pub fn user_dn(pattern: &str, user: &str) -> String {
    pattern.replace("${un}", &dn_escape(user))
}

/// `pattern` with `${un}` and `${dn}` replaced by `user` and `dn`, escaped
/// as filter values.
pub fn filter(pattern: &str, user: &str, dn: &str) -> String {
    pattern
        .replace("${un}", &ldap_escape(user))
        .replace("${dn}", &ldap_escape(dn))
}

/// The components of `dn`, each as (attribute, value), value unescaped;
/// commas inside a value (escaped as `\,`) do not split it.
fn components(dn: &str) -> Vec<(String, String)> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in dn.chars() {
        match (escaped, c) {
            (true, _) => {
                current.push('\\');
                current.push(c);
                escaped = false;
            }
            (false, '\\') => escaped = true,
            (false, ',') => parts.push(std::mem::take(&mut current)),
            (false, _) => current.push(c),
        }
    }
    parts.push(current);
    parts
        .iter()
        .filter_map(|part| {
            let (attribute, value) = part.split_once('=')?;
            Some((
                attribute.trim().to_ascii_lowercase(),
                unescape_dn(value.trim()),
            ))
        })
        .collect()
}

/// Undoes RFC 4514 escapes: `\` and two hex digits is that byte, `\`
/// and another character is that character.
fn unescape_dn(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[at], hex) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (b'\\', None) if at + 1 < bytes.len() => {
                out.push(bytes[at + 1]);
                at += 2;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The role a group's `dn` names: the value of its first component
/// (`cn=read-write,ou=groups,dc=x` → `read-write`).
pub fn role_of_group(dn: &str) -> Option<String> {
    components(dn)
        .into_iter()
        .next()
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// The organizational units in a user's `dn` (`role-query-search-ou`):
/// each `ou=` component's value.
pub fn units_of(dn: &str) -> Vec<String> {
    components(dn)
        .into_iter()
        .filter(|(attribute, _)| attribute == "ou")
        .map(|(_, value)| value)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_where_they_go() {
        assert_eq!(
            user_dn("uid=${un},ou=users,dc=x", "a,b=c"),
            "uid=a\\2cb\\3dc,ou=users,dc=x"
        );
        assert_eq!(
            filter("(&(uid=${un})(member=${dn}))", "*)(uid=*", "uid=a,dc=x"),
            "(&(uid=\\2a\\29\\28uid=\\2a)(member=uid=a,dc=x))"
        );
    }

    #[test]
    fn roles_are_the_first_component_of_a_group() {
        assert_eq!(
            role_of_group("cn=read-write,ou=groups,dc=x").as_deref(),
            Some("read-write")
        );
        assert_eq!(role_of_group("CN=a\\,b,ou=groups").as_deref(), Some("a,b"));
        assert_eq!(role_of_group("cn=a\\2cb,dc=x").as_deref(), Some("a,b"));
        assert_eq!(role_of_group(""), None);
        assert_eq!(
            units_of("uid=a,ou=readers,OU=people,dc=x"),
            vec!["readers".to_owned(), "people".to_owned()]
        );
    }
}
