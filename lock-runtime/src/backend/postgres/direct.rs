//! Whether a connection reaches the PostgreSQL server itself, with nothing
//! in between that hands server sessions around (a pooler in transaction
//! mode): only then may the pool prepare its statements on it (`pool.rs`).
//!
//! The server names the two ends of this session's TCP connection
//! (`inet_client_addr()`, `inet_server_addr()` and their ports). The
//! connection is direct when that very connection is a socket of this
//! process (found in `/proc/self/net/tcp*`, its inode among
//! `/proc/self/fd`) and its server end is an address and port the URL
//! names. A pooler, a proxy in another process or a tunnel makes the
//! server's peer a socket of another process (or another machine), and NAT
//! changes an address: the answer is then no. So is a Unix socket, and any
//! system without `/proc`: statements stay unnamed there, which is always
//! safe.

use std::net::{IpAddr, SocketAddr};

use tokio_postgres::Client;

/// See the module's doc.
pub(crate) async fn reaches_the_server(client: &Client, config: &tokio_postgres::Config) -> bool {
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
    let (Some(server), Some(client_end)) = (end(0, 1), end(2, 3)) else {
        return false;
    };
    // Reading `/proc/net/tcp` takes as long as the machine has sockets
    // (thousands, on a busy one): off the runtime's threads, which drive
    // every connection of the client.
    named_by_url(server, config).await
        && tokio::task::spawn_blocking(move || owns_socket(client_end, server))
            .await
            .unwrap_or(false)
}

/// Whether `server` is an address and port the URL names (`host`,
/// `hostaddr`, `port`; names resolved).
async fn named_by_url(server: SocketAddr, config: &tokio_postgres::Config) -> bool {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let addrs = config.get_hostaddrs();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let dialled = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        if dialled != server.port() {
            continue;
        }
        if addrs.get(i).is_some_and(|a| canonical(*a) == server.ip()) {
            return true;
        }
        if let Host::Tcp(name) = host {
            if let Ok(found) = tokio::net::lookup_host((name.as_str(), dialled)).await {
                if found.map(|a| canonical(a.ip())).any(|a| a == server.ip()) {
                    return true;
                }
            }
        }
    }
    false
}

/// Whether this process holds the TCP socket from `local` to `remote`.
#[cfg(target_os = "linux")]
pub(crate) fn owns_socket(local: SocketAddr, remote: SocketAddr) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(l), Some(r), Some(inode)) = (fields.get(1), fields.get(2), fields.get(9))
            else {
                continue;
            };
            if parse_end(l) == Some(local) && parse_end(r) == Some(remote) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// Elsewhere nothing tells: never.
#[cfg(not(target_os = "linux"))]
pub(crate) fn owns_socket(_local: SocketAddr, _remote: SocketAddr) -> bool {
    false
}

/// One end as `/proc/net/tcp*` writes it: the address's 32-bit words in
/// hex, each in the machine's byte order, then `:` and the port in hex.
#[cfg(target_os = "linux")]
fn parse_end(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..addr.len()).step_by(8) {
        let word = u32::from_str_radix(addr.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(canonical(ip), port))
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) as plain IPv4.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::process::{Command, Stdio};

    #[test]
    fn a_socket_of_this_process_is_found_and_one_of_another_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        // Ours, both ends: a connection made here.
        let mine = TcpStream::connect(at).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (l, r) = (mine.local_addr().unwrap(), mine.peer_addr().unwrap());
        assert!(owns_socket(l, r), "this process's own connection");
        assert!(owns_socket(r, l), "the end it accepted");
        assert!(
            !owns_socket(l, SocketAddr::new(r.ip(), r.port() ^ 1)),
            "another remote"
        );
        drop((mine, accepted));

        // Another process's connection to us: the end we accepted is ours,
        // the child's end is not.
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "exec 3<>/dev/tcp/127.0.0.1/{}; echo ok; read -r _ <&3",
                at.port()
            ))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (accepted, theirs) = listener.accept().unwrap();
        let mut ok = [0u8; 2];
        child.stdout.take().unwrap().read_exact(&mut ok).unwrap();
        assert!(owns_socket(at, theirs), "the accepted end");
        assert!(!owns_socket(theirs, at), "the child's end");
        drop(accepted);
        let _ = child.wait();
    }
}
