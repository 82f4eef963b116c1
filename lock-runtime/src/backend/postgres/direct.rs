//! Whether a connection reaches the PostgreSQL server itself, with nothing
//! in between that hands server sessions around (a pooler in transaction
//! mode): only then may the pool prepare its statements on it (`pool.rs`).
//!
//! Where the URL names one server by TCP, the client opens the socket
//! itself ([`open_socket`]) and keeps its two ends. The server names the
//! two ends of this session's connection (`inet_client_addr()`,
//! `inet_server_addr()` and their ports). The connection is direct when
//! they are the same: the server's peer is this very socket. A pooler, a
//! proxy or a tunnel makes the server's peer another socket (of another
//! process, or another machine), and NAT changes an address: the answer is
//! then no. So is a Unix socket, and a URL of several hosts or with
//! `target_session_attrs`, which the driver's own connect opens:
//! statements stay unnamed there, which is always safe.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::Client;

/// The two ends of a socket this client opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ends {
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

/// The one server a URL names by TCP, for the client to open the socket to
/// itself: (host, port, its `hostaddr`). `None` for several hosts, a Unix
/// socket, or `target_session_attrs` (which the driver's connect checks).
pub(crate) fn single_tcp_server(
    config: &tokio_postgres::Config,
) -> Option<(String, u16, Option<IpAddr>)> {
    let [Host::Tcp(host)] = config.get_hosts() else {
        return None;
    };
    if config.get_target_session_attrs() != TargetSessionAttrs::Any
        || config.get_hostaddrs().len() > 1
        || config.get_ports().len() > 1
    {
        return None;
    }
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Some((host.clone(), port, config.get_hostaddrs().first().copied()))
}

/// A TCP connection to `host:port` (to `hostaddr` if given, else to each
/// address the name resolves to in turn), as the driver opens one: no
/// Nagle delay, keepalives as the URL says.
pub(crate) async fn open_socket(
    host: &str,
    port: u16,
    hostaddr: Option<IpAddr>,
    keepalives: bool,
) -> io::Result<(TcpStream, Ends)> {
    let addrs: Vec<SocketAddr> = match hostaddr {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => tokio::net::lookup_host((host, port)).await?.collect(),
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in addrs {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_keepalive(keepalives)?;
        match socket.connect(addr).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                let ends = Ends {
                    local: stream.local_addr()?,
                    peer: stream.peer_addr()?,
                };
                return Ok((stream, ends));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether the session `client` runs on is served over the socket of
/// `ends`: see the module's doc.
pub(crate) async fn reaches_the_server(client: &Client, ends: Ends) -> bool {
    let Ok(row) = client
        .query_typed_one(
            "SELECT host(inet_server_addr()), inet_server_port(), \
                    host(inet_client_addr()), inet_client_port()",
            &[],
        )
        .await
    else {
        return false;
    };
    let end = |addr: usize, port: usize| -> Option<SocketAddr> {
        let ip = row.try_get::<_, Option<String>>(addr).ok()??;
        let port = row.try_get::<_, Option<i32>>(port).ok()??;
        Some(SocketAddr::new(
            canonical(ip.parse().ok()?),
            u16::try_from(port).ok()?,
        ))
    };
    end(0, 1) == Some(canonical_end(ends.peer)) && end(2, 3) == Some(canonical_end(ends.local))
}

fn canonical_end(end: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical(end.ip()), end.port())
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) as plain IPv4.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn only_a_single_tcp_server_is_opened_by_the_client() {
        let one = |url: &str| single_tcp_server(&tokio_postgres::Config::from_str(url).unwrap());
        assert_eq!(
            one("postgresql://u@db.example:6000/x"),
            Some(("db.example".into(), 6000, None))
        );
        assert_eq!(
            one("postgresql://u@db/x?hostaddr=10.0.0.5"),
            Some(("db".into(), 5432, Some("10.0.0.5".parse().unwrap())))
        );
        assert_eq!(one("postgresql://u@a:1,b:2/x"), None, "several hosts");
        assert_eq!(
            one("postgresql://u@a/x?target_session_attrs=read-write"),
            None,
            "checked by the driver's connect"
        );
        assert_eq!(one("postgresql://u@%2Ftmp/x"), None, "a Unix socket");
    }
}
