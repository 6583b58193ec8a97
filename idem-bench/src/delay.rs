//! A loopback TCP proxy that delays every packet it forwards, each way, so
//! round trips cost what they cost on a real network (`tc netem` is not
//! available everywhere): the latency scenario runs the Postgres scenarios at
//! one client through it.
//!
//! Each connection gets two forwarding threads per direction: one reads what
//! arrives and stamps it, the other writes each piece once its delay has
//! passed (so pieces in flight overlap, as on a wire, instead of queueing
//! behind each other's delays). Threads, not tokio timers: the delay is a
//! fraction of a millisecond, finer than tokio's timer wheel.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running proxy; stops accepting when dropped (open connections end
/// with their peers).
pub struct DelayProxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`, delaying every piece by `delay` in each direction.
    pub fn start(upstream: SocketAddr, delay: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    if let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) {
                        forward(from, to, delay);
                    }
                }
            }
        });
        Ok(Self { port, stop })
    }

    /// The port to connect to instead of the upstream's.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to`, each piece written `delay` after it was read.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (pieces, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if pieces
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (at, piece) in due {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&piece).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
