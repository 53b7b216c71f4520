//! Resource sampling from `/proc` and the filesystem: per-instance CPU (percent of
//! one core, like `top`), memory (PSS of the process tree, which counts shared
//! pages fairly among Chromium's processes) and profile size; machine-wide CPU,
//! memory and disk utilisation and capabilities.
//!
//! One scan of `/proc` per sample serves every instance on the node.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use flotilla_api_types::instances::InstanceResources;
use flotilla_api_types::nodes::{Capabilities, ResourceUsage};

#[derive(Debug, Clone, Copy)]
struct ProcStat {
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    state: char,
    ppid: u32,
    pgid: u32,
    /// utime + stime in clock ticks.
    cpu_ticks: u64,
}

impl ProcStat {
    fn live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// The pids in `/proc`.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
}

/// Whether `pid` exists and is neither a zombie nor dead.
pub fn is_live(pid: u32) -> bool {
    read_stat(pid).is_some_and(|stat| stat.live())
}

/// Whether a process of group `pgid` is alive; stops at the first one (the
/// stop path asks this in a loop while a browser's helpers wind down).
pub fn group_has_live_member(pgid: u32) -> bool {
    pids().any(|pid| read_stat(pid).is_some_and(|stat| stat.pgid == pgid && stat.live()))
}

/// The zombie children of `parent`.
pub fn zombie_children(parent: u32) -> Vec<u32> {
    pids()
        .filter(|pid| read_stat(*pid).is_some_and(|stat| stat.ppid == parent && stat.state == 'Z'))
        .collect()
}

/// The process table at one moment.
pub struct ProcTable {
    procs: HashMap<u32, ProcStat>,
    children: HashMap<u32, Vec<u32>>,
}

impl ProcTable {
    pub fn scan() -> Self {
        let procs: HashMap<u32, ProcStat> = pids()
            .filter_map(|pid| Some((pid, read_stat(pid)?)))
            .collect();
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (pid, stat) in &procs {
            children.entry(stat.ppid).or_default().push(*pid);
        }
        Self { procs, children }
    }

    /// The living processes (neither zombie nor dead).
    pub fn live_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs
            .iter()
            .filter(|(_, stat)| stat.live())
            .map(|(pid, _)| *pid)
    }

    /// `roots` and their descendants, the living ones only.
    pub fn live_descendants(&self, roots: &[u32]) -> Vec<u32> {
        let live = |pid: &u32| self.procs.get(pid).is_some_and(ProcStat::live);
        let mut tree: Vec<u32> = roots.iter().copied().filter(live).collect();
        let mut next = 0;
        while next < tree.len() {
            let kids = self.children.get(&tree[next]).into_iter().flatten();
            for kid in kids.filter(|kid| live(kid)) {
                if !tree.contains(kid) {
                    tree.push(*kid);
                }
            }
            next += 1;
        }
        tree
    }

    /// `root`, every process in its process group, and their descendants.
    pub fn tree(&self, root: u32) -> Vec<u32> {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<u32> = self
            .procs
            .iter()
            .filter(|(pid, stat)| **pid == root || stat.pgid == root)
            .map(|(pid, _)| *pid)
            .collect();
        while let Some(pid) = stack.pop() {
            if seen.insert(pid)
                && let Some(kids) = self.children.get(&pid)
            {
                stack.extend(kids);
            }
        }
        seen.into_iter().collect()
    }

    fn cpu_ticks(&self, pids: &[u32]) -> u64 {
        pids.iter()
            .filter_map(|pid| self.procs.get(pid))
            .map(|s| s.cpu_ticks)
            .sum()
    }
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        cpu_ticks: fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?,
    })
}

/// Proportional set size of a process, in KiB (0 if it is gone).
pub fn pss_kib(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return 0;
    };
    text.lines()
        .find_map(|line| line.strip_prefix("Pss:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Total size of the files under `path`, in bytes (symlinks not followed).
pub fn dir_size(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// CPU use of one process tree between two samples.
#[derive(Debug, Default)]
pub struct CpuMeter {
    last: Option<(u64, Instant)>,
}

impl CpuMeter {
    /// Percent of one core used since the previous call (0 on the first).
    pub fn sample(&mut self, table: &ProcTable, pids: &[u32], now: Instant) -> f64 {
        let ticks = table.cpu_ticks(pids);
        let percent = match self.last {
            Some((last_ticks, last_at)) => {
                let elapsed = now.duration_since(last_at).as_secs_f64();
                if elapsed > 0.0 {
                    (ticks.saturating_sub(last_ticks) as f64 / clock_ticks_per_sec()) / elapsed
                        * 100.0
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        self.last = Some((ticks, now));
        round2(percent)
    }
}

/// Resources of an instance's process tree rooted at `root` with profile at `profile`.
/// What an instance uses: CPU and PSS of its process tree, and the disk of
/// `dirs` (its profile and downloads).
pub fn instance_resources(
    table: &ProcTable,
    meter: &mut CpuMeter,
    root: Option<u32>,
    dirs: &[&Path],
    now: Instant,
) -> InstanceResources {
    let pids = root.map(|root| table.tree(root)).unwrap_or_default();
    let cpu_percent = meter.sample(table, &pids, now);
    let pss: u64 = pids.iter().map(|pid| pss_kib(*pid)).sum();
    InstanceResources {
        cpu_percent,
        memory_mb: round2(pss as f64 / 1024.0),
        disk_mb: round2(
            dirs.iter().map(|dir| dir_size(dir)).sum::<u64>() as f64 / (1024.0 * 1024.0),
        ),
    }
}

/// Machine-wide utilisation, from `/proc/stat`, `/proc/meminfo` and `statvfs`.
#[derive(Debug)]
pub struct MachineMeter {
    data_dir: std::path::PathBuf,
    last_cpu: Option<(u64, u64)>,
    /// Exponentially weighted averages of CPU and memory with a one-minute time
    /// constant, and when they were last updated.
    smoothed: Option<(ResourceUsage, Instant)>,
}

/// Time constant of the smoothed utilisation the scheduler uses: a burst of
/// browser launches must not make a node refuse placements.
pub const LOAD_TIME_CONSTANT_SEC: f64 = 60.0;

impl MachineMeter {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            last_cpu: None,
            smoothed: None,
        }
    }

    /// Samples utilisation now; returns it and the one-minute smoothed load.
    pub fn sample_with_load(&mut self) -> (ResourceUsage, ResourceUsage) {
        let now = self.sample();
        let at = Instant::now();
        let load = match self.smoothed {
            None => now,
            Some((previous, last)) => {
                let alpha =
                    1.0 - (-at.duration_since(last).as_secs_f64() / LOAD_TIME_CONSTANT_SEC).exp();
                let blend = |old: f64, new: f64| round2(old + alpha * (new - old));
                ResourceUsage {
                    cpu_percent: blend(previous.cpu_percent, now.cpu_percent),
                    memory_percent: blend(previous.memory_percent, now.memory_percent),
                    disk_percent: now.disk_percent,
                }
            }
        };
        self.smoothed = Some((load, at));
        (now, load)
    }

    pub fn sample(&mut self) -> ResourceUsage {
        let cpu = read_cpu_totals();
        let cpu_percent = match (self.last_cpu, cpu) {
            (Some((last_total, last_busy)), Some((total, busy))) if total > last_total => {
                (busy.saturating_sub(last_busy)) as f64 / (total - last_total) as f64 * 100.0
            }
            _ => 0.0,
        };
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        let memory_percent = read_meminfo()
            .map(|(total, available)| {
                (total.saturating_sub(available)) as f64 / total.max(1) as f64 * 100.0
            })
            .unwrap_or(0.0);
        let disk_percent = disk_usage(&self.data_dir)
            .map(|(_, used_percent)| used_percent)
            .unwrap_or(0.0);
        ResourceUsage {
            cpu_percent: round2(cpu_percent),
            memory_percent: round2(memory_percent),
            disk_percent: round2(disk_percent),
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        let cpu_cores = std::thread::available_parallelism()
            .map(|n| n.get() as i64)
            .unwrap_or(1);
        let memory_gb = read_meminfo()
            .map(|(total, _)| total as f64 / (1024.0 * 1024.0 * 1024.0))
            .unwrap_or(0.0);
        let disk_gb = disk_usage(&self.data_dir)
            .map(|(total, _)| total as f64 / (1024.0 * 1024.0 * 1024.0))
            .unwrap_or(0.0);
        Capabilities {
            cpu_cores,
            memory_gb: round2(memory_gb),
            disk_gb: round2(disk_gb),
        }
    }
}

/// (total, busy) jiffies over all CPUs.
fn read_cpu_totals() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest counted in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some((total, total.saturating_sub(idle)))
}

/// (MemTotal, MemAvailable) in bytes.
fn read_meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// (total bytes, used percent as `df` computes it) of the filesystem holding `path`.
fn disk_usage(path: &Path) -> Option<(u64, f64)> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    let frsize = stat.f_frsize as u64;
    let total = stat.f_blocks as u64 * frsize;
    let used = (stat.f_blocks as u64).saturating_sub(stat.f_bfree as u64);
    let denominator = used + stat.f_bavail as u64;
    let percent = if denominator == 0 {
        0.0
    } else {
        used as f64 / denominator as f64 * 100.0
    };
    Some((total, percent))
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_tree_and_pss_are_seen() {
        let table = ProcTable::scan();
        let me = std::process::id();
        assert!(table.tree(me).contains(&me));
        assert!(pss_kib(me) > 0);
    }

    #[test]
    fn dir_size_counts_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![0u8; 500]).unwrap();
        assert_eq!(dir_size(dir.path()), 1500);
    }

    #[test]
    fn machine_sample_is_in_range() {
        let mut meter = MachineMeter::new(Path::new("/tmp"));
        meter.sample();
        let usage = meter.sample();
        for value in [usage.cpu_percent, usage.memory_percent, usage.disk_percent] {
            assert!((0.0..=100.0).contains(&value), "{usage:?}");
        }
        let caps = meter.capabilities();
        assert!(caps.cpu_cores >= 1 && caps.memory_gb > 0.0 && caps.disk_gb > 0.0);
    }
}
