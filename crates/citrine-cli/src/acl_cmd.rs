//! `citrine user` and `citrine role`: access control on a node with
//! security on (create, drop, grant, revoke, list; a user's password), and
//! the `-U USER -P PASSWORD` login other commands (`citrine info`) take.
//!
//! Owns the command-line form of a privilege: `CODE`, `CODE@NAMESPACE` or
//! `CODE@NAMESPACE.SET` (CODE a built-in role name such as `read-write`),
//! the same form the lists print. A refusal ends with the server's result
//! code and exit status 1.

use crate::{CliResult, HostArgs};
use citrine_client::admin::{self, Credentials};
use citrine_security::{Privilege, PrivilegeCode};
use citrine_wire::admin::{command, decode_privileges, decode_roles, field};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `-U USER -P PASSWORD`: log in before the command.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoginArgs {
    /// Log in as this user (a node with security on requires it).
    #[arg(short = 'U', long = "user", value_name = "USER")]
    pub user: Option<String>,
    /// The user's password.
    #[arg(
        short = 'P',
        long = "password",
        value_name = "PASSWORD",
        requires = "user"
    )]
    pub password: Option<String>,
}

impl LoginArgs {
    /// The credentials, when a user is given.
    pub fn credentials(&self) -> Option<Credentials> {
        Some(Credentials {
            user: self.user.clone()?,
            password: self.password.clone().unwrap_or_default(),
        })
    }
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  citrine user create alice s3cret read-write -U admin -P admin\n  \
                        citrine user grant alice udf-admin -U admin -P admin\n  \
                        citrine user list -U admin -P admin"
)]
pub struct UserArgs {
    #[command(subcommand)]
    pub command: UserCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user with a password and roles.
    #[command(disable_help_flag = true)]
    Create {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(value_name = "PASSWORD")]
        new_password: String,
        roles: Vec<String>,
    },
    /// Drop a user.
    #[command(disable_help_flag = true)]
    Drop {
        #[command(flatten)]
        on: On,
        name: String,
    },
    /// Set a user's password.
    #[command(disable_help_flag = true)]
    Password {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(value_name = "PASSWORD")]
        new_password: String,
    },
    /// Grant roles to a user.
    #[command(disable_help_flag = true)]
    Grant {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(required = true)]
        roles: Vec<String>,
    },
    /// Revoke roles from a user.
    #[command(disable_help_flag = true)]
    Revoke {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(required = true)]
        roles: Vec<String>,
    },
    /// List the users and their roles (or one user's).
    #[command(disable_help_flag = true)]
    List {
        #[command(flatten)]
        on: On,
        name: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Privileges: CODE, CODE@NAMESPACE or CODE@NAMESPACE.SET, e.g. read@test.demo\n\
                        Examples:\n  citrine role create demo-writer read-write@test.demo -U admin -P admin\n  \
                        citrine role list -U admin -P admin"
)]
pub struct RoleArgs {
    #[command(subcommand)]
    pub command: RoleCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum RoleCommand {
    /// Create a role with privileges.
    #[command(disable_help_flag = true)]
    Create {
        #[command(flatten)]
        on: On,
        name: String,
        privileges: Vec<String>,
    },
    /// Drop a role (revoked from every user).
    #[command(disable_help_flag = true)]
    Drop {
        #[command(flatten)]
        on: On,
        name: String,
    },
    /// Grant privileges to a role.
    #[command(disable_help_flag = true)]
    Grant {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(required = true)]
        privileges: Vec<String>,
    },
    /// Revoke privileges from a role.
    #[command(disable_help_flag = true)]
    Revoke {
        #[command(flatten)]
        on: On,
        name: String,
        #[arg(required = true)]
        privileges: Vec<String>,
    },
    /// List the roles and their privileges (or one role's).
    #[command(disable_help_flag = true)]
    List {
        #[command(flatten)]
        on: On,
        name: Option<String>,
    },
}

/// Where to send the command and as whom.
#[derive(clap::Args, Debug)]
pub struct On {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub login: LoginArgs,
}

/// Parses `CODE`, `CODE@NS` or `CODE@NS.SET`.
pub fn parse_privilege(text: &str) -> Result<Privilege, String> {
    let (code, scope) = text.split_once('@').unwrap_or((text, ""));
    let code =
        PrivilegeCode::from_name(code).ok_or_else(|| format!("unknown privilege {code:?}"))?;
    let (namespace, set) = scope.split_once('.').unwrap_or((scope, ""));
    if !scope.is_empty() && !code.scoped() {
        return Err(format!("{} is global only: no @NAMESPACE", code.name()));
    }
    Ok(Privilege {
        code,
        namespace: namespace.into(),
        set: set.into(),
    })
}

/// The command-line form of a privilege.
pub fn show_privilege(privilege: &Privilege) -> String {
    match (privilege.namespace.as_str(), privilege.set.as_str()) {
        ("", _) => privilege.code.name().to_string(),
        (ns, "") => format!("{}@{ns}", privilege.code.name()),
        (ns, set) => format!("{}@{ns}.{set}", privilege.code.name()),
    }
}

fn privileges_data(texts: &[String]) -> Result<Vec<u8>, String> {
    let privileges = texts
        .iter()
        .map(|text| parse_privilege(text))
        .collect::<Result<Vec<_>, _>>()?;
    let mut data = vec![privileges.len().min(255) as u8];
    for privilege in privileges.iter().take(255) {
        data.push(privilege.code as u8);
        if privilege.code.scoped() {
            for part in [&privilege.namespace, &privilege.set] {
                data.push(part.len().min(255) as u8);
                data.extend_from_slice(&part.as_bytes()[..part.len().min(255)]);
            }
        }
    }
    Ok(data)
}

/// Sends one admin frame to `on` (logged in first) and returns the records.
async fn send(on: &On, frame: Vec<u8>, query: bool) -> Result<Vec<admin::AdminRecord>, String> {
    let timeout = Duration::from_millis(on.host.timeout_ms);
    let host = &on.host.host;
    let mut connection = citrine_client::connect_at(host, timeout)
        .await
        .map_err(|e| format!("cannot talk to {host}: {e}"))?;
    let deadline = Some(Instant::now() + timeout);
    if let Some(credentials) = on.login.credentials() {
        connection
            .login(&credentials, deadline)
            .await
            .map_err(|e| format!("login as {} refused: {e}", credentials.user))?;
    }
    connection
        .admin(&frame, query, deadline)
        .await
        .map_err(|e| e.to_string())
}

fn text(fields: &[(u8, Vec<u8>)], id: u8) -> String {
    fields
        .iter()
        .find(|(field, _)| *field == id)
        .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
        .unwrap_or_default()
}

/// The connection, admin frame and whether it is a query, for a user command.
type Request<'a> = (&'a On, Vec<u8>, bool);

pub async fn run_user(args: UserArgs) -> CliResult {
    let (on, frame, query) = user_request(&args.command)?;
    let records = send(on, frame, query).await?;
    for (_, fields) in records.iter().filter(|_| query) {
        let roles = fields
            .iter()
            .find(|(id, _)| *id == field::ROLES)
            .and_then(|(_, data)| decode_roles(data).ok())
            .unwrap_or_default();
        outln!("{}\troles={}", text(fields, field::USER), roles.join(","));
    }
    Ok(ExitCode::SUCCESS)
}

fn user_request(command: &UserCommand) -> Result<Request<'_>, String> {
    let hash = |password: &str| admin::hash_password(password).map_err(|e| e.to_string());
    Ok(match command {
        UserCommand::Create {
            on,
            name,
            new_password: password,
            roles,
        } => {
            let roles = admin::roles_data(roles);
            let hash = hash(password)?;
            (
                on,
                admin::request(
                    command::CREATE_USER,
                    &[
                        (field::USER, name.as_bytes()),
                        (field::PASSWORD, &hash),
                        (field::ROLES, &roles),
                    ],
                ),
                false,
            )
        }
        UserCommand::Drop { on, name } => (
            on,
            admin::request(command::DROP_USER, &[(field::USER, name.as_bytes())]),
            false,
        ),
        UserCommand::Password {
            on,
            name,
            new_password: password,
        } => {
            let hash = hash(password)?;
            (
                on,
                admin::request(
                    command::SET_PASSWORD,
                    &[(field::USER, name.as_bytes()), (field::PASSWORD, &hash)],
                ),
                false,
            )
        }
        UserCommand::Grant { on, name, roles } | UserCommand::Revoke { on, name, roles } => {
            let code = match command {
                UserCommand::Grant { .. } => command::GRANT_ROLES,
                _ => command::REVOKE_ROLES,
            };
            let roles = admin::roles_data(roles);
            let fields = [(field::USER, name.as_bytes()), (field::ROLES, &roles[..])];
            (on, admin::request(code, &fields), false)
        }
        UserCommand::List { on, name } => {
            let fields: Vec<(u8, &[u8])> = name
                .iter()
                .map(|name| (field::USER, name.as_bytes()))
                .collect();
            (on, admin::request(command::QUERY_USERS, &fields), true)
        }
    })
}

pub async fn run_role(args: RoleArgs) -> CliResult {
    let (on, frame, query) = role_request(&args.command)?;
    let records = send(on, frame, query).await?;
    for (_, fields) in records.iter().filter(|_| query) {
        let privileges = fields
            .iter()
            .find(|(id, _)| *id == field::PRIVILEGES)
            .and_then(|(_, data)| decode_privileges(data).ok())
            .unwrap_or_default();
        let shown: Vec<String> = privileges
            .iter()
            .filter_map(Privilege::from_wire)
            .map(|p| show_privilege(&p))
            .collect();
        outln!(
            "{}\tprivileges={}",
            text(fields, field::ROLE),
            shown.join(",")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn role_request(command: &RoleCommand) -> Result<Request<'_>, String> {
    Ok(match command {
        RoleCommand::Create {
            on,
            name,
            privileges,
        } => {
            let data = privileges_data(privileges)?;
            let mut fields: Vec<(u8, &[u8])> = vec![(field::ROLE, name.as_bytes())];
            if !privileges.is_empty() {
                fields.push((field::PRIVILEGES, &data));
            }
            (on, admin::request(command::CREATE_ROLE, &fields), false)
        }
        RoleCommand::Drop { on, name } => (
            on,
            admin::request(command::DROP_ROLE, &[(field::ROLE, name.as_bytes())]),
            false,
        ),
        RoleCommand::Grant {
            on,
            name,
            privileges,
        }
        | RoleCommand::Revoke {
            on,
            name,
            privileges,
        } => {
            let code = match command {
                RoleCommand::Grant { .. } => command::GRANT_PRIVILEGES,
                _ => command::REVOKE_PRIVILEGES,
            };
            let data = privileges_data(privileges)?;
            let fields = [
                (field::ROLE, name.as_bytes()),
                (field::PRIVILEGES, &data[..]),
            ];
            (on, admin::request(code, &fields), false)
        }
        RoleCommand::List { on, name } => {
            let fields: Vec<(u8, &[u8])> = name
                .iter()
                .map(|name| (field::ROLE, name.as_bytes()))
                .collect();
            (on, admin::request(command::QUERY_ROLES, &fields), true)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileges_read_and_print_in_one_form() {
        for text in ["read", "read-write@test", "write@test.demo", "sys-admin"] {
            assert_eq!(show_privilege(&parse_privilege(text).expect(text)), text);
        }
        assert!(parse_privilege("sys-admin@test").is_err());
        assert!(parse_privilege("nope").is_err());
    }
}
