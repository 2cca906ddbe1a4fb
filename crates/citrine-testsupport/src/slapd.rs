//! A throwaway OpenLDAP server for the LDAP tests: its own configuration
//! file and database directory under a test directory, on a loopback
//! port, in the foreground (`slapd -d 0`), ended when dropped. Never the
//! machine's own slapd service or configuration.
//!
//! The directory: `dc=citrine,dc=test` with `ou=users` and `ou=groups`;
//! its root user is [`ROOT_DN`] / [`ROOT_PASSWORD`]. Tests add entries
//! with LDIF before it starts ([`Slapd::start`]) and change them while it
//! runs ([`Slapd::modify`], with `ldapmodify`). [`Slapd::start_tls`]
//! gives it a certificate and makes it refuse every operation not under
//! TLS (StartTLS on its `ldap://` port).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory's suffix.
pub const SUFFIX: &str = "dc=citrine,dc=test";
/// The directory's root user.
pub const ROOT_DN: &str = "cn=admin,dc=citrine,dc=test";
/// Its password.
pub const ROOT_PASSWORD: &str = "secret";

const SLAPD: &str = "/usr/sbin/slapd";
const SLAPADD: &str = "/usr/sbin/slapadd";

/// Why the LDAP tests cannot run here, if they cannot: `slapd`,
/// `slapadd` or `ldapmodify` missing (`apt-get install slapd ldap-utils`).
/// Panics instead when `CITRINE_REQUIRE_SLAPD=1` (`scripts/test.sh` sets
/// it where it installed them), so the tests cannot skip silently there.
pub fn missing() -> Option<String> {
    let modify = Command::new("ldapmodify")
        .arg("-VV")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let found = Path::new(SLAPD).exists() && Path::new(SLAPADD).exists() && modify;
    let why = (!found).then(|| {
        "slapd, slapadd or ldapmodify not installed (apt-get install slapd ldap-utils)".to_owned()
    });
    if let (Some(why), Ok("1")) = (&why, std::env::var("CITRINE_REQUIRE_SLAPD").as_deref()) {
        panic!("CITRINE_REQUIRE_SLAPD=1 but {why}");
    }
    why
}

/// A running slapd.
pub struct Slapd {
    child: Child,
    /// Its `ldap://127.0.0.1:PORT` URL.
    pub url: String,
    config: PathBuf,
}

impl Slapd {
    /// Writes a configuration and database under `dir`, loads the base
    /// entries and `ldif`, and starts slapd on `port`.
    pub fn start(dir: &Path, port: u16, ldif: &str) -> Result<Slapd, String> {
        Slapd::launch(dir, port, ldif, None)
    }

    /// [`Slapd::start`], presenting the certificate `cert` (PEM, its
    /// private key in `key`) and refusing any operation not under TLS.
    pub fn start_tls(
        dir: &Path,
        port: u16,
        ldif: &str,
        (cert, key): (&Path, &Path),
    ) -> Result<Slapd, String> {
        let tls = format!(
            "TLSCertificateFile {}\nTLSCertificateKeyFile {}\nsecurity tls=1\n",
            cert.display(),
            key.display()
        );
        Slapd::launch(dir, port, ldif, Some(tls))
    }

    fn launch(dir: &Path, port: u16, ldif: &str, tls: Option<String>) -> Result<Slapd, String> {
        let database = dir.join("ldap-db");
        std::fs::create_dir_all(&database).map_err(|e| e.to_string())?;
        let config = dir.join("slapd.conf");
        let text = configuration(dir, &database, &tls.unwrap_or_default());
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let data = dir.join("data.ldif");
        std::fs::write(&data, format!("{}\n{ldif}", base_entries())).map_err(|e| e.to_string())?;
        let loaded = Command::new(SLAPADD)
            .arg("-f")
            .arg(&config)
            .arg("-l")
            .arg(&data)
            .output()
            .map_err(|e| e.to_string())?;
        if !loaded.status.success() {
            return Err(format!(
                "slapadd: {}",
                String::from_utf8_lossy(&loaded.stderr)
            ));
        }
        let url = format!("ldap://127.0.0.1:{port}");
        let child = Command::new(SLAPD)
            .arg("-f")
            .arg(&config)
            .args(["-h", &format!("{url}/"), "-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut slapd = Slapd { child, url, config };
        slapd.wait_listening(port)?;
        Ok(slapd)
    }

    fn wait_listening(&mut self, port: u16) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("slapd exited: {status}"));
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("slapd did not listen within 10 s".to_owned())
    }

    /// Applies the LDIF change records `ldif` as the root user.
    pub fn modify(&self, ldif: &str) -> Result<(), String> {
        let path = self.config.with_file_name("change.ldif");
        std::fs::write(&path, ldif).map_err(|e| e.to_string())?;
        let output = Command::new("ldapmodify")
            .args([
                "-x",
                "-H",
                &self.url,
                "-D",
                ROOT_DN,
                "-w",
                ROOT_PASSWORD,
                "-f",
            ])
            .arg(&path)
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ldapmodify: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// slapd.conf, with the global directives `global` before the database.
fn configuration(dir: &Path, database: &Path, global: &str) -> String {
    format!(
        "include /etc/ldap/schema/core.schema\n\
         include /etc/ldap/schema/cosine.schema\n\
         include /etc/ldap/schema/inetorgperson.schema\n\
         pidfile {pid}\n\
         modulepath /usr/lib/ldap\n\
         moduleload back_mdb\n\
         {global}\
         database mdb\n\
         maxsize 10485760\n\
         suffix \"{SUFFIX}\"\n\
         rootdn \"{ROOT_DN}\"\n\
         rootpw {ROOT_PASSWORD}\n\
         directory {database}\n",
        pid = dir.join("slapd.pid").display(),
        database = database.display(),
    )
}

fn base_entries() -> String {
    format!(
        "dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: citrine\ndc: citrine\n\n\
         dn: ou=users,{SUFFIX}\nobjectClass: organizationalUnit\nou: users\n\n\
         dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n"
    )
}
