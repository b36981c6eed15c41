//! Who workloads run as: the operator's `--user` (an image's `User`); the
//! entrypoint runs as that user too (`entrypoint.rs`).
//!
//! Names resolve against the sandbox's own `/etc/passwd` and `/etc/group`
//! (sandboxd runs inside the sandbox, so these are the image's files, read
//! through the sandbox's own view and bounded in size).

use std::{
    io::{self, Read},
    path::Path,
};

/// A resolved `--user`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// From `/etc/passwd` when the user is named there.
    pub name: Option<String>,
    pub home: Option<String>,
}

/// How every `--user` resolution error starts, so a launcher can tell the
/// caller's mistake (a user the image lacks) from a broken sandbox.
pub const UNKNOWN_USER: &str = "unknown user or group";

/// Most bytes read of `/etc/passwd` or `/etc/group`.
const MAX_DB_BYTES: u64 = 1 << 20;

fn read_db(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_DB_BYTES).read_to_string(&mut text);
    }
    text
}

/// `name:x:uid:gid:gecos:home:shell` entries matching `key` (a name or a
/// number in field 2) in a passwd-format text.
fn find<'a>(db: &'a str, key: &str, id_field: usize) -> Option<Vec<&'a str>> {
    db.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > id_field && (f[0] == key || f[id_field] == key))
}

impl RunAs {
    /// Resolves `user[:group]`, each a name or a number, against the
    /// passwd and group files under `etc`.
    pub fn resolve(spec: &str, etc: &Path) -> Result<RunAs, String> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        if user.is_empty() || group.is_some_and(str::is_empty) {
            return Err(format!("{UNKNOWN_USER}: {spec:?}: expected user[:group]"));
        }
        let passwd = read_db(&etc.join("passwd"));
        let entry = find(&passwd, user, 2).filter(|f| f.len() >= 7);
        let uid = match (user.parse::<u32>(), &entry) {
            (Ok(n), _) => n,
            (Err(_), Some(f)) => f[2]
                .parse()
                .map_err(|_| format!("{UNKNOWN_USER}: {user}: bad uid in /etc/passwd"))?,
            (Err(_), None) => return Err(format!("{UNKNOWN_USER}: {user}: not in /etc/passwd")),
        };
        let gid = match group {
            Some(g) => match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => {
                    let groups = read_db(&etc.join("group"));
                    let f = find(&groups, g, 2)
                        .ok_or_else(|| format!("{UNKNOWN_USER}: group {g}: not in /etc/group"))?;
                    f[2].parse()
                        .map_err(|_| format!("{UNKNOWN_USER}: group {g}: bad gid in /etc/group"))?
                }
            },
            // The user's primary group; a uid not in /etc/passwd gets
            // group 0, as container runtimes do.
            None => entry.as_ref().and_then(|f| f[3].parse().ok()).unwrap_or(0),
        };
        Ok(RunAs {
            uid,
            gid,
            name: entry.as_ref().map(|f| f[0].to_string()),
            home: entry
                .as_ref()
                .map(|f| f[5].to_string())
                .filter(|h| h.starts_with('/')),
        })
    }

    /// `HOME`, `USER` and `LOGNAME` for a process run as this user, where
    /// `/etc/passwd` names them.
    pub fn env(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let home = self.home.as_deref().map(|h| ("HOME", h));
        let name = self.name.as_deref().into_iter();
        home.into_iter()
            .chain(name.clone().map(|n| ("USER", n)))
            .chain(name.map(|n| ("LOGNAME", n)))
    }
}

/// Runs in a child between fork (or vfork-style clone) and exec: every
/// signal back to its default. Exec keeps *ignored* dispositions, so a
/// sandboxd started under `nohup` or as a background job (SIGINT and
/// SIGQUIT ignored) would otherwise hand that on, and a SendSignal(SIGINT)
/// could not interrupt anything. The raw call also reaches the signals
/// glibc keeps to itself (32, 33), which its wrappers refuse. An all-zero
/// kernel `sigaction` is SIG_DFL with no flags and an empty mask, whatever
/// the architecture's field order. Raw system calls only: safe in a child
/// that shares the daemon's memory.
pub fn default_signals() -> io::Result<()> {
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: resetting a disposition to SIG_DFL in the child; the
            // kernel only reads the zeroed struct.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null::<u64>(),
                    8,
                )
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\nodd:x:nan:1:::\n",
        )
        .unwrap();
        std::fs::write(d.path().join("group"), "root:x:0:\nstaff:x:50:app\n").unwrap();
        d
    }

    #[test]
    fn users_resolve_by_name_and_number() {
        let d = etc();
        let app = RunAs::resolve("app", d.path()).unwrap();
        assert_eq!((app.uid, app.gid), (1000, 1001));
        assert_eq!(app.home.as_deref(), Some("/home/app"));
        assert_eq!(app.name.as_deref(), Some("app"));
        let by_number = RunAs::resolve("1000:staff", d.path()).unwrap();
        assert_eq!((by_number.uid, by_number.gid), (1000, 50));
        assert_eq!(by_number.name.as_deref(), Some("app"));
        let unknown_number = RunAs::resolve("4242", d.path()).unwrap();
        assert_eq!((unknown_number.uid, unknown_number.gid), (4242, 0));
        assert_eq!(unknown_number.home, None);
        assert!(RunAs::resolve("nobody-here", d.path()).is_err());
        assert!(RunAs::resolve("app:nogroup", d.path()).is_err());
        assert!(RunAs::resolve("odd", d.path()).is_err());
        assert!(RunAs::resolve(":1", d.path()).is_err());
        assert!(RunAs::resolve("app:", d.path()).is_err());
    }
}
