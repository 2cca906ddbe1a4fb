//! Reading multi-message reply streams (batch, scan) off a socket.

use super::read_frame;
use citrine_wire::frame::MessageType;
use citrine_wire::msg::{info3, Message, MsgHeader};
use std::net::TcpStream;

/// One message of a stream: header, fields, bins.
pub struct Msg {
    pub header: MsgHeader,
    pub fields: Vec<(u8, Vec<u8>)>,
    pub bins: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Msg {
    pub fn field(&self, kind: u8) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(field_type, _)| *field_type == kind)
            .map(|(_, data)| data.as_slice())
    }
}

/// Reads frames until a message with info3 LAST; returns every message and
/// the number of frames.
pub fn read_stream(stream: &mut TcpStream) -> (Vec<Msg>, usize) {
    let mut messages = Vec::new();
    let mut frames = 0;
    loop {
        let (header, body) = read_frame(stream).unwrap();
        assert_eq!(header.message_type, MessageType::Message);
        frames += 1;
        let mut rest = body.as_slice();
        while !rest.is_empty() {
            let (message, used) = Message::decode_prefix(rest).unwrap();
            let last = message.header.info3 & info3::LAST != 0;
            messages.push(Msg {
                header: message.header,
                fields: message
                    .fields()
                    .map(|field| (field.field_type, field.data.to_vec()))
                    .collect(),
                bins: message
                    .ops()
                    .map(|op| (op.name.to_vec(), op.value.to_vec()))
                    .collect(),
            });
            rest = &rest[used..];
            if last {
                assert!(rest.is_empty(), "LAST is the final message");
                return (messages, frames);
            }
        }
    }
}
