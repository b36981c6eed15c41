//! sandboxd's memory and threads, from /proc/<pid>/status.

use anyhow::Context;

use crate::report::Report;

pub struct Memory {
    pub rss_kib: u64,
    /// Anonymous memory: heap, thread stacks, allocator arenas.
    pub anon_kib: u64,
    /// File-backed pages: mostly the binary's own text and data.
    pub file_kib: u64,
    pub threads: u64,
}

pub fn sample(pid: u32) -> anyhow::Result<Memory> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .with_context(|| format!("{path} has no {name}"))
    };
    Ok(Memory {
        rss_kib: field("VmRSS")?,
        anon_kib: field("RssAnon")?,
        file_kib: field("RssFile")?,
        threads: field("Threads")?,
    })
}

impl Memory {
    pub fn describe(&self, report: &mut Report, when: &str) {
        report.detail(
            format!("sandboxd memory, {when}"),
            format!(
                "RSS {} KiB = {} KiB anonymous + {} KiB file-backed; {} threads",
                self.rss_kib, self.anon_kib, self.file_kib, self.threads
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_status() {
        let m = super::sample(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.threads >= 1);
    }
}
