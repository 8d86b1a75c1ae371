//! Device memory: a caching pool of large buffers (pages) cut into blocks, under a budget.
//!
//! Why a pool: `create_buffer` costs a driver allocation (often a kernel call) and a steady
//! training loop asks for the same sizes every step. The pool keeps freed blocks and hands them
//! out again, so after the first iterations no device allocation happens at all.
//!
//! Why reuse is safe: every GPU command (kernels, uploads, read-backs) is recorded in one
//! ordered stream (`crate::device::stream`), and host uploads are copies recorded in that same stream,
//! never `queue.write_buffer` (which would run at the start of the next submit, before
//! commands already recorded). A block freed while queued kernels still read it can be handed
//! to a new tensor at once: anything the new owner does is ordered after those reads.
//!
//! The budget is ours to enforce: wgpu reports out-of-memory unreliably and cannot say how much
//! memory is free. Past the budget a request first releases cached pages, then waits for the
//! device, then fails with [`Error::OutOfMemory`], leaving every
//! live tensor intact.
//!
//! Why a release threshold: a cache that keeps every page holds the peak of a step for the
//! whole run, which other processes sharing the GPU cannot use. With a threshold of N bytes
//! (`DeviceOptions::release_threshold`, default unlimited) the pool keeps at most N bytes of
//! empty pages, returning the largest to the driver as soon as more are empty; a training
//! loop then pays device allocations each step for whatever it needs past N.
//!
//! The pool is reached through its device: [`MemoryStats`] from
//! [`Device::memory_stats`](crate::Device::memory_stats), a printable [`MemoryReport`] from
//! [`Device::memory_report`](crate::Device::memory_report), the event trace ([`Event`],
//! `Device::set_memory_trace`) and its picture ([`timeline_svg`]). [`arena`] is the
//! allocator itself, without any GPU, so its rules can be tested on their own.

pub mod arena;
pub(crate) mod staging;
mod stats;
mod timeline;
pub(crate) mod trace;

pub use stats::{MemoryReport, MemoryStats};
pub use timeline::timeline_svg;
pub use trace::{Event, EventKind};

use crate::error::{Error, Result, fmt_bytes};
use crate::hash::FastMap;
use arena::{Arena, ArenaConfig, PageId, Placement};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use trace::Trace;

/// Trace events kept before the oldest are dropped.
const TRACE_CAPACITY: usize = 1 << 20;

/// The pool. One per device; blocks hold an `Arc` to it so they can return themselves.
pub(crate) struct MemoryPool {
    device: wgpu::Device,
    on_page_release: Option<PageHook>,
    state: Mutex<PoolState>,
    epoch: Instant,
}

struct PoolState {
    arena: Arena,
    buffers: FastMap<PageId, wgpu::Buffer>,
    stats: MemoryStats,
    trace: Trace,
    /// Open scopes, innermost last, each with the peak of `allocated` seen inside it.
    scopes: Vec<(Arc<str>, u64)>,
    /// Bytes of empty pages the cache keeps (`u64::MAX`: all of them).
    release_threshold: u64,
}

/// A block of device memory: a byte range of one page. Dropping it returns it to the pool.
pub(crate) struct Block {
    pool: Arc<MemoryPool>,
    placement: Placement,
    requested: u64,
    buffer: wgpu::Buffer,
}

impl Block {
    /// The page buffer the block lives in.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
    /// Byte offset of the block in its page.
    pub fn offset(&self) -> u64 {
        self.placement.offset
    }
    /// Bytes reserved for the block (at least the request, rounded to the alignment).
    pub fn size(&self) -> u64 {
        self.placement.size
    }
    /// The page's id.
    pub fn page(&self) -> u64 {
        self.placement.page
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.release(self.placement, self.requested);
    }
}

/// Sizing of a pool, from the adapter's limits and the device options.
pub(crate) struct PoolConfig {
    pub align: u64,
    pub max_page: u64,
    pub limit: u64,
    pub no_cache: bool,
    pub trace: bool,
    /// Bytes of empty cached pages kept; more go back to the driver as they empty.
    pub release_threshold: u64,
    /// Told of each page as it goes back to the driver (the device drops the bind groups
    /// that would keep its buffer alive).
    pub on_page_release: Option<PageHook>,
}

/// See [`PoolConfig::on_page_release`].
pub(crate) type PageHook = Box<dyn Fn(PageId) + Send + Sync>;

impl MemoryPool {
    pub(crate) fn new(device: wgpu::Device, cfg: PoolConfig) -> Arc<Self> {
        let mut acfg = ArenaConfig::new(cfg.align, cfg.max_page);
        acfg.no_cache = cfg.no_cache;
        let stats = MemoryStats {
            limit: cfg.limit,
            ..Default::default()
        };
        Arc::new(MemoryPool {
            device,
            on_page_release: cfg.on_page_release,
            state: Mutex::new(PoolState {
                arena: Arena::new(acfg),
                buffers: FastMap::default(),
                stats,
                trace: Trace::new(cfg.trace, TRACE_CAPACITY),
                scopes: Vec::new(),
                release_threshold: cfg.release_threshold,
            }),
            epoch: Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves counters possibly off by one allocation, never
        // memory unsafe; keep serving rather than poison every later call.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool's clock origin (trace times count from it).
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A block of at least `requested` bytes.
    pub(crate) fn alloc(self: &Arc<Self>, requested: u64) -> Result<Block> {
        let mut st = self.lock();
        let size = st.arena.round(requested);
        let max_page = st.arena.config().max_page;
        if size > max_page {
            return Err(Error::LimitExceeded {
                what: format!("allocation of {}", fmt_bytes(requested)),
                requested,
                limit_name: "max_storage_buffer_binding_size",
                limit: max_page,
            });
        }
        st.stats.requests += 1;
        if let Some(p) = st.arena.try_alloc(size) {
            st.stats.cache_hits += 1;
            return Ok(self.hand_out(&mut st, p, requested));
        }
        // A new page is needed. Attempt 0 as is; attempt 1 after releasing cached pages;
        // attempt 2 after also waiting for the device, so buffers dropped while still in use
        // by queued work are really gone.
        for attempt in 0..3 {
            if attempt == 1 {
                st.stats.alloc_retries += 1;
                self.release_cached(&mut st);
            } else if attempt == 2 {
                drop(st);
                let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
                st = self.lock();
                self.release_cached(&mut st);
                // Another thread may have freed blocks meanwhile.
                if let Some(p) = st.arena.try_alloc(size) {
                    return Ok(self.hand_out(&mut st, p, requested));
                }
            }
            let room = st.stats.limit.saturating_sub(st.stats.reserved);
            let preferred = st.arena.page_size_for(size);
            // Under pressure, a page of exactly the request beats failing.
            let page_size = if preferred <= room { preferred } else { size };
            if page_size > room {
                continue;
            }
            if let Some(buffer) = self.create_page(page_size) {
                let (id, p) = st.arena.alloc_in_new_page(page_size, size);
                st.buffers.insert(id, buffer);
                st.stats.device_allocs += 1;
                st.stats.reserved += page_size;
                st.stats.peak_reserved = st.stats.peak_reserved.max(st.stats.reserved);
                self.event(&mut st, EventKind::PageAlloc, page_size);
                return Ok(self.hand_out(&mut st, p, requested));
            }
        }
        st.stats.ooms += 1;
        self.event(&mut st, EventKind::Oom, requested);
        Err(Error::OutOfMemory {
            requested,
            limit: st.stats.limit,
            allocated: st.stats.allocated,
            reserved: st.stats.reserved,
            largest_free: st.arena.largest_free(),
        })
    }

    /// Creates a page buffer, catching the driver's out-of-memory instead of letting wgpu's
    /// default handler panic.
    fn create_page(&self, size: u64) -> Option<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad page"),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            None => Some(buffer),
            Some(_) => None,
        }
    }

    fn hand_out(self: &Arc<Self>, st: &mut PoolState, p: Placement, requested: u64) -> Block {
        let s = &mut st.stats;
        s.allocated += requested;
        s.active += p.size;
        s.live_blocks += 1;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.peak_active = s.peak_active.max(s.active);
        let allocated = s.allocated;
        for scope in st.scopes.iter_mut() {
            scope.1 = scope.1.max(allocated);
        }
        self.event(st, EventKind::Alloc, requested);
        let buffer = match st.buffers.get(&p.page) {
            Some(b) => b.clone(),
            None => unreachable!("arena placed a block in a page without a buffer"),
        };
        Block {
            pool: Arc::clone(self),
            placement: p,
            requested,
            buffer,
        }
    }

    fn release(&self, p: Placement, requested: u64) {
        let mut st = self.lock();
        st.stats.allocated -= requested;
        st.stats.active -= p.size;
        st.stats.live_blocks -= 1;
        self.event(&mut st, EventKind::Free, requested);
        if let Some(page) = st.arena.free(p) {
            // WGRAD_NO_CACHE: the page goes back to the driver at once. Queued commands that
            // still use it keep wgpu's handle alive until they finish.
            self.drop_page(&mut st, page, p.size);
        } else if st.release_threshold != u64::MAX {
            self.trim(&mut st);
        }
    }

    /// Releases empty pages past the release threshold.
    fn trim(&self, st: &mut PoolState) {
        let keep = st.release_threshold;
        for (page, size) in st.arena.release_free_pages_over(keep) {
            self.drop_page(st, page, size);
        }
    }

    /// Sets the release threshold (`u64::MAX`: keep every empty page) and applies it now.
    pub(crate) fn set_release_threshold(&self, bytes: u64) {
        let mut st = self.lock();
        st.release_threshold = bytes;
        if bytes != u64::MAX {
            self.trim(&mut st);
        }
    }

    fn drop_page(&self, st: &mut PoolState, page: PageId, size: u64) {
        if st.buffers.remove(&page).is_some()
            && let Some(hook) = &self.on_page_release
        {
            hook(page);
        }
        st.stats.device_frees += 1;
        st.stats.reserved -= size;
        self.event(st, EventKind::PageFree, size);
    }

    fn release_cached(&self, st: &mut PoolState) {
        for (page, size) in st.arena.release_free_pages() {
            self.drop_page(st, page, size);
        }
    }

    /// Releases every page with no live block.
    pub(crate) fn empty_cache(&self) {
        let mut st = self.lock();
        self.release_cached(&mut st);
    }

    fn event(&self, st: &mut PoolState, kind: EventKind, bytes: u64) {
        if !st.trace.enabled {
            return;
        }
        let scope = st.scopes.last().map(|s| s.0.clone());
        let e = Event {
            t_us: self.now_us(),
            kind,
            bytes,
            allocated: st.stats.allocated,
            reserved: st.stats.reserved,
            scope,
        };
        st.trace.push(e);
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        let st = self.lock();
        let mut s = st.stats.clone();
        let (small, large) = st.arena.page_counts();
        s.small_pages = small as u64;
        s.large_pages = large as u64;
        s.largest_free = st.arena.largest_free();
        s.free_pages = st.arena.free_page_bytes();
        s.release_threshold = st.release_threshold;
        s
    }

    pub(crate) fn reset_peak(&self) {
        let mut st = self.lock();
        let s = &mut st.stats;
        s.peak_allocated = s.allocated;
        s.peak_active = s.active;
        s.peak_reserved = s.reserved;
    }

    pub(crate) fn set_limit(&self, limit: u64) {
        self.lock().stats.limit = limit;
    }

    pub(crate) fn set_trace(&self, on: bool) {
        self.lock().trace.enabled = on;
    }

    pub(crate) fn trace_events(&self) -> Vec<Event> {
        self.lock().trace.events()
    }

    pub(crate) fn trace_json(&self) -> String {
        self.lock().trace.to_json()
    }

    pub(crate) fn clear_trace(&self) {
        self.lock().trace.clear();
    }

    /// Opens a named scope: trace events carry its name, and its peak is tracked.
    pub(crate) fn push_scope(&self, name: &str) {
        let mut st = self.lock();
        let name: Arc<str> = name.into();
        let allocated = st.stats.allocated;
        st.scopes.push((name.clone(), allocated));
        if st.trace.enabled {
            let e = Event {
                t_us: self.now_us(),
                kind: EventKind::ScopeBegin,
                bytes: 0,
                allocated,
                reserved: st.stats.reserved,
                scope: Some(name),
            };
            st.trace.push(e);
        }
    }

    /// Closes the innermost scope; returns its peak of allocated bytes.
    pub(crate) fn pop_scope(&self) -> u64 {
        let mut st = self.lock();
        let Some((name, peak)) = st.scopes.pop() else {
            return 0;
        };
        // The enclosing scope saw this peak too.
        if let Some(outer) = st.scopes.last_mut() {
            outer.1 = outer.1.max(peak);
        }
        if st.trace.enabled {
            let e = Event {
                t_us: self.now_us(),
                kind: EventKind::ScopeEnd,
                bytes: 0,
                allocated: st.stats.allocated,
                reserved: st.stats.reserved,
                scope: Some(name),
            };
            st.trace.push(e);
        }
        peak
    }
}
