//! Counters of the memory pool and the report a person reads at a glance.

use crate::error::fmt_bytes;
use std::fmt;

/// A snapshot of the memory pool's counters (`Device::memory_stats`).
///
/// * `allocated`: bytes requested by live tensors;
/// * `active`: bytes of the blocks holding them (requests rounded up to the alignment, plus any
///   unsplit tail), so `active - allocated` is rounding waste;
/// * `reserved`: bytes of device buffers (pages) the pool holds, so `reserved - active` is the
///   cache (free blocks ready for reuse).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes requested by live allocations.
    pub allocated: u64,
    /// Bytes of the blocks backing live allocations.
    pub active: u64,
    /// Bytes of device buffers held by the pool.
    pub reserved: u64,
    /// Peak of `allocated` since creation or `reset_peak`.
    pub peak_allocated: u64,
    /// Peak of `active`.
    pub peak_active: u64,
    /// Peak of `reserved`.
    pub peak_reserved: u64,
    /// Live allocations.
    pub live_blocks: u64,
    /// Pages held (small pool).
    pub small_pages: u64,
    /// Pages held (large pool).
    pub large_pages: u64,
    /// Allocation requests served.
    pub requests: u64,
    /// Requests served from the cache (no new page).
    pub cache_hits: u64,
    /// Device buffers created for pages.
    pub device_allocs: u64,
    /// Device buffers released.
    pub device_frees: u64,
    /// Requests that had to free the cache or wait for the device before succeeding or failing.
    pub alloc_retries: u64,
    /// Requests that ended in `Error::OutOfMemory`.
    pub ooms: u64,
    /// The largest free block in the cache.
    pub largest_free: u64,
    /// Bytes of cached pages with no live block (what `empty_cache` would release).
    pub free_pages: u64,
    /// Bytes of empty pages the cache keeps at most (`u64::MAX`: no threshold).
    pub release_threshold: u64,
    /// The budget in bytes (`u64::MAX` when none).
    pub limit: u64,
    /// Staging buffers created for uploads (pooled; flat in a steady loop).
    pub upload_buffers: u64,
    /// Bytes of upload staging held.
    pub upload_bytes: u64,
    /// Read-back buffers created (pooled).
    pub download_buffers: u64,
    /// Bytes of read-back buffers held.
    pub download_bytes: u64,
}

impl MemoryStats {
    /// Fraction of requests served from the cache (1.0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.cache_hits as f64 / self.requests as f64
        }
    }

    /// Every buffer the device has created for wgrad: pages plus staging. A steady training
    /// loop keeps this flat.
    pub fn total_device_allocs(&self) -> u64 {
        self.device_allocs + self.upload_buffers + self.download_buffers
    }
}

/// The text report of `Device::memory_report`.
pub struct MemoryReport {
    pub(crate) adapter: String,
    pub(crate) stats: MemoryStats,
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        let limit = if s.limit == u64::MAX {
            "none".to_string()
        } else {
            fmt_bytes(s.limit)
        };
        writeln!(f, "wgrad memory on {} (budget {limit})", self.adapter)?;
        writeln!(
            f,
            "  allocated {:>11}  peak {:>11}  in {} tensors",
            fmt_bytes(s.allocated),
            fmt_bytes(s.peak_allocated),
            s.live_blocks
        )?;
        writeln!(
            f,
            "  active    {:>11}  peak {:>11}",
            fmt_bytes(s.active),
            fmt_bytes(s.peak_active)
        )?;
        writeln!(
            f,
            "  reserved  {:>11}  peak {:>11}  in {} pages ({} small, {} large)",
            fmt_bytes(s.reserved),
            fmt_bytes(s.peak_reserved),
            s.small_pages + s.large_pages,
            s.small_pages,
            s.large_pages
        )?;
        writeln!(
            f,
            "  cache     {:.1}% hits ({} of {} requests), largest free block {}",
            100.0 * s.hit_rate(),
            s.cache_hits,
            s.requests,
            fmt_bytes(s.largest_free)
        )?;
        writeln!(
            f,
            "  device    {} buffers created, {} freed, {} retries, {} out-of-memory",
            s.device_allocs, s.device_frees, s.alloc_retries, s.ooms
        )?;
        write!(
            f,
            "  staging   upload {} in {} buffers, read-back {} in {} buffers",
            fmt_bytes(s.upload_bytes),
            s.upload_buffers,
            fmt_bytes(s.download_bytes),
            s.download_buffers
        )
    }
}
