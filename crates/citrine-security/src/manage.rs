//! Changes to users and roles (what the admin commands do once allowed).
//! Each either applies whole or returns the result code and changes
//! nothing.

use crate::{password, Privilege, PrivilegeCode, Role, Security, User, NAME_MAX};
use citrine_types::ResultCode;

/// Whether `name` can name a user or role: 1..=63 bytes, no control
/// characters, no `:` or `;` (kept out of info answers).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.chars().any(|c| c.is_control() || c == ':' || c == ';')
}

impl Security {
    /// The hash to store for a client `credential`.
    fn store(&self, credential: &[u8], salt: [u8; 16]) -> Result<String, ResultCode> {
        if !password::well_formed(credential) {
            return Err(ResultCode::InvalidPassword);
        }
        password::stored_hash(credential, salt, self.config.stored_cost)
            .ok_or(ResultCode::InvalidPassword)
    }

    fn check_roles(&self, roles: &[String]) -> Result<(), ResultCode> {
        match roles.iter().all(|role| self.role_exists(role)) {
            true => Ok(()),
            false => Err(ResultCode::InvalidRole),
        }
    }

    pub fn create_user(
        &mut self,
        name: &str,
        credential: &[u8],
        roles: &[String],
        salt: [u8; 16],
    ) -> Result<(), ResultCode> {
        if !valid_name(name) {
            return Err(ResultCode::InvalidUser);
        }
        if self.users.contains_key(name) {
            return Err(ResultCode::UserExists);
        }
        self.check_roles(roles)?;
        let password = self.store(credential, salt)?;
        let roles = roles.iter().cloned().collect();
        // An external user of that name loses its sessions: they must not
        // carry over to the new user's roles.
        self.set_external_roles(name, None);
        self.users.insert(name.into(), User { password, roles });
        Ok(())
    }

    pub fn drop_user(&mut self, name: &str) -> Result<(), ResultCode> {
        self.users.remove(name).ok_or(ResultCode::InvalidUser)?;
        self.end_sessions(name);
        self.usage.forget(name);
        Ok(())
    }

    fn end_sessions(&mut self, name: &str) {
        self.sessions.retain(|_, session| session.user != name);
    }

    /// Sets `name`'s password; its sessions end.
    pub fn set_password(
        &mut self,
        name: &str,
        credential: &[u8],
        salt: [u8; 16],
    ) -> Result<(), ResultCode> {
        if !self.users.contains_key(name) {
            return Err(ResultCode::InvalidUser);
        }
        let password = self.store(credential, salt)?;
        if let Some(user) = self.users.get_mut(name) {
            user.password = password;
        }
        self.end_sessions(name);
        Ok(())
    }

    /// Sets `name`'s password if `old` is its current credential.
    pub fn change_password(
        &mut self,
        name: &str,
        old: &[u8],
        credential: &[u8],
        salt: [u8; 16],
    ) -> Result<(), ResultCode> {
        let user = self.users.get(name).ok_or(ResultCode::InvalidUser)?;
        if !password::verify(old, &user.password) {
            return Err(ResultCode::InvalidPassword);
        }
        self.set_password(name, credential, salt)
    }

    pub fn grant_roles(&mut self, name: &str, roles: &[String]) -> Result<(), ResultCode> {
        self.check_roles(roles)?;
        let user = self.users.get_mut(name).ok_or(ResultCode::InvalidUser)?;
        user.roles.extend(roles.iter().cloned());
        Ok(())
    }

    pub fn revoke_roles(&mut self, name: &str, roles: &[String]) -> Result<(), ResultCode> {
        self.check_roles(roles)?;
        let user = self.users.get_mut(name).ok_or(ResultCode::InvalidUser)?;
        for role in roles {
            user.roles.remove(role);
        }
        Ok(())
    }

    /// Creates a user-defined role.
    pub fn create_role(&mut self, name: &str, role: Role) -> Result<(), ResultCode> {
        if !valid_name(name) {
            return Err(ResultCode::InvalidRole);
        }
        if self.role_exists(name) {
            return Err(ResultCode::RoleExists);
        }
        self.check_quotas(role.read_quota, role.write_quota)?;
        if role
            .whitelist
            .iter()
            .any(|entry| crate::allow::AllowEntry::parse(entry).is_none())
        {
            return Err(ResultCode::InvalidWhitelist);
        }
        self.roles.insert(name.into(), role);
        Ok(())
    }

    fn check_quotas(&self, read: u32, write: u32) -> Result<(), ResultCode> {
        if (read > 0 || write > 0) && !self.config.enable_quotas {
            return Err(ResultCode::QuotasNotEnabled);
        }
        Ok(())
    }

    /// The user-defined role `name`, for a change (70 if built-in or absent).
    fn role_mut(&mut self, name: &str) -> Result<&mut Role, ResultCode> {
        self.roles.get_mut(name).ok_or(ResultCode::InvalidRole)
    }

    /// Drops a user-defined role and revokes it from every user.
    pub fn drop_role(&mut self, name: &str) -> Result<(), ResultCode> {
        self.roles.remove(name).ok_or(ResultCode::InvalidRole)?;
        for user in self.users.values_mut() {
            user.roles.remove(name);
        }
        Ok(())
    }

    pub fn grant_privileges(
        &mut self,
        name: &str,
        privileges: &[Privilege],
    ) -> Result<(), ResultCode> {
        self.role_mut(name)?
            .privileges
            .extend(privileges.iter().cloned());
        Ok(())
    }

    pub fn revoke_privileges(
        &mut self,
        name: &str,
        privileges: &[Privilege],
    ) -> Result<(), ResultCode> {
        let role = self.role_mut(name)?;
        for privilege in privileges {
            role.privileges.remove(privilege);
        }
        Ok(())
    }

    /// Replaces a role's allow-list (empty: none).
    pub fn set_whitelist(&mut self, name: &str, whitelist: Vec<String>) -> Result<(), ResultCode> {
        if whitelist
            .iter()
            .any(|entry| crate::allow::AllowEntry::parse(entry).is_none())
        {
            return Err(ResultCode::InvalidWhitelist);
        }
        self.role_mut(name)?.whitelist = whitelist;
        Ok(())
    }

    pub fn set_quotas(&mut self, name: &str, read: u32, write: u32) -> Result<(), ResultCode> {
        self.check_quotas(read, write)?;
        let role = self.role_mut(name)?;
        role.read_quota = read;
        role.write_quota = write;
        Ok(())
    }

    /// Every role name: built-in ones (in code order), then user-defined.
    pub fn role_names(&self) -> Vec<String> {
        let builtin = crate::privilege::ALL_CODES
            .iter()
            .map(|code| code.name().to_string());
        builtin.chain(self.roles.keys().cloned()).collect()
    }

    /// Replaces the whole state with `parsed`'s users, roles and external
    /// users (loaded or merged), keeping sessions of users that still
    /// exist, and the token key unless `parsed` has one. A user keeps
    /// a role it holds that is not defined (a merge of a grant made on one
    /// node while another dropped the role): it grants nothing, and the
    /// user's entry stays as every node has it.
    pub fn replace(&mut self, parsed: crate::snapshot::Parsed) {
        let crate::snapshot::Parsed {
            users,
            roles,
            external,
            token_secret,
            token_used,
        } = parsed;
        self.external = external.into_iter().collect();
        let external = &self.external;
        self.logged_in_here
            .retain(|user| external.contains_key(user));
        if token_secret.is_some() {
            self.token_secret = token_secret;
            self.token_used = token_used;
        }
        self.roles = roles
            .into_iter()
            .filter(|(name, _)| PrivilegeCode::from_name(name).is_none())
            .collect();
        self.users = users.into_iter().collect();
        let users = &self.users;
        self.sessions
            .retain(|_, session| users.contains_key(&session.user));
    }
}
