//! `citrine certs DIR`: a development certificate authority and the
//! certificates a local node and client need for TLS.
//!
//! Writes `ca.pem` (a self-signed CA), `node.pem` + `node.key` (the
//! node's certificate for the TLS name `localhost`, with 127.0.0.1 and ::1
//! as IP addresses, signed by the CA, good for both ends of a connection
//! between nodes) and `client.pem` + `client.key` (a
//! client certificate named `client`, for `tls-authenticate-client`).
//! The CA's key is not kept: these certificates are for development and
//! tests, made anew when needed. Keys are ECDSA P-256; files holding a key
//! are readable by their owner only.

use crate::CliResult;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Directory to write the files into (made if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn run(args: CertsArgs) -> CliResult {
    write_certs(&args.dir)?;
    println!(
        "wrote ca.pem, node.pem, node.key (TLS name localhost, IP 127.0.0.1), client.pem and client.key to {}",
        args.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Makes the CA and both certificates and writes them under `dir`.
pub fn write_certs(dir: &Path) -> Result<(), String> {
    let failed = |error: rcgen::Error| format!("cannot make the certificates: {error}");
    std::fs::create_dir_all(dir)
        .map_err(|error| format!("cannot make {}: {error}", dir.display()))?;
    let ca_key = KeyPair::generate().map_err(failed)?;
    let ca_params = ca_params().map_err(failed)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(failed)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let node_key = KeyPair::generate().map_err(failed)?;
    let node_cert = leaf_params("localhost", true)
        .map_err(failed)?
        .signed_by(&node_key, &issuer)
        .map_err(failed)?;
    let client_key = KeyPair::generate().map_err(failed)?;
    let client_cert = leaf_params("client", false)
        .map_err(failed)?
        .signed_by(&client_key, &issuer)
        .map_err(failed)?;
    write(dir, "ca.pem", &ca_cert.pem(), false)?;
    write(dir, "node.pem", &node_cert.pem(), false)?;
    write(dir, "node.key", &node_key.serialize_pem(), true)?;
    write(dir, "client.pem", &client_cert.pem(), false)?;
    write(dir, "client.key", &client_key.serialize_pem(), true)
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "Citrine development CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// A leaf certificate named `name` (its common name and DNS name); a
/// server's also carries the loopback addresses.
fn leaf_params(name: &str, server: bool) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(vec![name.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if server {
        // Nodes also present it to each other on the fabric and heartbeat
        // channels, where they are the client.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.subject_alt_names.extend([
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ]);
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    Ok(params)
}

fn write(dir: &Path, name: &str, text: &str, secret: bool) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        options.mode(0o600);
    }
    options
        .open(&path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
}
