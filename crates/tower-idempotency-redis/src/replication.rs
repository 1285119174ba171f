//! Waiting for replicas after a write: which primaries have replicas online (looked at when the
//! store connects, again every second while writes go on, and at once after a wait fell short),
//! and how many replicas a write on a record's primary waits for.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::millis;

/// How a [`RedisStore`](super::RedisStore) waits for replicas after each write (a new claim,
/// a complete, a release, a renewal, an operator's resolve), as
/// [`replica_wait`](super::RedisStore::replica_wait) reads it. Its `Display` is one line for
/// a start-up log.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_redis::ReplicaWait;
///
/// let set = ReplicaWait::Set { replicas: 2, wait: Duration::from_millis(500) };
/// assert_eq!(
///     set.to_string(),
///     "waits for 2 replicas after each write, at most 500ms; a write fewer acknowledge is \
///      refused (503), on a primary without them every write"
/// );
/// assert_eq!(ReplicaWait::Off.to_string(), "off: writes are not waited for on replicas");
/// let found = ReplicaWait::Detected { primaries: 3, replicated: 3 };
/// assert_eq!(
///     found.to_string(),
///     "waits for 1 replica after each write on 3 of 3 primaries (detected)"
/// );
/// let none = ReplicaWait::Detected { primaries: 1, replicated: 0 };
/// assert_eq!(
///     none.to_string(),
///     "no replica online: writes are not waited for (looked at every second)"
/// );
/// assert_eq!(ReplicaWait::Undetected.to_string(), "looks for replicas at the first write");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaWait {
    /// Turned off by [`wait_for_replicas(0, _)`](super::RedisStore::wait_for_replicas).
    Off,
    /// `replicas` replicas after every write, at most `wait`, as
    /// [`wait_for_replicas`](super::RedisStore::wait_for_replicas) set it.
    Set {
        /// The replicas each write waits for.
        replicas: u32,
        /// How long a write waits for them at most.
        wait: Duration,
    },
    /// The default, as last looked at: one replica after each write on a primary that has
    /// any online; `replicated` of the `primaries` have at least one. A replica still in its
    /// first sync, or syncing again after a restart, is not online yet.
    Detected {
        /// The primaries found (1 on one server).
        primaries: usize,
        /// Those of them with at least one replica.
        replicated: usize,
    },
    /// The default before the store has looked: a store over a connection of yours looks at
    /// its first write.
    Undetected,
}

impl std::fmt::Display for ReplicaWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Off => f.write_str("off: writes are not waited for on replicas"),
            Self::Set { replicas, wait } => write!(
                f,
                "waits for {replicas} replica{} after each write, at most {wait:?}; a write \
                 fewer acknowledge is refused (503), on a primary without them every write",
                if replicas == 1 { "" } else { "s" }
            ),
            Self::Detected { replicated: 0, .. } => {
                f.write_str("no replica online: writes are not waited for (looked at every second)")
            }
            Self::Detected {
                primaries,
                replicated,
            } => write!(
                f,
                "waits for 1 replica after each write on {replicated} of {primaries} primar{} \
                 (detected)",
                if primaries == 1 { "y" } else { "ies" }
            ),
            Self::Undetected => f.write_str("looks for replicas at the first write"),
        }
    }
}

/// What the user set.
#[derive(Debug, Clone, Copy)]
pub(super) enum Setting {
    /// Wait for one replica on the primaries that have any (the default).
    Detect,
    /// Wait for this many replicas on every write, this long at most (ms).
    Set { replicas: u32, wait_ms: u64 },
    /// Never wait.
    Off,
}

/// A primary's replicas, as its `INFO replication` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Replicas {
    /// Online: in sync, taking the primary's writes as they come.
    pub(super) online: u32,
    /// Connected but not online yet: waiting for or loading their first sync, or syncing
    /// again after a restart. A `WAIT` would block on them until they are online.
    pub(super) syncing: u32,
}

/// What the store last found of its servers' replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Topology {
    /// Not looked at yet.
    Unknown,
    /// One server and its replicas.
    Server { replicas: Replicas },
    /// The slot ranges of a cluster, each with its primary's online replicas, by first slot;
    /// how many primaries serve slots, how many of them have a replica online, and how many
    /// have replicas that are all still syncing.
    Slots {
        ranges: Vec<SlotRange>,
        primaries: usize,
        replicated: usize,
        syncing: usize,
    },
}

impl Topology {
    /// What the default waits for after a write of `record`, as this topology has it:
    /// one replica where the record's primary has one online, `wait_ms` at most.
    pub(super) fn wanted(&self, record: &str, wait_ms: u64) -> Wanted {
        match self {
            Self::Unknown => Wanted::Unknown,
            Self::Server { replicas } => at_least_one(replicas.online, wait_ms),
            Self::Slots { ranges, .. } => {
                let slot = slot(record.as_bytes());
                let replicas = ranges
                    .iter()
                    .find(|range| range.first <= slot && slot <= range.last)
                    .map_or(0, |range| range.replicas);
                at_least_one(replicas, wait_ms)
            }
        }
    }

    /// The primaries whose writes the default waits for no replica although they have
    /// some: every replica they have is still syncing.
    pub(super) fn syncing_only(&self) -> usize {
        match self {
            Self::Unknown => 0,
            Self::Server { replicas } => usize::from(replicas.online == 0 && replicas.syncing > 0),
            Self::Slots { syncing, .. } => *syncing,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlotRange {
    pub(super) first: u16,
    pub(super) last: u16,
    pub(super) replicas: u32,
}

/// How often the default looks at the replicas again while writes go on.
pub(super) const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// A store's replica wait: the setting and, for the default, what was found and when.
#[derive(Debug)]
pub(super) struct Replication {
    pub(super) setting: Setting,
    topology: RwLock<Topology>,
    /// When the topology was read, in ms since `epoch`; 0 asks for a look at the next write.
    read_at: AtomicU64,
    epoch: Instant,
    /// Whether a look is under way (one at a time).
    looking: AtomicBool,
    /// The primaries whose replicas were all syncing at the last look.
    syncing: AtomicUsize,
    /// When the last look that found something began, in ms since `epoch` (plus one; 0:
    /// none did). Unlike `read_at`, never cleared by a short wait.
    looked_from: AtomicU64,
    /// One look at a time after short waits, and the last one's beginning and finding
    /// (`None`: it failed): the calls that fell short together share one.
    pub(super) look_now: tokio::sync::Mutex<Option<(u64, Option<Topology>)>>,
}

/// What a write waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    /// Nothing.
    Nothing,
    /// This many replicas, this long at most (ms).
    Replicas(u32, u64),
    /// Not known: look first.
    Unknown,
}

impl Replication {
    pub(super) fn new(setting: Setting) -> Self {
        Self {
            setting,
            topology: RwLock::new(Topology::Unknown),
            read_at: AtomicU64::new(0),
            epoch: Instant::now(),
            looking: AtomicBool::new(false),
            syncing: AtomicUsize::new(0),
            looked_from: AtomicU64::new(0),
            look_now: tokio::sync::Mutex::new(None),
        }
    }

    /// What a write of `record` waits for, `default_wait_ms` at most under the default.
    pub(super) fn wanted(&self, record: &str, default_wait_ms: u64) -> Wanted {
        match self.setting {
            Setting::Off => Wanted::Nothing,
            Setting::Set { replicas, wait_ms } => Wanted::Replicas(replicas, wait_ms),
            Setting::Detect => self
                .topology
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .wanted(record, default_wait_ms),
        }
    }

    /// Whether the default should look again now: its last look is older than
    /// [`LOOK_AGAIN`], or a wait fell short since, and no look is under way. A `true` takes
    /// the turn: the caller looks, then calls [`found`](Self::found) or
    /// [`not_found`](Self::not_found).
    pub(super) fn take_turn(&self) -> bool {
        if !matches!(self.setting, Setting::Detect) {
            return false;
        }
        let read_at = self.read_at.load(Ordering::Acquire);
        let due = read_at == 0 || self.now_ms().saturating_sub(read_at) >= millis(LOOK_AGAIN);
        due && self
            .looking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Records what a look found, and ends the turn. Says in a log line, and in the
    /// [`REDIS_SYNCING_PRIMARIES`](crate::REDIS_SYNCING_PRIMARIES) gauge, when
    /// primaries that have replicas have none online to wait for, and when they have again.
    pub(super) fn found(&self, topology: Topology, begun: u64) {
        let latest = self
            .looked_from
            .fetch_max(begun.saturating_add(1), Ordering::AcqRel);
        if latest > begun.saturating_add(1) {
            // A look begun later found something already: this one is older news.
            self.looking.store(false, Ordering::Release);
            return;
        }
        let syncing = topology.syncing_only();
        let before = self.syncing.swap(syncing, Ordering::AcqRel);
        if syncing != before {
            if syncing > 0 {
                tracing::warn!(
                    primaries = syncing,
                    "Redis replicas are connected but none is online yet (a first sync, or a \
                     resync after a restart): writes on those primaries are not waited for \
                     until one is"
                );
            } else {
                tracing::info!("every Redis primary with replicas has one online to wait for");
            }
        }
        #[cfg(feature = "metrics")]
        {
            #[allow(clippy::cast_precision_loss)]
            let syncing = syncing as f64;
            ::metrics::gauge!(crate::REDIS_SYNCING_PRIMARIES).set(syncing);
        }
        *self
            .topology
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topology;
        self.read_at.store(self.now_ms().max(1), Ordering::Release);
        self.looking.store(false, Ordering::Release);
    }

    /// Ends the turn of a look that failed: the next write looks again.
    pub(super) fn not_found(&self) {
        self.looking.store(false, Ordering::Release);
    }

    /// A wait fell short: the primary may have lost its replica or its slots, so the next
    /// write looks again.
    pub(super) fn fell_short(&self) {
        self.read_at.store(0, Ordering::Release);
    }

    /// The wait as the user would read it.
    pub(super) fn describe(&self) -> ReplicaWait {
        match self.setting {
            Setting::Off => ReplicaWait::Off,
            Setting::Set { replicas, wait_ms } => ReplicaWait::Set {
                replicas,
                wait: Duration::from_millis(wait_ms),
            },
            Setting::Detect => match &*self
                .topology
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
            {
                Topology::Unknown => ReplicaWait::Undetected,
                Topology::Server { replicas } => ReplicaWait::Detected {
                    primaries: 1,
                    replicated: usize::from(replicas.online > 0),
                },
                Topology::Slots {
                    primaries,
                    replicated,
                    ..
                } => ReplicaWait::Detected {
                    primaries: *primaries,
                    replicated: *replicated,
                },
            },
        }
    }

    /// Now, in ms since the store's epoch: when a look begins, or a wait fell short.
    pub(super) fn now_ms(&self) -> u64 {
        millis(self.epoch.elapsed())
    }
}

fn at_least_one(replicas: u32, wait_ms: u64) -> Wanted {
    if replicas > 0 {
        Wanted::Replicas(1, wait_ms)
    } else {
        Wanted::Nothing
    }
}

/// The replicas of an `INFO replication` answer: each `slaveN:…,state=…` line of a primary,
/// online or not yet, checked against its `connected_slaves`; none of a replica (it takes no
/// writes). `None` if the answer says neither.
pub(super) fn server_replicas(info: &str) -> Option<Replicas> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    match field("role")? {
        "master" => {
            let connected: u32 = field("connected_slaves")?.parse().ok()?;
            let mut online = 0u32;
            for line in info.lines() {
                let Some((name, fields)) = line.trim_end().split_once(':') else {
                    continue;
                };
                let numbered = name
                    .strip_prefix("slave")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                if numbered && fields.split(',').any(|field| field == "state=online") {
                    online = online.saturating_add(1);
                }
            }
            let online = online.min(connected);
            Some(Replicas {
                online,
                syncing: connected - online,
            })
        }
        "slave" | "replica" => Some(Replicas::default()),
        _ => None,
    }
}

/// A primary of a cluster as `CLUSTER NODES` lists it: its address, its slot ranges, and how
/// many replicas the cluster lists for it, failing ones too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClusterPrimary {
    pub(super) node: super::connection::Node,
    pub(super) slots: Vec<(u16, u16)>,
    pub(super) listed: u32,
}

/// The primaries serving slots in a `CLUSTER NODES` answer. Each line is `id
/// address@cport[,hostname] flags primary-id ping pong epoch link slot…`, a slot being `N` or
/// `N-M` (`[…]`, a slot moving, is skipped). `None` if a line is unreadable.
pub(super) fn cluster_primaries(nodes: &str) -> Option<Vec<ClusterPrimary>> {
    struct Line<'a> {
        id: &'a str,
        address: &'a str,
        flags: Vec<&'a str>,
        primary: &'a str,
        slots: Vec<&'a str>,
    }
    let mut lines = Vec::new();
    for line in nodes.lines().filter(|line| !line.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        lines.push(Line {
            id: fields[0],
            address: fields[1],
            flags: fields[2].split(',').collect(),
            primary: fields[3],
            slots: fields[8..].to_vec(),
        });
    }
    let unknown = |line: &Line<'_>| {
        line.flags
            .iter()
            .any(|flag| *flag == "handshake" || *flag == "noaddr")
    };
    let mut primaries = Vec::new();
    for primary in lines.iter().filter(|line| line.flags.contains(&"master")) {
        let mut slots = Vec::new();
        for range in primary.slots.iter().filter(|slots| !slots.starts_with('[')) {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            slots.push((first.parse().ok()?, last.parse().ok()?));
        }
        if slots.is_empty() {
            continue;
        }
        let address = primary.address.split(['@', ',']).next()?;
        let (host, port) = address.rsplit_once(':')?;
        let listed = lines
            .iter()
            .filter(|line| line.primary == primary.id && !unknown(line))
            .count();
        primaries.push(ClusterPrimary {
            node: super::connection::Node {
                host: host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port: port.parse().ok()?,
            },
            slots,
            listed: u32::try_from(listed).unwrap_or(u32::MAX),
        });
    }
    Some(primaries)
}

/// The slot ranges of a cluster's primaries, each with the replicas its primary has online,
/// by first slot; a slot past 16383 is unreadable (`None`).
pub(super) fn slot_ranges(primaries: &[(ClusterPrimary, Replicas)]) -> Option<Topology> {
    let (mut ranges, mut replicated, mut syncing) = (Vec::new(), 0, 0);
    for (primary, replicas) in primaries {
        replicated += usize::from(replicas.online > 0);
        syncing += usize::from(replicas.online == 0 && replicas.syncing > 0);
        for &(first, last) in &primary.slots {
            if first > last || last > 16383 {
                return None;
            }
            ranges.push(SlotRange {
                first,
                last,
                replicas: replicas.online,
            });
        }
    }
    ranges.sort_by_key(|range| range.first);
    Some(Topology::Slots {
        ranges,
        primaries: primaries.len(),
        replicated,
        syncing,
    })
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key without
/// one, modulo 16384. Written here because the driver computes it but does not hand out the
/// number; a test holds it equal to the driver's.
pub(super) fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&byte| byte == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    #[test]
    fn the_slot_of_a_key_is_the_drivers() {
        let keys: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"a".to_vec(),
            b"idempotency:sha256:0123".to_vec(),
            b"{user1000}.following".to_vec(),
            b"foo{}{bar}".to_vec(),
            b"foo{{bar}}zap".to_vec(),
            b"foo{bar}{zap}".to_vec(),
            b"{".to_vec(),
            b"}{".to_vec(),
            (0u8..=255).collect(),
        ];
        for key in keys {
            assert_eq!(
                Slot::new(slot(&key)),
                Some(Slot::for_key(&key)),
                "{:?}",
                String::from_utf8_lossy(&key)
            );
        }
        assert_eq!(slot(b"123456789"), 0x31C3, "the CRC16 check value");
    }

    #[test]
    fn info_replication_tells_online_replicas_from_syncing_ones() {
        let primary = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
            slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=7003,state=online,offset=42,lag=1\r\n\
            master_failover_state:no-failover\r\n";
        let replicas = |online, syncing| Some(Replicas { online, syncing });
        assert_eq!(server_replicas(primary), replicas(2, 1));
        let first_sync = "role:master\nconnected_slaves:1\n\
            slave0:ip=127.0.0.1,port=7001,state=send_bulk,offset=0,lag=0\n";
        assert_eq!(server_replicas(first_sync), replicas(0, 1));
        // Lines that only look like a replica's are not counted, nor more than are connected.
        let odd = "role:master\nconnected_slaves:3\nslave:state=online\nslavex:state=online\n\
            slave0:state=onlinex\nslave1:ip=a,state=online\n";
        assert_eq!(server_replicas(odd), replicas(1, 2));
        let more = "role:master\nconnected_slaves:1\n\
            slave1:ip=a,state=online\nslave2:ip=b,state=online\n";
        assert_eq!(server_replicas(more), replicas(1, 0));
        assert_eq!(
            server_replicas("role:master\nconnected_slaves:0\n"),
            replicas(0, 0)
        );
        assert_eq!(
            server_replicas("role:slave\nmaster_host:10.0.0.1\n"),
            replicas(0, 0)
        );
        for unreadable in [
            "",
            "role:master\n",
            "role:sentinel\n",
            "role:master\nconnected_slaves:x",
        ] {
            assert_eq!(server_replicas(unreadable), None, "{unreadable:?}");
        }
        let syncing = Topology::Server {
            replicas: Replicas {
                online: 0,
                syncing: 2,
            },
        };
        assert_eq!(syncing.syncing_only(), 1);
        let online = Topology::Server {
            replicas: Replicas {
                online: 1,
                syncing: 2,
            },
        };
        assert_eq!(online.syncing_only(), 0);
        assert_eq!(Topology::Unknown.syncing_only(), 0);
    }

    #[test]
    fn cluster_nodes_give_each_primary_its_address_slots_and_listed_replicas() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-b1]
b1 127.0.0.1:7001@17001,b.example master - 0 1 2 connected 5461-10922 16000
c1 127.0.0.1:7002@17002 master,fail - 0 1 3 disconnected
a2 127.0.0.1:7100@17100 slave a1 0 1 1 connected
b2 127.0.0.1:7101@17101 slave b1 0 1 2 connected
b3 127.0.0.1:7102@17102 slave,fail? b1 0 1 2 connected
d1 [::1]:7003@17003 master - 0 1 4 connected 10923-15999
d2 127.0.0.1:7103@17103 slave,fail d1 0 1 4 disconnected
e1 127.0.0.1:7004@17004 master - 0 1 5 connected 16001-16383
e2 :0@0 slave,noaddr e1 0 1 5 disconnected
e3 127.0.0.1:7104@17104 handshake - 0 1 0 disconnected
";
        let primary = |host: &str, port, slots: &[(u16, u16)], listed| ClusterPrimary {
            node: crate::connection::Node {
                host: host.to_owned(),
                port,
            },
            slots: slots.to_vec(),
            listed,
        };
        let primaries = cluster_primaries(nodes).unwrap();
        assert_eq!(
            primaries,
            vec![
                primary("127.0.0.1", 7000, &[(0, 5460)], 1),
                primary("127.0.0.1", 7001, &[(5461, 10922), (16000, 16000)], 2),
                primary("::1", 7003, &[(10923, 15999)], 1),
                primary("127.0.0.1", 7004, &[(16001, 16383)], 0),
            ]
        );
        assert_eq!(cluster_primaries(""), Some(vec![]));
        for unreadable in [
            "a1 127.0.0.1:7000@17000 master -",
            "a1 127.0.0.1:7000@17000 master - 0 0 1 connected x-5460",
            "a1 127.0.0.1:7000@17000 master - 0 0 1 connected 0-99999",
            "a1 127.0.0.1@17000 master - 0 0 1 connected 0-5",
            "a1 127.0.0.1:x@17000 master - 0 0 1 connected 0-5",
        ] {
            assert_eq!(cluster_primaries(unreadable), None, "{unreadable:?}");
        }

        // Each range carries its primary's online replicas.
        let replicas = |online, syncing| Replicas { online, syncing };
        let found: Vec<_> = primaries
            .into_iter()
            .zip([
                replicas(1, 0),
                replicas(2, 1),
                replicas(0, 1),
                replicas(0, 0),
            ])
            .collect();
        let range = |first, last, replicas| SlotRange {
            first,
            last,
            replicas,
        };
        assert_eq!(
            slot_ranges(&found),
            Some(Topology::Slots {
                ranges: vec![
                    range(0, 5460, 1),
                    range(5461, 10922, 2),
                    range(10923, 15999, 0),
                    range(16000, 16000, 2),
                    range(16001, 16383, 0),
                ],
                primaries: 4,
                replicated: 2,
                syncing: 1,
            })
        );
        assert_eq!(
            slot_ranges(&[]),
            Some(Topology::Slots {
                ranges: vec![],
                primaries: 0,
                replicated: 0,
                syncing: 0,
            })
        );
        for slots in [(5, 4), (0, 16384)] {
            let mut wrong = found.clone();
            wrong[0].0.slots = vec![slots];
            assert_eq!(slot_ranges(&wrong), None, "{slots:?}");
        }
    }

    #[test]
    fn the_default_waits_for_one_replica_where_the_records_primary_has_any() {
        let online = |online| Replicas { online, syncing: 0 };
        let replication = Replication::new(Setting::Detect);
        assert_eq!(replication.wanted("k", 100), Wanted::Unknown);
        assert_eq!(replication.describe(), ReplicaWait::Undetected);
        let a = b"a";
        let on_a = slot(a);
        replication.found(
            Topology::Slots {
                ranges: vec![
                    SlotRange {
                        first: 0,
                        last: on_a,
                        replicas: 3,
                    },
                    SlotRange {
                        first: on_a + 1,
                        last: 16383,
                        replicas: 0,
                    },
                ],
                primaries: 2,
                replicated: 1,
                syncing: 0,
            },
            0,
        );
        assert_eq!(replication.wanted("a", 100), Wanted::Replicas(1, 100));
        let elsewhere = (0..)
            .map(|i| format!("k{i}"))
            .find(|key| slot(key.as_bytes()) > on_a)
            .unwrap();
        assert_eq!(replication.wanted(&elsewhere, 100), Wanted::Nothing);
        assert_eq!(
            replication.describe(),
            ReplicaWait::Detected {
                primaries: 2,
                replicated: 1
            }
        );
        replication.found(
            Topology::Server {
                replicas: online(2),
            },
            0,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Replicas(1, 7));
        assert_eq!(
            replication.describe(),
            ReplicaWait::Detected {
                primaries: 1,
                replicated: 1
            }
        );
        replication.found(
            Topology::Server {
                replicas: Replicas {
                    online: 1,
                    syncing: 1,
                },
            },
            0,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Replicas(1, 7));
        assert_eq!(replication.syncing.load(Ordering::Acquire), 0);
        // Replicas all syncing: none to wait for, and the store says so.
        replication.found(
            Topology::Server {
                replicas: Replicas {
                    online: 0,
                    syncing: 2,
                },
            },
            0,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing);
        assert_eq!(replication.syncing.load(Ordering::Acquire), 1);
        replication.found(
            Topology::Server {
                replicas: online(0),
            },
            0,
        );
        assert_eq!(replication.syncing.load(Ordering::Acquire), 0);
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing);
        assert_eq!(
            replication.describe(),
            ReplicaWait::Detected {
                primaries: 1,
                replicated: 0
            }
        );
        // A slot no range covers (a cluster missing slots) waits for nothing.
        replication.found(
            Topology::Slots {
                ranges: Vec::new(),
                primaries: 0,
                replicated: 0,
                syncing: 0,
            },
            0,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing);
    }

    /// Each look sets the gauge of primaries whose replicas are all syncing.
    #[cfg(feature = "metrics")]
    #[test]
    fn each_look_reports_the_primaries_with_only_syncing_replicas() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let scrape = recorder.handle();
        let _local = ::metrics::set_default_local_recorder(&recorder);
        let gauge = || {
            let line = format!("{} ", crate::REDIS_SYNCING_PRIMARIES);
            scrape
                .render()
                .lines()
                .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
        };
        let replication = Replication::new(Setting::Detect);
        let syncing = Replicas {
            online: 0,
            syncing: 1,
        };
        replication.found(
            Topology::Slots {
                ranges: Vec::new(),
                primaries: 3,
                replicated: 1,
                syncing: 2,
            },
            0,
        );
        assert_eq!(gauge().as_deref(), Some("2"));
        replication.found(Topology::Server { replicas: syncing }, 0);
        assert_eq!(gauge().as_deref(), Some("1"));
        replication.found(
            Topology::Server {
                replicas: Replicas::default(),
            },
            0,
        );
        assert_eq!(gauge().as_deref(), Some("0"));
    }

    /// A look that finds primaries whose replicas are all syncing says so in a warning, once
    /// until that changes, and says when every primary has one online again.
    #[test]
    fn a_look_says_when_replicas_are_all_syncing_and_when_one_is_online_again() {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        let said = || {
            String::from_utf8_lossy(
                &lines
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )
            .into_owned()
        };
        let syncing = Topology::Server {
            replicas: Replicas {
                online: 0,
                syncing: 1,
            },
        };
        let online = Topology::Server {
            replicas: Replicas {
                online: 1,
                syncing: 0,
            },
        };
        tracing::subscriber::with_default(subscriber, || {
            let replication = Replication::new(Setting::Detect);
            replication.found(online.clone(), 0);
            assert_eq!(said(), "", "nothing to say");
            replication.found(syncing.clone(), 0);
            replication.found(syncing.clone(), 0);
            assert_eq!(
                said().matches("none is online yet").count(),
                1,
                "{}",
                said()
            );
            assert!(said().contains("WARN"), "{}", said());
            assert!(!said().contains("has one online"), "{}", said());
            replication.found(online.clone(), 0);
            assert!(said().contains("has one online to wait for"), "{}", said());
            assert_eq!(
                said().matches("none is online yet").count(),
                1,
                "{}",
                said()
            );
        });
    }

    /// A look that began before the last one stored keeps nothing: its news is older.
    #[test]
    fn an_older_look_does_not_overwrite_a_newer_one() {
        let replication = Replication::new(Setting::Detect);
        let online = |online| Replicas { online, syncing: 0 };
        replication.found(
            Topology::Server {
                replicas: online(1),
            },
            10,
        );
        replication.found(
            Topology::Server {
                replicas: online(0),
            },
            5,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Replicas(1, 7));
        replication.found(
            Topology::Server {
                replicas: online(0),
            },
            10,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing, "as new: kept");
        replication.found(
            Topology::Server {
                replicas: online(1),
            },
            11,
        );
        assert_eq!(replication.wanted("a", 7), Wanted::Replicas(1, 7));
    }

    #[test]
    fn a_setting_is_kept_whatever_is_found() {
        let online = |online| Replicas { online, syncing: 0 };
        let set = Replication::new(Setting::Set {
            replicas: 2,
            wait_ms: 50,
        });
        let off = Replication::new(Setting::Off);
        for replication in [&set, &off] {
            assert!(!replication.take_turn(), "a setting never looks");
            replication.found(
                Topology::Server {
                    replicas: online(0),
                },
                0,
            );
        }
        assert_eq!(set.wanted("a", 7), Wanted::Replicas(2, 50));
        assert_eq!(off.wanted("a", 7), Wanted::Nothing);
    }

    #[test]
    fn the_default_looks_again_once_a_second_one_at_a_time_and_at_once_after_a_short_wait() {
        let online = |online| Replicas { online, syncing: 0 };
        let replication = Replication::new(Setting::Detect);
        assert!(replication.take_turn(), "never looked");
        assert!(!replication.take_turn(), "one look at a time");
        replication.not_found();
        assert!(replication.take_turn(), "a failed look is tried again");
        replication.found(
            Topology::Server {
                replicas: online(1),
            },
            0,
        );
        assert!(!replication.take_turn(), "just looked");
        replication.fell_short();
        assert!(replication.take_turn(), "a short wait looks again");
        replication.found(
            Topology::Server {
                replicas: online(1),
            },
            0,
        );
        // As if a second had passed.
        replication.read_at.store(1, Ordering::Release);
        let replication = Replication {
            epoch: Instant::now() - LOOK_AGAIN - Duration::from_millis(5),
            ..replication
        };
        assert!(replication.take_turn(), "a second later");
    }
}
