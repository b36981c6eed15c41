//! The little of `/proc/<pid>/stat` the runtime needs: a process's state,
//! parent and start time. The start time (field 22, clock ticks after boot)
//! together with the pid names one process for good: a pid may be reused,
//! the pair never is.

use std::io;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub state: char,
    pub ppid: i32,
    pub start_time: u64,
}

impl Stat {
    /// Zombies and dead tasks have exited; only their parent can still see them.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Whether process `pid`, started at `start_time`, still runs: the pair
/// names one process for good, and a zombie has already exited.
pub(crate) fn runs(pid: i32, start_time: u64) -> bool {
    stat(pid).is_ok_and(|s| s.start_time == start_time && s.is_running())
}

/// Reads `/proc/<pid>/stat` (the procfs mounted at `/proc`).
pub(crate) fn stat(pid: i32) -> io::Result<Stat> {
    let raw = std::fs::read(format!("/proc/{pid}/stat"))?;
    parse_stat(&raw).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: unexpected format"),
        )
    })
}

/// Parses a stat line. The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_stat(raw: &[u8]) -> Option<Stat> {
    let close = raw.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&raw[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the first after the name.
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    // Fields 5..=21 are skipped: 17 of them, then field 22.
    let start_time = fields.nth(17)?.parse().ok()?;
    Some(Stat {
        state,
        ppid,
        start_time,
    })
}

/// The pids of every process `/proc` lists (thread-group leaders only).
pub(crate) fn all_pids() -> io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        if let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line = b"4242 (we (i)rd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 18446744073709551615\n";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                ppid: 17,
                start_time: 987654
            }
        );
        assert!(s.is_running());
    }

    #[test]
    fn own_stat_is_running() {
        let s = stat(std::process::id() as i32).unwrap();
        assert!(s.is_running());
        assert!(s.start_time > 0);
    }
}
