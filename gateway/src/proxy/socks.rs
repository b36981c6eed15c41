//! SOCKS5 (RFC 1928), `CONNECT` only, with username/password auth
//! (RFC 1929) required: the username is the sandbox id, the password its
//! credential. `socks5h://` clients send names (ATYP 3), which the
//! gateway resolves itself, as for the TUN gateway's fake IPs.
//!
//! Every field is length-prefixed and at most 255 bytes, so the
//! handshake reads a bounded amount by construction.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::{Client, Dest, Proxy, Refusal};

pub(crate) const VERSION: u8 = 5;
const AUTH_USERPASS: u8 = 2;
const NO_ACCEPTABLE: u8 = 0xFF;
const CMD_CONNECT: u8 = 1;

/// Reply codes (RFC 1928 §6).
const SUCCEEDED: u8 = 0;
const GENERAL_FAILURE: u8 = 1;
const NOT_ALLOWED: u8 = 2;
const HOST_UNREACHABLE: u8 = 4;
const CMD_UNSUPPORTED: u8 = 7;
const ATYP_UNSUPPORTED: u8 = 8;

async fn reply(conn: &mut BufReader<TcpStream>, code: u8) -> std::io::Result<()> {
    // BND.ADDR/PORT: 0.0.0.0:0; clients of CONNECT do not use them.
    conn.get_mut()
        .write_all(&[VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
}

/// Greeting and RFC 1929 auth; the authenticated client.
async fn authenticate(proxy: &Proxy, conn: &mut BufReader<TcpStream>) -> Option<Client> {
    let mut hdr = [0u8; 2];
    conn.read_exact(&mut hdr).await.ok()?;
    let mut methods = vec![0u8; hdr[1] as usize];
    conn.read_exact(&mut methods).await.ok()?;
    if hdr[0] != VERSION || !methods.contains(&AUTH_USERPASS) {
        let _ = conn.get_mut().write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return None;
    }
    conn.get_mut()
        .write_all(&[VERSION, AUTH_USERPASS])
        .await
        .ok()?;
    let mut ver_len = [0u8; 2];
    conn.read_exact(&mut ver_len).await.ok()?;
    let mut user = vec![0u8; ver_len[1] as usize];
    conn.read_exact(&mut user).await.ok()?;
    let plen = conn.read_u8().await.ok()?;
    let mut pass = vec![0u8; plen as usize];
    conn.read_exact(&mut pass).await.ok()?;
    let client = if ver_len[0] == 1 {
        String::from_utf8(user)
            .ok()
            .and_then(|u| proxy.authenticate(&u, &pass))
    } else {
        None
    };
    // RFC 1929: a non-zero status, then the server closes.
    let status = if client.is_some() { 0 } else { 1 };
    conn.get_mut().write_all(&[1, status]).await.ok()?;
    client
}

/// The CONNECT request's destination, or the reply code refusing it.
async fn request(conn: &mut BufReader<TcpStream>) -> Result<Dest, u8> {
    let mut h = [0u8; 4];
    conn.read_exact(&mut h).await.map_err(|_| GENERAL_FAILURE)?;
    if h[0] != VERSION {
        return Err(GENERAL_FAILURE);
    }
    let host = match h[3] {
        1 => {
            let mut a = [0u8; 4];
            conn.read_exact(&mut a).await.map_err(|_| GENERAL_FAILURE)?;
            IpAddr::V4(Ipv4Addr::from(a)).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            conn.read_exact(&mut a).await.map_err(|_| GENERAL_FAILURE)?;
            IpAddr::V6(Ipv6Addr::from(a)).to_string()
        }
        3 => {
            let n = conn.read_u8().await.map_err(|_| GENERAL_FAILURE)?;
            let mut a = vec![0u8; n as usize];
            conn.read_exact(&mut a).await.map_err(|_| GENERAL_FAILURE)?;
            String::from_utf8(a).map_err(|_| HOST_UNREACHABLE)?
        }
        _ => return Err(ATYP_UNSUPPORTED),
    };
    let port = conn.read_u16().await.map_err(|_| GENERAL_FAILURE)?;
    if h[1] != CMD_CONNECT {
        return Err(CMD_UNSUPPORTED); // BIND, UDP ASSOCIATE: never
    }
    Dest::parse(&host, port).ok_or(HOST_UNREACHABLE)
}

pub(crate) async fn serve(proxy: Arc<Proxy>, mut conn: BufReader<TcpStream>) {
    let deadline = proxy.limits.handshake_timeout;
    let shake = async {
        let client = authenticate(&proxy, &mut conn).await?;
        let dest = match request(&mut conn).await {
            Ok(d) => d,
            Err(code) => {
                let _ = reply(&mut conn, code).await;
                return None;
            }
        };
        match proxy.open(&client, &dest, true).await {
            Ok(d) => Some((client, dest, d)),
            Err(r) => {
                let code = match r {
                    Refusal::Policy(_) => NOT_ALLOWED,
                    Refusal::Unreachable(_) => HOST_UNREACHABLE,
                };
                let _ = reply(&mut conn, code).await;
                None
            }
        }
    };
    let Ok(Some((client, dest, dialed))) = tokio::time::timeout(deadline, shake).await else {
        return;
    };
    if reply(&mut conn, SUCCEEDED).await.is_err() {
        return;
    }
    proxy.carry(&client, &dest, conn, dialed).await
}
