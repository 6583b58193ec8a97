//! Throwaway nats-server nodes for tests: one JetStream node, or a 3-node
//! JetStream cluster with routes, each process on free loopback ports with a
//! temporary store directory, SIGKILLed when dropped.
//!
//! Needs `nats-server` on PATH (Debian: `apt-get install -y nats-server`;
//! `.ci/run` installs it). The tests never skip without it.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One nats-server process.
pub struct NatsNode {
    pub name: String,
    pub port: u16,
    pub cluster_port: Option<u16>,
    args: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl NatsNode {
    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The store directory.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("js")
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("log file");
        let child = Command::new(nats_server())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start nats-server ({error}); install it: apt-get install -y nats-server")
            });
        self.child = Some(child);
        wait_for_port(self.port, &self.dir.path().join("server.log"));
    }

    /// SIGKILLs the process (no shutdown, no flush).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same ports and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for NatsNode {
    fn drop(&mut self) {
        self.kill();
    }
}

fn nats_server() -> String {
    std::env::var("IDEM_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned())
}

fn wait_for_port(port: u16, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "nats-server did not listen on {port} within 20 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn node(name: &str, cluster: Option<(&str, u16, Vec<u16>)>) -> NatsNode {
    let dir = tempfile::Builder::new()
        .prefix("idem-nats-")
        .tempdir()
        .expect("temp dir");
    let port = idem_test_support::free_port().expect("free port");
    let mut args = vec![
        "-a".to_owned(),
        "127.0.0.1".to_owned(),
        "-p".to_owned(),
        port.to_string(),
        "-n".to_owned(),
        name.to_owned(),
        "-js".to_owned(),
        "-sd".to_owned(),
        dir.path().join("js").display().to_string(),
    ];
    let mut cluster_port = None;
    if let Some((cluster_name, own, peers)) = cluster {
        cluster_port = Some(own);
        let routes = peers
            .iter()
            .map(|peer| format!("nats://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        args.extend([
            "--cluster_name".to_owned(),
            cluster_name.to_owned(),
            "--cluster".to_owned(),
            format!("nats://127.0.0.1:{own}"),
            "--routes".to_owned(),
            routes,
        ]);
    }
    NatsNode {
        name: name.to_owned(),
        port,
        cluster_port,
        args,
        child: None,
        dir,
    }
}

/// A single JetStream node.
pub fn single() -> NatsNode {
    let mut node = node("single", None);
    node.spawn();
    node
}

/// Three JetStream nodes, `n1`..`n3`, routed to each other.
pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
}

impl NatsCluster {
    /// Starts the three nodes (JetStream needs a few seconds to elect a
    /// meta leader; use [`NatsCluster::jetstream`] to wait for it).
    pub fn start() -> Self {
        let cluster_ports: Vec<u16> = (0..3)
            .map(|_| idem_test_support::free_port().expect("free port"))
            .collect();
        let mut nodes: Vec<NatsNode> = (0..3)
            .map(|i| {
                let peers = cluster_ports
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, port)| *port)
                    .collect();
                node(
                    &format!("n{}", i + 1),
                    Some(("idem-test", cluster_ports[i], peers)),
                )
            })
            .collect();
        for node in &mut nodes {
            node.spawn();
        }
        Self { nodes }
    }

    /// Every node's client URL, for a client that fails over.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsNode::url).collect()
    }

    /// The node called `name`.
    pub fn node_mut(&mut self, name: &str) -> &mut NatsNode {
        self.nodes
            .iter_mut()
            .find(|node| node.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }
}

/// A client connected to `urls` (reconnecting to the others when one dies).
pub async fn connect(urls: &[String]) -> async_nats::Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(urls.to_vec())
            .await
        {
            Ok(client) => return client,
            Err(error) if Instant::now() < deadline => {
                eprintln!("connecting to nats: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("cannot connect to nats at {urls:?}: {error}"),
        }
    }
}

/// Creates (or, while JetStream elects its leaders, keeps retrying to
/// create) a stream.
pub async fn create_stream(
    js: &async_nats::jetstream::Context,
    config: async_nats::jetstream::stream::Config,
) -> async_nats::jetstream::stream::Stream {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(error) if Instant::now() < deadline => {
                eprintln!("creating stream {}: {error}", config.name);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("cannot create stream {}: {error}", config.name),
        }
    }
}
