//! Waiting for replicas after a write: which primaries have replicas (looked at when the store
//! connects, again every second while writes go on, and at once after a wait fell short), and
//! how many replicas a write on a record's primary waits for.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::millis;

/// How a [`RedisStore`](super::RedisStore) waits for replicas after each write (a new claim,
/// a complete, a release, a renewal, an operator's resolve), as
/// [`replica_wait`](super::RedisStore::replica_wait) reads it. Its `Display` is one line for
/// a start-up log.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::redis::ReplicaWait;
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
///     "no replica found: writes are not waited for (looked at every second)"
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
    /// any; `replicated` of the `primaries` have at least one.
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
                f.write_str("no replica found: writes are not waited for (looked at every second)")
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

/// What the store last found of its servers' replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Topology {
    /// Not looked at yet.
    Unknown,
    /// One server and its connected replicas.
    Server { replicas: u32 },
    /// The slot ranges of a cluster, each with its primary's replicas, by first slot; and
    /// how many primaries serve slots, and how many of them have a replica.
    Slots {
        ranges: Vec<SlotRange>,
        primaries: usize,
        replicated: usize,
    },
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
        }
    }

    /// What a write of `record` waits for, `default_wait_ms` at most under the default.
    pub(super) fn wanted(&self, record: &str, default_wait_ms: u64) -> Wanted {
        match self.setting {
            Setting::Off => Wanted::Nothing,
            Setting::Set { replicas, wait_ms } => Wanted::Replicas(replicas, wait_ms),
            Setting::Detect => {
                let topology = self
                    .topology
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match &*topology {
                    Topology::Unknown => Wanted::Unknown,
                    Topology::Server { replicas } => at_least_one(*replicas, default_wait_ms),
                    Topology::Slots { ranges, .. } => {
                        let slot = slot(record.as_bytes());
                        let replicas = ranges
                            .iter()
                            .find(|range| range.first <= slot && slot <= range.last)
                            .map_or(0, |range| range.replicas);
                        at_least_one(replicas, default_wait_ms)
                    }
                }
            }
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

    /// Records what a look found, and ends the turn.
    pub(super) fn found(&self, topology: Topology) {
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
                    replicated: usize::from(*replicas > 0),
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

    fn now_ms(&self) -> u64 {
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

/// The connected replicas of an `INFO replication` answer: `connected_slaves` of a primary,
/// 0 of a replica (it takes no writes). `None` if the answer says neither.
pub(super) fn server_replicas(info: &str) -> Option<u32> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    match field("role")? {
        "master" => field("connected_slaves")?.parse().ok(),
        "slave" | "replica" => Some(0),
        _ => None,
    }
}

/// The slot ranges of a `CLUSTER NODES` answer, each with its primary's replicas, failing
/// ones too (the cluster may promote one when it is back, with what it has), by first slot. Each line is `id address flags primary-id ping pong epoch link
/// slot…`, a slot being `N` or `N-M` (`[…]`, a slot moving, is skipped). `None` if a line is
/// unreadable. (`CLUSTER SLOTS` lists a replica only once it has a replication offset, which
/// the replicas of a cluster that took no write yet do not have.)
pub(super) fn node_ranges(nodes: &str) -> Option<Topology> {
    struct Line<'a> {
        id: &'a str,
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
            flags: fields[2].split(',').collect(),
            primary: fields[3],
            slots: fields[8..].to_vec(),
        });
    }
    // A failing replica counts: the cluster may still promote it, with what it has.
    let unknown = |line: &Line<'_>| {
        line.flags
            .iter()
            .any(|flag| *flag == "handshake" || *flag == "noaddr")
    };
    let (mut ranges, mut primaries, mut replicated) = (Vec::new(), 0, 0);
    for primary in lines.iter().filter(|line| line.flags.contains(&"master")) {
        let replicas = lines
            .iter()
            .filter(|line| line.primary == primary.id && !unknown(line))
            .count();
        if primary.slots.iter().any(|slots| !slots.starts_with('[')) {
            primaries += 1;
            replicated += usize::from(replicas > 0);
        }
        for slots in primary.slots.iter().filter(|slots| !slots.starts_with('[')) {
            let (first, last) = slots.split_once('-').unwrap_or((slots, slots));
            ranges.push(SlotRange {
                first: first.parse().ok()?,
                last: last.parse().ok()?,
                replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
            });
        }
    }
    ranges.sort_by_key(|range| range.first);
    Some(Topology::Slots {
        ranges,
        primaries,
        replicated,
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
    fn info_replication_gives_a_primarys_connected_replicas() {
        let primary = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=…\r\n";
        assert_eq!(server_replicas(primary), Some(2));
        assert_eq!(
            server_replicas("role:master\nconnected_slaves:0\n"),
            Some(0)
        );
        assert_eq!(
            server_replicas("role:slave\nmaster_host:10.0.0.1\n"),
            Some(0)
        );
        for unreadable in [
            "",
            "role:master\n",
            "role:sentinel\n",
            "role:master\nconnected_slaves:x",
        ] {
            assert_eq!(server_replicas(unreadable), None, "{unreadable:?}");
        }
    }

    #[test]
    fn cluster_nodes_give_each_ranges_replicas_failing_ones_too_by_first_slot() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-b1]
b1 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922 16000
c1 127.0.0.1:7002@17002 master,fail - 0 1 3 disconnected
a2 127.0.0.1:7100@17100 slave a1 0 1 1 connected
b2 127.0.0.1:7101@17101 slave b1 0 1 2 connected
b3 127.0.0.1:7102@17102 slave,fail? b1 0 1 2 connected
d1 127.0.0.1:7003@17003 master - 0 1 4 connected 10923-15999
d2 127.0.0.1:7103@17103 slave,fail d1 0 1 4 disconnected
e1 127.0.0.1:7004@17004 master - 0 1 5 connected 16001-16383
e2 :0@0 slave,noaddr e1 0 1 5 disconnected
e3 127.0.0.1:7104@17104 handshake - 0 1 0 disconnected
";
        let range = |first, last, replicas| SlotRange {
            first,
            last,
            replicas,
        };
        assert_eq!(
            node_ranges(nodes),
            Some(Topology::Slots {
                ranges: vec![
                    range(0, 5460, 1),
                    range(5461, 10922, 2),
                    range(10923, 15999, 1),
                    range(16000, 16000, 2),
                    range(16001, 16383, 0),
                ],
                primaries: 4,
                replicated: 3,
            })
        );
        assert_eq!(
            node_ranges(""),
            Some(Topology::Slots {
                ranges: vec![],
                primaries: 0,
                replicated: 0
            })
        );
        for unreadable in [
            "a1 127.0.0.1:7000@17000 master -",
            "a1 127.0.0.1:7000@17000 master - 0 0 1 connected x-5460",
            "a1 127.0.0.1:7000@17000 master - 0 0 1 connected 0-99999",
        ] {
            assert_eq!(node_ranges(unreadable), None, "{unreadable:?}");
        }
    }

    #[test]
    fn the_default_waits_for_one_replica_where_the_records_primary_has_any() {
        let replication = Replication::new(Setting::Detect);
        assert_eq!(replication.wanted("k", 100), Wanted::Unknown);
        assert_eq!(replication.describe(), ReplicaWait::Undetected);
        let a = b"a";
        let on_a = slot(a);
        replication.found(Topology::Slots {
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
        });
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
        replication.found(Topology::Server { replicas: 2 });
        assert_eq!(replication.wanted("a", 7), Wanted::Replicas(1, 7));
        assert_eq!(
            replication.describe(),
            ReplicaWait::Detected {
                primaries: 1,
                replicated: 1
            }
        );
        replication.found(Topology::Server { replicas: 0 });
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing);
        assert_eq!(
            replication.describe(),
            ReplicaWait::Detected {
                primaries: 1,
                replicated: 0
            }
        );
        // A slot no range covers (a cluster missing slots) waits for nothing.
        replication.found(Topology::Slots {
            ranges: Vec::new(),
            primaries: 0,
            replicated: 0,
        });
        assert_eq!(replication.wanted("a", 7), Wanted::Nothing);
    }

    #[test]
    fn a_setting_is_kept_whatever_is_found() {
        let set = Replication::new(Setting::Set {
            replicas: 2,
            wait_ms: 50,
        });
        let off = Replication::new(Setting::Off);
        for replication in [&set, &off] {
            assert!(!replication.take_turn(), "a setting never looks");
            replication.found(Topology::Server { replicas: 0 });
        }
        assert_eq!(set.wanted("a", 7), Wanted::Replicas(2, 50));
        assert_eq!(off.wanted("a", 7), Wanted::Nothing);
    }

    #[test]
    fn the_default_looks_again_once_a_second_one_at_a_time_and_at_once_after_a_short_wait() {
        let replication = Replication::new(Setting::Detect);
        assert!(replication.take_turn(), "never looked");
        assert!(!replication.take_turn(), "one look at a time");
        replication.not_found();
        assert!(replication.take_turn(), "a failed look is tried again");
        replication.found(Topology::Server { replicas: 1 });
        assert!(!replication.take_turn(), "just looked");
        replication.fell_short();
        assert!(replication.take_turn(), "a short wait looks again");
        replication.found(Topology::Server { replicas: 1 });
        // As if a second had passed.
        replication.read_at.store(1, Ordering::Release);
        let replication = Replication {
            epoch: Instant::now() - LOOK_AGAIN - Duration::from_millis(5),
            ..replication
        };
        assert!(replication.take_turn(), "a second later");
    }
}
