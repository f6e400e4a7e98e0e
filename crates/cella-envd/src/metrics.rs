//! `GET /metrics`: the sandbox's own CPU, memory and disk use, in envd's JSON shape.

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use crate::Envd;

#[derive(Debug, Serialize)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

pub async fn handler(State(_envd): State<Envd>) -> Json<Metrics> {
    Json(
        tokio::task::spawn_blocking(collect)
            .await
            .unwrap_or_else(|_| collect_empty()),
    )
}

fn collect_empty() -> Metrics {
    Metrics {
        ts: now(),
        cpu_count: 0,
        cpu_used_pct: 0.0,
        mem_total: 0,
        mem_used: 0,
        mem_cache: 0,
        mem_total_mib: 0,
        mem_used_mib: 0,
        disk_used: 0,
        disk_total: 0,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Reads /proc (the sandbox's own, fresh procfs) and statvfs of `/`.
pub fn collect() -> Metrics {
    let cpu_count = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let cpu_used_pct = cpu_used_pct();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let mem_total = field("MemTotal:");
    let mem_available = field("MemAvailable:");
    let mem_cache = field("Cached:");
    let mem_used = mem_total.saturating_sub(mem_available);
    let (disk_used, disk_total) = disk_usage("/");
    Metrics {
        ts: now(),
        cpu_count,
        cpu_used_pct,
        mem_total,
        mem_used,
        mem_cache,
        mem_total_mib: mem_total / (1024 * 1024),
        mem_used_mib: mem_used / (1024 * 1024),
        disk_used,
        disk_total,
    }
}

fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let vals: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let idle = vals.get(3)? + vals.get(4).copied().unwrap_or(0);
    Some((vals.iter().sum(), idle))
}

fn cpu_used_pct() -> f64 {
    let Some((t1, i1)) = cpu_times() else {
        return 0.0;
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let Some((t2, i2)) = cpu_times() else {
        return 0.0;
    };
    let total = t2.saturating_sub(t1);
    if total == 0 {
        return 0.0;
    }
    let busy = total.saturating_sub(i2.saturating_sub(i1));
    ((busy as f64 / total as f64) * 10000.0).round() / 100.0
}

/// Used and total bytes of the filesystem holding `path`.
pub fn disk_usage(path: &str) -> (u64, u64) {
    let Ok(c) = std::ffi::CString::new(path) else {
        return (0, 0);
    };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable statvfs storage.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return (0, 0);
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    let total = st.f_blocks * frsize;
    let free = st.f_bfree * frsize;
    (total.saturating_sub(free), total)
}
