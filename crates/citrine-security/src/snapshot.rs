//! The users and roles as text, one line each: what a node keeps in its
//! work directory (`security.smd`) and pushes to the other members.
//!
//! `user:<name>;password=<stored hash>;roles=<r1>,<r2>` and
//! `role:<name>;privileges=<code>.<ns>.<set>,...;whitelist=<a>|<b>;read-quota=<n>;write-quota=<n>`,
//! `external:<name>;roles=<r1>,<r2>;until=<ms>` (an LDAP user, see
//! [`crate::External`]) and `key:bGRhcA;secret=<bytes>[;used=1]` (the key
//! LDAP tokens are signed with, once a node has one; `used=1` once a token
//! was signed with it), every name, namespace, set,
//! allow-list entry and secret in URL-safe base64 (so no separator can
//! appear inside one). Sessions are not in it.
//!
//! Invariant: [`from_text`] of [`to_text`] gives back the same users and
//! roles; a line that does not parse fails the whole text (a store is taken
//! whole or not at all).

use crate::{External, Privilege, PrivilegeCode, Role, Security, User};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use std::collections::BTreeSet;

fn enc(text: &str) -> String {
    B64.encode(text)
}

fn dec(text: &str) -> Result<String, String> {
    let bytes = B64
        .decode(text)
        .map_err(|_| format!("bad base64 {text:?}"))?;
    String::from_utf8(bytes).map_err(|_| format!("bad UTF-8 in {text:?}"))
}

fn list(items: impl Iterator<Item = String>, separator: &str) -> String {
    items.collect::<Vec<_>>().join(separator)
}

/// Every user and role, one line each (users first, by name).
pub fn to_text(security: &Security) -> String {
    let mut text = String::new();
    for (name, user) in security.users() {
        let roles = list(user.roles.iter().map(|role| enc(role)), ",");
        text += &format!(
            "user:{};password={};roles={roles}\n",
            enc(name),
            user.password
        );
    }
    for (name, role) in security.roles() {
        let privileges = list(
            role.privileges
                .iter()
                .map(|p| format!("{}.{}.{}", p.code as u8, enc(&p.namespace), enc(&p.set))),
            ",",
        );
        let whitelist = list(role.whitelist.iter().map(|entry| enc(entry)), ",");
        text += &format!(
            "role:{};privileges={privileges};whitelist={whitelist};read-quota={};write-quota={}\n",
            enc(name),
            role.read_quota,
            role.write_quota
        );
    }
    for (name, external) in security.external() {
        let roles = list(external.roles.iter().map(|role| enc(role)), ",");
        text += &format!(
            "external:{};roles={roles};until={}\n",
            enc(name),
            external.until_ms
        );
    }
    if let Some(secret) = security.token_secret() {
        let used = if security.token_used() { ";used=1" } else { "" };
        text += &format!(
            "key:{};secret={}{used}\n",
            enc(TOKEN_KEY),
            B64.encode(secret)
        );
    }
    text
}

/// The name of the LDAP token key's line.
const TOKEN_KEY: &str = "ldap";

/// The users, roles, external users and token key of a text, in its order.
#[derive(Debug, Default)]
pub struct Parsed {
    pub users: Vec<(String, User)>,
    pub roles: Vec<(String, Role)>,
    pub external: Vec<(String, External)>,
    pub token_secret: Option<[u8; 32]>,
    /// Whether `token_secret` has signed a token.
    pub token_used: bool,
}

/// What a text [`to_text`] made holds.
pub fn from_text(text: &str) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let (kind, rest) = line
            .split_once(':')
            .ok_or_else(|| format!("bad line {line:?}"))?;
        let mut parts = rest.split(';');
        let name = dec(parts.next().unwrap_or_default())?;
        let params: Vec<(&str, &str)> = parts.filter_map(|part| part.split_once('=')).collect();
        match kind {
            "user" => parsed.users.push((
                name,
                parse_user(param(&params, "password"), param(&params, "roles"))?,
            )),
            "role" => parsed.roles.push((name, parse_role(&params)?)),
            "external" => parsed.external.push((name, parse_external(&params)?)),
            "key" if name == TOKEN_KEY => {
                parsed.token_secret = Some(parse_key(&params)?);
                parsed.token_used = param(&params, "used") == "1";
            }
            _ => return Err(format!("bad line kind {kind:?}")),
        }
    }
    Ok(parsed)
}

fn parse_external(params: &[(&str, &str)]) -> Result<External, String> {
    let roles = items(param(params, "roles"))
        .map(dec)
        .collect::<Result<BTreeSet<_>, _>>()?;
    let until_ms = param(params, "until")
        .parse::<u64>()
        .map_err(|_| "bad until".to_owned())?;
    Ok(External { roles, until_ms })
}

fn parse_key(params: &[(&str, &str)]) -> Result<[u8; 32], String> {
    B64.decode(param(params, "secret"))
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| "bad token key secret".to_owned())
}

/// The value of `key` among `params` ("" when absent).
fn param<'t>(params: &[(&'t str, &'t str)], key: &str) -> &'t str {
    params
        .iter()
        .find(|(name, _)| *name == key)
        .map_or("", |(_, value)| value)
}

fn items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').filter(|item| !item.is_empty())
}

fn parse_user(password: &str, roles: &str) -> Result<User, String> {
    let roles = items(roles).map(dec).collect::<Result<BTreeSet<_>, _>>()?;
    Ok(User {
        password: password.to_string(),
        roles,
    })
}

fn parse_role(params: &[(&str, &str)]) -> Result<Role, String> {
    let privileges = items(param(params, "privileges"))
        .map(|item| {
            let mut pieces = item.split('.');
            let code = pieces.next().and_then(|code| code.parse::<u8>().ok());
            let code = code
                .and_then(PrivilegeCode::from_code)
                .ok_or_else(|| format!("bad privilege {item:?}"))?;
            let namespace = dec(pieces.next().unwrap_or_default())?;
            let set = dec(pieces.next().unwrap_or_default())?;
            Ok(Privilege {
                code,
                namespace,
                set,
            })
        })
        .collect::<Result<BTreeSet<_>, String>>()?;
    let whitelist = items(param(params, "whitelist"))
        .map(dec)
        .collect::<Result<Vec<_>, _>>()?;
    let quota = |key: &str| {
        param(params, key)
            .parse::<u32>()
            .map_err(|_| format!("bad {key}"))
    };
    Ok(Role {
        privileges,
        whitelist,
        read_quota: quota("read-quota")?,
        write_quota: quota("write-quota")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SecurityConfig;

    #[test]
    fn users_and_roles_round_trip_through_text() {
        let config = SecurityConfig {
            stored_cost: 4,
            enable_quotas: true,
            ..SecurityConfig::default()
        };
        let mut security = Security::new(config.clone(), [2; 16]);
        let role = Role {
            privileges: BTreeSet::from([
                Privilege {
                    code: PrivilegeCode::ReadWrite,
                    namespace: "test".into(),
                    set: "a.b,c;d".into(),
                },
                Privilege::global(PrivilegeCode::SysAdmin),
            ]),
            whitelist: vec!["10.0.0.0/8".into(), "::1".into()],
            read_quota: 7,
            write_quota: 0,
        };
        security.create_role("odd,name.x|y", role).expect("role");
        let credential = crate::password::client_hash("pw").expect("hash");
        security
            .create_user(
                "bob",
                credential.as_bytes(),
                &["odd,name.x|y".into(), "read".into()],
                [3; 16],
            )
            .expect("user");
        security.enable_ldap_tokens([9; 32], crate::TokenHash::Sha512);
        security
            .login_external("carol", &["read".into()], (None, 5), 120)
            .expect("external");
        let text = to_text(&security);
        let mut copy = Security::new(config, [4; 16]);
        copy.replace(from_text(&text).expect("parses"));
        assert_eq!(copy.external(), security.external());
        assert_eq!(copy.token_secret(), security.token_secret());
        assert!(copy.token_used());
        assert_eq!(copy.users(), security.users());
        assert_eq!(copy.roles(), security.roles());
        assert_eq!(to_text(&copy), text);
        assert!(from_text("user:!!;password=x;roles=").is_err());
        assert!(
            from_text("role:YQ;privileges=99..;whitelist=;read-quota=0;write-quota=0").is_err()
        );
    }
}
