//! A private CA and TLS `redis-server`s with ACL users, made here with
//! `openssl`, for the TLS tests.

use std::path::PathBuf;
use std::process::Command;

use crate::{free_port, unique, RedisServer};

pub const USER: &str = "app";
pub const PASSWORD: &str = "s3cret-pw";

/// A CA and a server certificate for 127.0.0.1 / localhost signed by it.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    pub fn make() -> Certs {
        let dir = std::env::temp_dir().join(format!("lock-test-tls-{}", unique("certs")));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl must be installed");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=lock-test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]);
        run(&[
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
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ]);
        Certs { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).unwrap()
    }
}

/// ACL users: `app` may do anything; `narrow` only touches `other:*` keys.
pub fn acl_args() -> Vec<String> {
    [
        "--user",
        "default",
        "off",
        "--user",
        USER,
        "on",
        ">s3cret-pw",
        "~*",
        "&*",
        "+@all",
        "--user",
        "narrow",
        "on",
        ">narrow-pw",
        "~other:*",
        "&*",
        "+@all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A server with its plain port (for the readiness check) and a TLS port.
pub fn tls_server(certs: &Certs) -> (RedisServer, u16) {
    let tls_port = free_port();
    let mut args: Vec<String> = vec![
        "--save".into(),
        "".into(),
        "--appendonly".into(),
        "no".into(),
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        certs.path("server.crt"),
        "--tls-key-file".into(),
        certs.path("server.key"),
        "--tls-ca-cert-file".into(),
        certs.path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ];
    args.extend(acl_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (RedisServer::start_with(&args), tls_port)
}
