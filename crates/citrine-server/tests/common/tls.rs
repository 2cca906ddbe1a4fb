//! Development certificates for the TLS tests, made with rcgen.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::Path;

/// Writes `ca.pem`, `node.pem`/`node.key` (localhost, 127.0.0.1) and
/// `client.pem`/`client.key` (named `client`) into `dir`.
pub fn write_certs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |name: &str, usage: &[ExtendedKeyUsagePurpose]| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.extended_key_usages = usage.to_vec();
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        (
            params.signed_by(&key, &issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    };
    // Nodes present theirs to each other too (fabric and heartbeat TLS).
    let node_usage = [
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let (node, node_key) = leaf("localhost", &node_usage);
    let (client, client_key) = leaf("client", &[ExtendedKeyUsagePurpose::ClientAuth]);
    for (name, text) in [
        ("ca.pem", ca_cert.pem()),
        ("node.pem", node),
        ("node.key", node_key),
        ("client.pem", client),
        ("client.key", client_key),
    ] {
        // Written whole then renamed: the node never reads half a file.
        let staged = dir.join(format!("{name}.new"));
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, dir.join(name)).unwrap();
    }
}
