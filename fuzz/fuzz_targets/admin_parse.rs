//! The admin protocol (proto type 2) with security on: the field parser
//! and structured decoders of `citrine_wire::admin`, then
//! `citrine_security::admin::execute` over a node's access-control state
//! (the default user, stored hashes at the lowest bcrypt cost), from a
//! connection that is logged in as admin or not (the input's first byte).
//!
//! Oracle: no panic, no hang; every request is answered with exactly one
//! admin frame whose size is its body's; an error answer (result ≠ 0) is
//! exactly 16 bytes of body; a successful parse's fields all lie inside the
//! body; a LOGIN answered 0 logs the connection in.
#![no_main]

use citrine_security::admin::{execute, Context};
use citrine_security::{Entropy, Security, SecurityConfig};
use citrine_wire::admin::{self, AdminRequest, ADMIN_HEADER_SIZE};
use citrine_wire::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn base() -> &'static Security {
    static BASE: OnceLock<Security> = OnceLock::new();
    BASE.get_or_init(|| {
        let config = SecurityConfig {
            stored_cost: 4,
            enable_quotas: true,
            ..SecurityConfig::default()
        };
        Security::new(config, [5; 16])
    })
}

fn check_parse(body: &[u8]) {
    let Ok(request) = AdminRequest::parse(body) else {
        return;
    };
    let total: usize = request.fields.iter().map(|(_, data)| 5 + data.len()).sum();
    assert!(ADMIN_HEADER_SIZE + total <= body.len());
    for (id, data) in &request.fields {
        match *id {
            admin::field::ROLES => drop(admin::decode_roles(data)),
            admin::field::PRIVILEGES => drop(admin::decode_privileges(data)),
            _ => drop(admin::decode_u32(data)),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    check_parse(body);
    let mut security = base().clone();
    let mut login = (mode & 1 == 1).then(|| "admin".to_string());
    let context = Context {
        certificate: (mode & 2 == 2).then_some("admin"),
        from: Some(std::net::IpAddr::from([127, 0, 0, 1])),
        now_ms: 1_000,
        entropy: Entropy {
            salt: [mode; 16],
            token: [mode; 32],
        },
    };
    let mut out = Vec::new();
    execute(&mut security, body, &mut login, context, &mut out);
    let head: &[u8; PROTO_HEADER_SIZE] = out[..PROTO_HEADER_SIZE].try_into().expect("a header");
    let header = ProtoHeader::decode(head).expect("the answer's proto header decodes");
    assert_eq!(header.message_type, MessageType::Admin);
    assert_eq!(
        header.size as usize,
        out.len() - PROTO_HEADER_SIZE,
        "one frame"
    );
    let result = out[PROTO_HEADER_SIZE + 1];
    if result != 0 {
        assert_eq!(
            out.len(),
            PROTO_HEADER_SIZE + ADMIN_HEADER_SIZE,
            "an error is 16 bytes"
        );
    }
});
