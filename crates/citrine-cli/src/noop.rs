//! The no-op responder (`citrine bench --noop-server PORT`): a small,
//! portable stand-in server for trying the client and the CLI without
//! `citrined`. It is not the benchmark ceiling: a tokio loop costs more CPU
//! per request than citrined's own I/O layer, so reports measure their
//! ceiling with `citrined --noop` (`citrine_service::noop`) instead.
//!
//! It speaks just enough of the protocol for the smart client (and the
//! official clients) to bootstrap: a one-node cluster (`node`, `build`
//! 8.1.2.0, `features` incl. `pscans`, generations, `peers-clear-std`
//! `0,<port>,[]`, `replicas` with an all-ones bitmap for every namespace it
//! serves) and answers every single-record AS_MSG with a header-only
//! success (result 0, generation 1, no bins) — reads return no bins, so a
//! benchmark against it measures request/response overhead only, not value
//! transfer back. A scan or query gets an empty stream (LAST/0) and a
//! batch LAST/16 (unsupported: `citrined --noop` answers batches row by row).
//! Security messages get result 52 (security not enabled); compressed
//! requests get result 25. Nothing is stored.
//!
//! Invariant: answers go out in request order, one per request frame, and a
//! malformed frame closes the connection (exactly what a server does).

use citrine_client::partition::encode_bitmap;
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::info::{request_lines, InfoResponse};
use citrine_wire::msg::{
    field_type, info1, info3, write_status, FieldIter, MessageWriter, MsgHeader,
};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Node id the responder reports.
pub const NOOP_NODE_ID: &str = "BB9000000000C17";

const FEATURES: &str = "batch-any;batch-index;blob-bits;cdt-index;cdt-list;cdt-map;cluster-stable;float;geo;\
sindex-exists;peers;pipelining;pquery;pscans;query-show;relaxed-sc;replicas;replicas-all;replicas-master;replicas-max;\
truncate-namespace";

/// Static answers of one responder.
#[derive(Debug)]
pub struct Answers {
    port: u16,
    namespaces: Vec<String>,
    replicas: String,
}

impl Answers {
    pub fn new(port: u16, namespaces: &[String]) -> Answers {
        let bitmap = encode_bitmap(&[0xFF; 512]);
        let replicas = namespaces
            .iter()
            .map(|ns| format!("{ns}:0,1,{bitmap}"))
            .collect::<Vec<_>>()
            .join(";");
        Answers {
            port,
            namespaces: namespaces.to_vec(),
            replicas,
        }
    }

    /// The value of one info command line.
    pub fn info(&self, line: &str) -> String {
        let name = line.split([':', '/']).next().unwrap_or_default();
        match name {
            "node" => NOOP_NODE_ID.into(),
            "build" => "8.1.2.0".into(),
            "version" => "Citrine no-op responder build 8.1.2.0".into(),
            "edition" => "Citrine no-op responder".into(),
            "features" => FEATURES.into(),
            "cluster-name" => "citrine-noop".into(),
            "partition-generation" | "peers-generation" | "rebalance-generation" => "0".into(),
            "peers-clear-std" | "peers-clear-alt" | "alumni-clear-std" | "alumni-clear-alt" => {
                format!("0,{},[]", self.port)
            }
            "service-clear-std" => format!("127.0.0.1:{}", self.port),
            "service-clear-alt" | "service-tls-std" | "service-tls-alt" => String::new(),
            "replicas" | "replicas-all" => {
                if name == "replicas" {
                    self.replicas.clone()
                } else {
                    self.replicas.replace(":0,1,", ":1,")
                }
            }
            "replicas-master" => self.replicas.replace(":0,1,", ":"),
            "partitions" => "4096".into(),
            "namespaces" => self.namespaces.join(";"),
            "statistics" => {
                "cluster_size=1;cluster_key=C17C17C17C17;migrate_partitions_remaining=0;uptime=0"
                    .into()
            }
            "cluster-key" => "C17C17C17C17".into(),
            "user-agent-set" => "ok".into(),
            "rack-ids" => "ERROR:25:enterprise only".into(),
            _ => "ERROR:4:unrecognized command".into(),
        }
    }

    /// The answer body of one info request body.
    pub fn info_body(&self, body: &[u8]) -> Vec<u8> {
        let mut response = InfoResponse::new();
        let lines = request_lines(body);
        if lines.is_empty() {
            for name in [
                "node",
                "build",
                "edition",
                "features",
                "partition-generation",
            ] {
                response.push(name, &self.info(name));
            }
        }
        for line in &lines {
            response.push(line, &self.info(line));
        }
        let mut out = Vec::new();
        response.write_frame(&mut out);
        out
    }
}

/// Serves forever on `127.0.0.1:port` (or `address:port`).
pub async fn serve(address: &str, port: u16, namespaces: Vec<String>) -> std::io::Result<()> {
    let listener = TcpListener::bind((address, port)).await?;
    let port = listener.local_addr()?.port();
    eprintln!(
        "citrine no-op responder on {address}:{port}: node {NOOP_NODE_ID}, namespaces {}",
        namespaces.join(",")
    );
    serve_listener(listener, Arc::new(Answers::new(port, &namespaces))).await
}

/// Serves connections from an already bound listener.
pub async fn serve_listener(listener: TcpListener, answers: Arc<Answers>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let answers = answers.clone();
        tokio::spawn(async move {
            let _ = connection(stream, answers).await;
        });
    }
}

async fn connection(mut stream: TcpStream, answers: Arc<Answers>) -> std::io::Result<()> {
    let mut input: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut output: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        let mut consumed = 0;
        while input.len() - consumed >= PROTO_HEADER_SIZE {
            let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
            header_bytes.copy_from_slice(&input[consumed..consumed + PROTO_HEADER_SIZE]);
            let header = ProtoHeader::decode(&header_bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
            let end = consumed + PROTO_HEADER_SIZE + header.size as usize;
            if input.len() < end {
                break;
            }
            let body = &input[consumed + PROTO_HEADER_SIZE..end];
            match header.message_type {
                MessageType::Info => output.extend_from_slice(&answers.info_body(body)),
                MessageType::Message => message_reply(body, &mut output),
                MessageType::Compressed => write_status(&mut output, 25, 0, 0),
                MessageType::Admin => {
                    output.extend_from_slice(&ProtoHeader::encode(MessageType::Admin, 16));
                    let mut security = [0u8; 16];
                    security[1] = 52;
                    output.extend_from_slice(&security);
                }
                MessageType::InternalXdr => return Ok(()),
            }
            consumed = end;
        }
        input.drain(..consumed);
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }
    }
}

/// The answer to one AS_MSG: a header-only success for a single-record
/// command; an empty stream (LAST/0) for a scan or query; LAST/16 for a
/// batch, whose rows this stand-in does not parse (`citrined --noop` does).
fn message_reply(body: &[u8], out: &mut Vec<u8>) {
    let Ok(header) = MsgHeader::decode(body) else {
        write_status(out, 4, 0, 0);
        return;
    };
    let end = |out: &mut Vec<u8>, code: u8| {
        let last = MsgHeader {
            info3: info3::LAST,
            result_code: code,
            ..MsgHeader::default()
        };
        MessageWriter::begin(out, &last).finish();
    };
    if header.info1 & info1::BATCH != 0 {
        end(out, 16);
    } else if FieldIter::unchecked(body)
        .take(usize::from(header.n_fields))
        .any(|field| field.field_type == field_type::DIGEST)
    {
        write_status(out, 0, 1, 0);
    } else {
        end(out, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_bootstrap_commands() {
        let answers = Answers::new(3000, &["test".to_owned(), "bar".to_owned()]);
        assert_eq!(answers.info("peers-clear-std"), "0,3000,[]");
        assert!(answers.info("features").contains("pscans"));
        let replicas = citrine_client::partition::parse_replicas(&answers.info("replicas"))
            .expect("valid replicas");
        assert_eq!(replicas.len(), 2);
        assert_eq!(replicas[1].count(0), 4096);
        assert!(answers.info("bogus").starts_with("ERROR:4"));
        let body = answers.info_body(b"node\nbuild\n");
        assert_eq!(
            &body[8..],
            format!("node\t{NOOP_NODE_ID}\nbuild\t8.1.2.0\n").as_bytes()
        );
    }

    #[test]
    fn single_records_succeed_scans_end_and_batches_are_refused() {
        let reply_to = |info1_bits: u8, digest: bool| {
            let header = MsgHeader {
                info1: info1_bits,
                ..MsgHeader::default()
            };
            let mut frame = Vec::new();
            let mut writer = MessageWriter::begin(&mut frame, &header);
            writer.field(field_type::NAMESPACE, b"test");
            if digest {
                writer.field(field_type::DIGEST, &[9; 20]);
            }
            writer.finish();
            let mut out = Vec::new();
            message_reply(&frame[PROTO_HEADER_SIZE..], &mut out);
            MsgHeader::decode(&out[PROTO_HEADER_SIZE..]).expect("a reply")
        };
        let single = reply_to(info1::READ, true);
        assert_eq!((single.result_code, single.info3), (0, 0));
        let scan = reply_to(info1::READ, false);
        assert_eq!((scan.result_code, scan.info3), (0, info3::LAST));
        let batch = reply_to(info1::BATCH, false);
        assert_eq!((batch.result_code, batch.info3), (16, info3::LAST));
    }
}
