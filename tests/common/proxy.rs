//! A loopback TCP proxy in front of a backend, which cuts, mutes and counts PostgreSQL round
//! trips.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A loopback TCP proxy in front of a backend. `cut()` drops every connection and refuses new
/// ones (the backend is "down"); `restore()` lets traffic through again. When `count_pg` is
/// set it counts PostgreSQL round trips: the client's `Sync` and simple `Query` messages that
/// end a statement (`round_trips`), and apart from them the bare `Sync`s that only check a
/// connection (`pings`: sqlx sends one each time a pooled connection goes back to its pool).
pub struct Proxy {
    pub addr: SocketAddr,
    up: watch::Sender<bool>,
    /// While set, the backend's answers are dropped: requests arrive and take effect, and
    /// their answers are lost.
    muted: Arc<AtomicBool>,
    /// Once a client's bytes hold this, the backend's answers are dropped (`muted`).
    mute_on: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    /// The next client bytes to arrive, on any connection, are held this long first.
    hold_next: Arc<std::sync::Mutex<Option<std::time::Duration>>>,
    pub round_trips: Arc<AtomicUsize>,
    pub pings: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr, count_pg: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, _) = watch::channel(true);
        let round_trips = Arc::new(AtomicUsize::new(0));
        let pings = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let muted = Arc::new(AtomicBool::new(false));
        let mute_on = Arc::new(std::sync::Mutex::new(None));
        let hold_next = Arc::new(std::sync::Mutex::new(None));
        let (up_rx, counter, stopped, mute, trigger, hold) = (
            up.subscribe(),
            (Arc::clone(&round_trips), Arc::clone(&pings)),
            Arc::clone(&stop),
            Arc::clone(&muted),
            Arc::clone(&mute_on),
            Arc::clone(&hold_next),
        );
        tokio::spawn(async move {
            while !stopped.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept().await else {
                    break;
                };
                let mut up = up_rx.clone();
                if !*up.borrow() {
                    drop(client); // refused while cut
                    continue;
                }
                let counter = counter.clone();
                let mute = Arc::clone(&mute);
                let trigger = Arc::clone(&trigger);
                let hold = Arc::clone(&hold);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        () = pipe(client, server, count_pg.then_some(counter), mute, trigger, hold) => {}
                        _ = up.wait_for(|up| !*up) => {} // cut: drop both ends
                    }
                });
            }
        });
        Self {
            addr,
            up,
            muted,
            mute_on,
            hold_next,
            round_trips,
            pings,
            stop,
        }
    }

    /// Drops the backend's answers from now on, until `cut()` and `restore()`.
    pub fn mute(&self) {
        self.muted.store(true, Ordering::SeqCst);
    }

    /// Drops the backend's answers from the first client request whose bytes hold `bytes` on
    /// (a `COMMIT`, say: it arrives and takes effect, its answer is lost), until `restore()`.
    pub fn mute_on(&self, bytes: &[u8]) {
        *self.mute_on.lock().unwrap() = Some(bytes.to_vec());
    }

    /// Holds the next bytes a client sends, on whichever connection, for `delay` before they go
    /// on to the backend (a statement delayed on its way, as a lost packet or a slow network
    /// delays one); that connection's later bytes wait behind them.
    pub fn hold_next(&self, delay: std::time::Duration) {
        *self.hold_next.lock().unwrap() = Some(delay);
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn restore(&self) {
        *self.mute_on.lock().unwrap() = None;
        self.muted.store(false, Ordering::SeqCst);
        self.up.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

/// Copies both ways until either side closes, counting PostgreSQL round trips client-side.
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    counter: Option<(Arc<AtomicUsize>, Arc<AtomicUsize>)>,
    muted: Arc<AtomicBool>,
    mute_on: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    hold_next: Arc<std::sync::Mutex<Option<std::time::Duration>>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mute = Arc::clone(&muted);
    let upstream = async move {
        let mut parser = PgMessages::default();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some((round_trips, pings)) = &counter {
                let (ended, pinged) = parser.feed(&buffer[..n]);
                round_trips.fetch_add(ended, Ordering::SeqCst);
                pings.fetch_add(pinged, Ordering::SeqCst);
            }
            let held = hold_next.lock().unwrap().take();
            if let Some(delay) = held {
                tokio::time::sleep(delay).await;
            }
            let trigger = mute_on.lock().unwrap().clone();
            if let Some(trigger) = trigger
                && buffer[..n]
                    .windows(trigger.len())
                    .any(|window| window == trigger)
            {
                mute.store(true, Ordering::SeqCst);
            }
            if server_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if muted.load(Ordering::SeqCst) {
                continue; // the answer is lost
            }
            if client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// Splits the client side of the PostgreSQL protocol into messages and counts the ones that
/// end a round trip: `S` (Sync) and `Q` (simple query). The first message (startup or SSL
/// request) has no type byte.
#[derive(Default)]
struct PgMessages {
    started: bool,
    header: Vec<u8>,
    skip: usize,
    /// Messages since the last one that ended a round trip.
    since: usize,
}

impl PgMessages {
    /// The statement round trips and the pings `bytes` end.
    fn feed(&mut self, mut bytes: &[u8]) -> (usize, usize) {
        let (mut count, mut pings) = (0, 0);
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let header_len = if self.started { 5 } else { 4 };
            let n = (header_len - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < header_len {
                break;
            }
            let len_bytes: [u8; 4] = self.header[header_len - 4..].try_into().unwrap();
            let len = u32::from_be_bytes(len_bytes) as usize;
            if self.started {
                match self.header[0] {
                    b'S' if self.since == 0 => pings += 1,
                    b'S' | b'Q' => count += 1,
                    _ => self.since += 1,
                }
                if matches!(self.header[0], b'S' | b'Q') {
                    self.since = 0;
                }
            }
            // An SSL request is answered with one byte and followed by the real startup.
            let ssl_request = !self.started && len == 8;
            self.skip = len.saturating_sub(4);
            self.header.clear();
            if !ssl_request {
                self.started = true;
            }
        }
        (count, pings)
    }
}
