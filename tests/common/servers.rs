//! Servers a test owns: its own `redis-server` on a free port in a temp dir, and a loopback
//! TCP proxy that can cut the line to a backend. Both stop when dropped.

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
use tokio::io::AsyncReadExt;

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory of its own under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tower-idempotency-{name}-{}",
            tower_idempotency::store::Reservation::generate()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA made for a test in a directory of its own, and a server certificate it signed for
/// `127.0.0.1` and `localhost`, by the `openssl` command.
pub struct TlsFiles {
    pub dir: TempDir,
}

impl TlsFiles {
    pub fn make() -> Self {
        let files = Self {
            dir: TempDir::new("tls"),
        };
        let openssl = |args: &[&str]| {
            let made = Command::new("openssl")
                .args(args)
                .current_dir(&files.dir.0)
                .output()
                .expect("openssl must be on PATH for this test");
            assert!(
                made.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&made.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tower-idempotency test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            files.dir.0.join("server.ext"),
            "subjectAltName = IP:127.0.0.1, DNS:localhost\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
        files
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.0.join(name).display().to_string()
    }

    /// The CA's certificate, PEM.
    pub fn ca(&self) -> Vec<u8> {
        std::fs::read(self.dir.0.join("ca.pem")).unwrap()
    }
}

/// A `redis-server` of the test's own, with append-only persistence fsynced on every write.
pub struct RedisServer {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// Kills the server when this process ends, however it ends (a server held by a
    /// `static` is never dropped): a shell that waits for the end of its input, which is this
    /// process's end of a pipe.
    watchdog: Option<Child>,
    args: Vec<String>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with more configuration: `["--maxmemory-policy", "volatile-lru"]`, say.
    pub fn start_with(args: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            dir: TempDir::new("redis"),
            child: None,
            watchdog: None,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.start_again();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A server that speaks TLS only, with the certificate `tls` made.
    pub fn start_tls(tls: &TlsFiles) -> Self {
        let port = free_port();
        let port_arg = port.to_string();
        let (cert, key, ca) = (
            tls.path("server.pem"),
            tls.path("server.key"),
            tls.path("ca.pem"),
        );
        let mut server = Self {
            port,
            dir: TempDir::new("redis-tls"),
            child: None,
            watchdog: None,
            args: [
                "--port",
                "0",
                "--tls-port",
                &port_arg,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
            ]
            .iter()
            .map(|a| (*a).to_owned())
            .collect(),
        };
        server.start_again();
        server
    }

    /// The `rediss://` URL of a server started with [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// Starts the server on the same port and directory, and waits until it answers.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH for this test");
        self.watchdog = Command::new("sh")
            .arg("-c")
            .arg(r#"cat >/dev/null; kill -9 "$0" 2>/dev/null; sleep 0.2; rm -rf "$1""#)
            .arg(child.id().to_string())
            .arg(&self.dir.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server at once, as a crash would.
    pub fn kill(&mut self) {
        // The watchdog first, so that it neither removes the data nor kills a later process
        // that got the same id.
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the server's process runs (it may be paused).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the server's process where it is (`SIGSTOP`): it reads nothing, answers nothing
    /// and acknowledges nothing until [`resume`](Self::resume)d or killed, as a replica that
    /// fell behind would.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`pause`](Self::pause)d server go on (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill on PATH");
        assert!(status.success(), "kill {signal} failed");
    }

    /// A crash and a start on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Pauses the clients of the Redis server at `port` for `millis` (`CLIENT PAUSE`): `WRITE`
/// holds the writes, `ALL` every command, as a hung server would.
pub fn pause_redis(port: u16, millis: u64, what: &str) {
    let status = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "CLIENT",
            "PAUSE",
            &millis.to_string(),
            what,
        ])
        .stdout(Stdio::null())
        .status()
        .expect("redis-cli on PATH");
    assert!(status.success(), "CLIENT PAUSE failed");
}

/// A Redis Cluster of the test's own: three primaries, each a [`RedisServer`] with its data
/// fsynced on every write, its slots spread by `redis-cli --cluster create`, with no replicas
/// ([`start`](Self::start)) or one each ([`start_replicated`](Self::start_replicated)).
/// Keys of a primary that is down fail; the others keep working
/// (`cluster-require-full-coverage no`).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A cluster whose nodes have more configuration (`["--appendonly", "no"]`, say).
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_shaped(0, "2000", args)
    }

    /// Three primaries with a replica each, which takes over when its primary fails for a
    /// second, however far behind it is (`cluster-replica-validity-factor 0`). Returns when
    /// every replica has synced with its primary.
    pub fn start_replicated() -> Self {
        let cluster = Self::start_shaped(1, "1000", &["--cluster-replica-validity-factor", "0"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.pairs().len() < 3 {
            assert!(Instant::now() < deadline, "the replicas did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn start_shaped(replicas: usize, node_timeout: &str, args: &[&str]) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                let mut node_args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    node_timeout,
                    "--cluster-port",
                    &bus,
                    "--cluster-require-full-coverage",
                    "no",
                ];
                node_args.extend_from_slice(args);
                RedisServer::start_with(&node_args)
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli must be on PATH for this test");
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Self { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node listening on `port`.
    pub fn node(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|node| node.port == port)
            .expect("a node of the cluster")
    }

    /// Each primary serving slots with its replica, as `(primary, replica)` ports, as a
    /// running node sees them (`CLUSTER NODES`); only replicas that are up and synced with
    /// their primary.
    pub fn pairs(&self) -> Vec<(u16, u16)> {
        let nodes = self.cluster_nodes();
        let mut pairs = Vec::new();
        for primary in nodes
            .iter()
            .filter(|node| node.primary && node.serves_slots)
        {
            let replica = nodes
                .iter()
                .find(|node| !node.primary && node.primary_id == primary.id);
            if let Some(replica) = replica
                && synced(primary.port)
            {
                pairs.push((primary.port, replica.port));
            }
        }
        pairs.sort_unstable();
        pairs
    }

    /// The ports of the primaries serving slots, as a running node sees them.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .cluster_nodes()
            .iter()
            .filter(|node| node.primary && node.serves_slots)
            .map(|node| node.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// `CLUSTER NODES` as the first running node answers it, failed nodes left out.
    fn cluster_nodes(&self) -> Vec<ClusterNode> {
        let Some(node) = self.nodes.iter().find(|node| node.running()) else {
            return Vec::new();
        };
        let answer = Command::new("redis-cli")
            .args(["-p", &node.port.to_string(), "cluster", "nodes"])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&answer.stdout)
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (id, address, flags, primary_id) = (
                    fields.first()?,
                    fields.get(1)?,
                    fields.get(2)?,
                    fields.get(3)?,
                );
                let port = address
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let flags: Vec<&str> = flags.split(',').collect();
                if flags.iter().any(|flag| flag.starts_with("fail")) {
                    return None;
                }
                Some(ClusterNode {
                    id: (*id).to_owned(),
                    port,
                    primary: flags.contains(&"master"),
                    primary_id: (*primary_id).to_owned(),
                    serves_slots: fields.len() > 8,
                })
            })
            .collect()
    }

    /// Waits until every running node says the cluster is ok and knows three primaries
    /// serving slots.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in self.nodes.iter().filter(|node| node.running()) {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli");
                let info = String::from_utf8_lossy(&info.stdout);
                if info.contains("cluster_state:ok") && info.contains("cluster_size:3") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not come up: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Waits until the node at `port` is a primary serving slots, and the cluster is ok.
    pub fn wait_until_primary(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.primaries().contains(&port) {
            assert!(Instant::now() < deadline, "{port} did not take over");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_until_ok();
    }
}

/// A node of a cluster, as `CLUSTER NODES` lists it.
struct ClusterNode {
    id: String,
    port: u16,
    primary: bool,
    /// The id of a replica's primary (`-` for a primary).
    primary_id: String,
    serves_slots: bool,
}

/// Whether the primary at `port` has a replica online (`INFO replication`).
fn synced(port: u16) -> bool {
    let info = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "replication"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&info.stdout).contains("state=online")
}

#[allow(unused_imports)]
pub use super::proxy::Proxy;
