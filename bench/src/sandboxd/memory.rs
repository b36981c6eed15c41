//! sandboxd's memory and threads, from /proc/<pid>/status and
//! /proc/<pid>/smaps_rollup.

use anyhow::Context;

use crate::report::Report;

pub struct Memory {
    pub rss_kib: u64,
    /// Anonymous memory: heap, thread stacks, allocator arenas. This part
    /// is what each additional sandboxd really costs.
    pub anon_kib: u64,
    /// File-backed pages: the binary's code and the shared libraries, shared
    /// with every other process that maps the same files.
    pub file_kib: u64,
    /// Proportional set size: shared pages divided among their sharers.
    pub pss_kib: u64,
    pub threads: u64,
}

pub fn sample(pid: u32) -> anyhow::Result<Memory> {
    let status = read(pid, "status")?;
    let rollup = read(pid, "smaps_rollup")?;
    Ok(Memory {
        rss_kib: field(&status, "VmRSS")?,
        anon_kib: field(&status, "RssAnon")?,
        file_kib: field(&status, "RssFile")?,
        pss_kib: field(&rollup, "Pss")?,
        threads: field(&status, "Threads")?,
    })
}

fn read(pid: u32, file: &str) -> anyhow::Result<String> {
    let path = format!("/proc/{pid}/{file}");
    std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
}

/// The number after `name:` on its own line (`VmRSS:   6432 kB`).
fn field(text: &str, name: &str) -> anyhow::Result<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {name} field"))
}

impl Memory {
    pub fn describe(&self, report: &mut Report, when: &str) {
        report.detail(
            format!("sandboxd memory, {when}"),
            format!(
                "RSS {} KiB = {} KiB anonymous + {} KiB file-backed; PSS {} KiB; {} threads",
                self.rss_kib, self.anon_kib, self.file_kib, self.pss_kib, self.threads
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory() {
        let m = sample(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.pss_kib > 0 && m.threads >= 1);
    }

    #[test]
    fn fields_need_the_exact_name() {
        let text = "VmRSSX:\t1 kB\nVmRSS:\t  6432 kB\n";
        assert_eq!(field(text, "VmRSS").unwrap(), 6432);
        assert!(field(text, "Pss").is_err());
    }
}
