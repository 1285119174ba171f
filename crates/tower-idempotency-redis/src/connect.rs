//! Connecting a Redis store: to a server or a cluster, over TLS or not, with its check of the
//! server's eviction policy.

use super::*;

/// Makes sure rustls has a crypto provider for `rediss://` (called only for a TLS
/// connection): the process's own if it installed one, else ring. The driver asks rustls for the process's provider, which rustls can pick by
/// itself only when exactly one of its providers is built in; an application that builds in
/// two (aws-lc-rs through another crate, say) would otherwise panic at the first TLS connect.
fn tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one in between: then that one is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`) with the default timeout.
    ///
    /// At connect it reads the server's `maxmemory-policy`: any policy but `noeviction` may
    /// evict records (completed ones carry a TTL, which `volatile-*` policies evict first)
    /// and let a retry create again, so it is refused; see
    /// [`connect_allowing_eviction`](Self::connect_allowing_eviction). A server that does not
    /// answer `CONFIG GET` (a managed service that renamed it) is accepted with a warning.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the URL is invalid or the server cannot be reached within the
    /// timeout; [`StoreErrorKind::InvalidConfig`] if the server may evict records.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_allowing_eviction(url)
            .await?
            .refusing_eviction()
            .await
    }

    /// The server's `maxmemory-policy` (`noeviction` when it has no memory limit, so evicts
    /// nothing), or `None` if it does not say. On a cluster, the first primary's policy that
    /// may evict, else `None` if any primary does not say, else `noeviction`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the server cannot be reached within the timeout.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let mut connection = self.connection.clone();
        let call = async {
            let mut policies = Vec::new();
            for node in connection.clone().primaries().await.map_err(unavailable)? {
                policies.push(node_eviction_policy(&mut connection, node.as_ref()).await?);
            }
            Ok(loosest(policies))
        };
        within(self.options.call_timeout(), call).await
    }

    /// Connects like [`connect`](Self::connect) without checking the eviction policy: for a
    /// server you know keeps the store's records (a dedicated instance, say), or whose policy
    /// you accept.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the URL is invalid or the server cannot be reached within the
    /// timeout.
    pub async fn connect_allowing_eviction(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        Self::connect_client_allowing_eviction(client).await
    }

    /// Connects like [`connect`](Self::connect) through a client you built: for TLS with a
    /// CA of your own or a client certificate ([`redis::Client::build_with_tls`]: a
    /// `root_cert` (PEM) is trusted in place of the system's roots), or any other setting of
    /// the driver's. A `rediss://` URL given to [`connect`](Self::connect)
    /// already trusts the system's roots and a CA file named by `SSL_CERT_FILE`.
    ///
    /// ```no_run
    /// use tower_idempotency_redis::RedisStore;
    /// use tower_idempotency_redis::redis::{Client, TlsCertificates};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/ca.pem")?;
    /// let client = Client::build_with_tls(
    ///     "rediss://cache.internal:6380",
    ///     TlsCertificates { client_tls: None, root_cert: Some(ca) },
    /// )?;
    /// let store = RedisStore::connect_client(client).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); a certificate that does not verify fails here.
    pub async fn connect_client(client: redis::Client) -> Result<Self, StoreError> {
        Self::connect_client_allowing_eviction(client)
            .await?
            .refusing_eviction()
            .await
    }

    /// [`connect_client`](Self::connect_client) without checking the eviction policy.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the server cannot be reached within the timeout, or its certificate
    /// does not verify.
    pub async fn connect_client_allowing_eviction(
        client: redis::Client,
    ) -> Result<Self, StoreError> {
        if matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            tls_provider();
        }
        let client_for_notifier = client.clone();
        let connect = async {
            ConnectionManager::new_with_config(client, manager_config())
                .await
                .map_err(unavailable)
        };
        let connection = within(DEFAULT_TIMEOUT, connect).await?;
        let mut store = Self::from_manager(connection);
        store.lookups = Some(client_for_notifier.clone());
        store.waiters = Some(Arc::new(Waiters::server(client_for_notifier.clone())));
        store
            .listening_on(vec![client_for_notifier])
            .looking_for_replicas()
            .await
    }

    /// Connects to a Redis Cluster through `seeds` (`redis://host:port` URLs of some of its
    /// nodes; the others are found from them), with the default timeout, and checks the
    /// eviction policy of every primary as [`connect`](Self::connect) does.
    ///
    /// Each record is one key, so every script runs on the one node that serves the key's
    /// slot, in one round trip as on one server. Changes are published on the cluster bus and
    /// heard through a subscriber connection to the first seed that answers.
    ///
    /// While a primary is down (and no replica has taken over its slots), the calls for its
    /// keys fail with a [`StoreError`] after the timeout, so the layer answers
    /// `503 store_unavailable` for them; the rest of the keys keep working, and the store
    /// recovers by itself when the node is back.
    ///
    /// ```no_run
    /// use tower_idempotency_redis::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store = RedisStore::connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a URL is invalid or no seed answers within the timeout;
    /// [`StoreErrorKind::InvalidConfig`] if a primary may evict records.
    pub async fn connect_cluster<I, S>(seeds: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_cluster_allowing_eviction(seeds)
            .await?
            .refusing_eviction()
            .await
    }

    /// Connects like [`connect_cluster`](Self::connect_cluster) without checking the
    /// eviction policy.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a URL is invalid or no seed answers within the timeout.
    pub async fn connect_cluster_allowing_eviction<I, S>(seeds: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_cluster_over(seeds, None).await
    }

    /// Connects like [`connect_cluster`](Self::connect_cluster) over TLS with certificates
    /// of your own: `rediss://` seeds, verified against `certificates.root_cert` (PEM) rather
    /// than the system's roots, with a client certificate if `client_tls` is set.
    ///
    /// # Errors
    ///
    /// As [`connect_cluster`](Self::connect_cluster); a certificate that does not verify
    /// fails here.
    pub async fn connect_cluster_with_tls<I, S>(
        seeds: I,
        certificates: redis::TlsCertificates,
    ) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_cluster_over(seeds, Some(certificates))
            .await?
            .refusing_eviction()
            .await
    }

    async fn connect_cluster_over<I, S>(
        seeds: I,
        certificates: Option<redis::TlsCertificates>,
    ) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let clients: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_owned()).collect();
        if certificates.is_some() || clients.iter().any(|seed| seed.starts_with("rediss://")) {
            tls_provider();
        }
        let clients = clients
            .iter()
            .map(|seed| match &certificates {
                Some(certificates) => {
                    redis::Client::build_with_tls(seed.as_ref(), certificates.clone())
                }
                None => redis::Client::open(seed.as_ref()),
            })
            .collect::<RedisResult<Vec<_>>>()
            .map_err(unavailable)?;
        if clients.is_empty() {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                "a Redis Cluster needs at least one seed node",
            ));
        }
        let mut builder = ClusterClientBuilder::new(
            clients
                .iter()
                .map(redis::Client::get_connection_info)
                .cloned(),
        );
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
        let client = builder
            .connection_timeout(DEFAULT_TIMEOUT)
            // Every call runs within the store's own timeout; a few quick retries follow a
            // slot that moved or a connection that dropped, and a caller that gave up is
            // never retried. A node's answer is waited for a second at most, so that a hung
            // node also fails the client's own topology queries rather than stalling them.
            .response_timeout(DEFAULT_TIMEOUT)
            .overall_response_timeout(None)
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(unavailable)?;
        let waiters = Waiters::cluster(client.clone());
        let connect = async { Cluster::connect(client).await.map_err(unavailable) };
        let connection = within(DEFAULT_TIMEOUT, connect).await?;
        let mut store = Self::over(Connection::Cluster(connection));
        // The template of the connections that look at each primary's replicas.
        store.lookups = clients.first().cloned();
        store.waiters = Some(Arc::new(waiters));
        store.listening_on(clients).looking_for_replicas().await
    }

    /// `self`, refused if its server may evict records.
    async fn refusing_eviction(self) -> Result<Self, StoreError> {
        match self.eviction_policy().await? {
            Some(policy) if policy != "noeviction" => Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                format!(
                    "maxmemory-policy {policy} may evict idempotency records and let a retry \
                     create again: set noeviction, or connect_allowing_eviction"
                ),
            )),
            Some(_) => Ok(self),
            None => {
                tracing::warn!("cannot read the Redis maxmemory-policy; records may be evicted");
                Ok(self)
            }
        }
    }

    /// `self` with a subscriber connection through `clients`, opened on the first wait.
    fn listening_on(mut self, clients: Vec<redis::Client>) -> Self {
        self.notifier = Some(Notifier::new(Channel {
            clients: clients.into(),
            name: Arc::clone(&self.channel),
        }));
        self
    }

    /// A store over a connection manager you configured yourself.
    pub fn from_manager(connection: ConnectionManager) -> Self {
        Self::over(Connection::Server(connection))
    }

    fn over(connection: Connection) -> Self {
        Self {
            connection,
            scripts: Arc::new(Scripts {
                claim: Lua::new(CLAIM),
                renew: Lua::new(RENEW),
                complete: Lua::new(COMPLETE),
                release: Lua::new(RELEASE),
                settle: Lua::new(SETTLE),
                inspect: Lua::new(INSPECT),
                resolve: Lua::new(RESOLVE),
            }),
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            options: StoreOptions::new(),
            replication: Arc::new(Replication::new(Setting::Detect)),
            lookups: None,
            waiters: None,
            channel: Arc::from(CHANGED_CHANNEL),
            notifier: None,
        }
    }
}

/// How a connection to one server is kept: the store's own, and those of its waited writes.
pub(super) fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
        // No response timeout of its own: every call runs within the store's configured
        // timeout instead, which may be longer than the default, and reports `Timeout`.
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}
