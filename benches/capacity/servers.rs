//! The bench's own `redis-server`s: one, or a cluster, on free ports in a temp dir.

#[allow(unused_imports)]
use super::*;

/// `redis-server`s of the bench's own on free ports in a temp dir, killed on drop.
pub(crate) struct Servers {
    pub(crate) seeds: Vec<String>,
    children: Vec<std::process::Child>,
    dir: std::path::PathBuf,
}

impl Servers {
    pub(crate) fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port()
    }

    pub(crate) fn start(&mut self, port: u16, args: &[&str]) {
        let dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("a directory");
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-idempotency-capacity-redis-{}",
            std::process::id()
        ));
        Self {
            seeds: Vec::new(),
            children: Vec::new(),
            dir,
        }
    }

    /// Until `redis-cli -p port args` prints `text`.
    pub(crate) fn wait_for(port: u16, args: &[&str], text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let output = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string()])
                .args(args)
                .output()
                .expect("redis-cli on PATH");
            if String::from_utf8_lossy(&output.stdout).contains(text) {
                return;
            }
            assert!(Instant::now() < deadline, "{port}: never {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn primary_and_replica() -> Self {
        let mut servers = Self::new();
        let (primary, replica) = (Self::free_port(), Self::free_port());
        servers.start(primary, &[]);
        servers.start(replica, &["--replicaof", "127.0.0.1", &primary.to_string()]);
        Self::wait_for(primary, &["info", "replication"], "state=online");
        servers.seeds.push(format!("redis://127.0.0.1:{primary}"));
        servers
    }

    pub(crate) fn replicated_cluster() -> Self {
        let mut servers = Self::new();
        let ports: Vec<u16> = (0..6).map(|_| Self::free_port()).collect();
        for &port in &ports {
            let bus = Self::free_port().to_string();
            servers.start(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                ],
            );
        }
        let created = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(ports.iter().map(|port| format!("127.0.0.1:{port}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli on PATH");
        assert!(created.success(), "redis-cli --cluster create");
        for &port in &ports {
            Self::wait_for(port, &["cluster", "info"], "cluster_state:ok");
        }
        for &port in &ports {
            let role = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "role"])
                .output()
                .expect("redis-cli");
            if String::from_utf8_lossy(&role.stdout).starts_with("master") {
                Self::wait_for(port, &["info", "replication"], "state=online");
            }
        }
        servers.seeds = ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect();
        servers
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
