//! Test support: starting and stopping a real `citrined` process.
//!
//! The binary is `$CITRINED_BIN`, else the newer of
//! `<workspace>/target/{release,debug}/citrined`. A missing binary fails the test
//! with instructions (it never skips silently).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Path of the server binary, or a panic saying how to build it.
pub fn citrined_bin() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Ok(path) = std::env::var("CITRINED_BIN") {
        let given = PathBuf::from(&path);
        // Tests run in the crate directory: a relative path may be meant from the workspace root.
        let path = if given.is_file() {
            given
        } else {
            workspace.join(&path)
        };
        assert!(
            path.is_file(),
            "CITRINED_BIN={} does not exist",
            path.display()
        );
        return path;
    }
    // The most recently built of release and debug, so a stale build is not picked.
    let newest = ["release", "debug"]
        .iter()
        .map(|profile| workspace.join("target").join(profile).join("citrined"))
        .filter_map(|path| Some((std::fs::metadata(&path).ok()?.modified().ok()?, path)))
        .max_by_key(|(modified, _)| *modified);
    if let Some((_, path)) = newest {
        return path;
    }
    panic!(
        "citrined binary not found: these integration tests need a real server.\n\
         Build it with `cargo build --release -p citrine-server` (or debug), or set CITRINED_BIN=/path/to/citrined."
    );
}

pub use citrine_testsupport::{free_port, wait_until_serving};

/// A running citrined; killed on drop.
pub struct Server {
    pub port: u16,
    child: Option<Child>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Server {
        let mut server = Server { port, child: None };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let mut child = Command::new(citrined_bin())
            .args(["--port", &self.port.to_string(), "--address", "127.0.0.1"])
            .args([
                "--fabric-port",
                &free_port().to_string(),
                "--heartbeat-port",
                &free_port().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A node that fails says why in the test's output.
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn citrined");
        wait_until_serving(&mut child, self.port, Duration::from_secs(15));
        self.child = Some(child);
    }

    pub fn seed(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
