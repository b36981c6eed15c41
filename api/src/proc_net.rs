//! Reading the kernel's `/proc/net/tcp{,6}` tables: what listens, by
//! port. The hub's local backend reads them inside a sandbox's network
//! namespace, its Kubernetes one through the Pod's sandboxd, and sandboxd
//! to know when a code kernel listens; all parse them here.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::hub::ListeningPort;

/// One entry per port (IPv4 first), sorted by port.
pub fn listening(tcp: &str, tcp6: &str) -> Vec<ListeningPort> {
    let mut all = parse_listening(tcp);
    for p in parse_listening(tcp6) {
        if !all.iter().any(|q| q.port == p.port) {
            all.push(p);
        }
    }
    all.sort_by_key(|p| p.port);
    all
}

/// `st` of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// The listening sockets of a `/proc/net/tcp` or `tcp6` table. Lines that
/// do not parse are skipped: the table is the kernel's, but a bad line must
/// never take the hub down.
pub fn parse_listening(table: &str) -> Vec<ListeningPort> {
    let mut out: Vec<ListeningPort> = Vec::new();
    for line in table.lines().skip(1) {
        let mut f = line.split_ascii_whitespace();
        let (Some(_sl), Some(local), Some(_remote), Some(st)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if st != TCP_LISTEN {
            continue;
        }
        let Some((addr, port)) = local.split_once(':') else {
            continue;
        };
        let (Ok(port), Some(address)) = (u16::from_str_radix(port, 16), parse_addr(addr)) else {
            continue;
        };
        if port != 0 && !out.iter().any(|p| p.port == port) {
            out.push(ListeningPort { port, address });
        }
    }
    out
}

/// The kernel prints addresses as 32-bit words in host byte order.
fn parse_addr(hex: &str) -> Option<String> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(Ipv4Addr::from(word(0)?).to_string()),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(Ipv6Addr::from(b).to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   garbage line
   3: ZZZZ:0050 00000000:0000 0A
";

    #[test]
    fn listening_sockets_only_with_their_addresses() {
        let ports = parse_listening(TCP);
        let expected_lo = if cfg!(target_endian = "little") {
            "127.0.0.1"
        } else {
            "1.0.0.127"
        };
        assert_eq!(
            ports,
            vec![
                ListeningPort {
                    port: 8080,
                    address: expected_lo.into()
                },
                ListeningPort {
                    port: 80,
                    address: "0.0.0.0".into()
                },
            ]
        );
    }

    #[test]
    fn ipv6_any_and_loopback() {
        let table = "header\n 0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(parse_listening(table)[0].address, "::");
        if cfg!(target_endian = "little") {
            let lo = "header\n 0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 0\n";
            assert_eq!(parse_listening(lo)[0].address, "::1");
        }
    }

    #[test]
    fn empty_and_hostile_tables_give_nothing() {
        assert!(parse_listening("").is_empty());
        assert!(parse_listening("h\n0: :: :: 0A\n0: 01:FFFFF x 0A\n").is_empty());
    }
}
