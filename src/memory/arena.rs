//! The bookkeeping half of the caching allocator: pages, blocks, best fit, split, coalesce.
//!
//! This file knows nothing of wgpu, so its invariants can be property-tested on the CPU. A page
//! is one large device buffer (owned by the memory pool, `super::MemoryPool`); a block is an aligned byte range
//! inside a page. Two pools keep small and large requests apart, as PyTorch's caching allocator
//! does, so that a long-lived small tensor does not pin a large page:
//!
//! * small: requests up to `small_limit` (1 MiB) share pages of `small_page` (2 MiB);
//! * large: a request under 10 MiB gets a 20 MiB page, a larger one a page rounded to 2 MiB.
//!
//! Free blocks sit in one ordered set per pool keyed by (size, page, offset), so best fit is a
//! range query (`FreeSet`: a sorted vector while small, as it nearly always is). A block is
//! split when the remainder is worth keeping, and a freed block merges with free neighbours in
//! its page, so a page whose blocks are all free is one free block again.
//!
//! Within a page, spans sit in a table linked in offset order; a block's placement and a free
//! span's entry in the free set name their slot in it, so a free reaches its neighbours
//! through the links without a search. An ordered map of spans costs B-tree walks, a
//! large share of the host's time in a training step, and hash maps their upkeep
//! (docs/performance.md, the host path).

use crate::hash::FastMap;
use std::collections::BTreeSet;

/// Identifies a page for the lifetime of the arena (ids are never reused).
pub type PageId = u64;

const MIB: u64 = 1 << 20;

/// Which free list a block lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Requests of at most `small_limit` bytes.
    Small,
    /// Everything else.
    Large,
}

/// Sizing rules of the arena.
#[derive(Clone, Debug)]
pub struct ArenaConfig {
    /// Every offset and block size is a multiple of this (the adapter's
    /// `min_storage_buffer_offset_alignment`, at least 4).
    pub align: u64,
    /// No page is larger than this (the adapter's storage-binding limit, rounded down to `align`).
    pub max_page: u64,
    /// Largest request served from the small pool.
    pub small_limit: u64,
    /// Page size of the small pool.
    pub small_page: u64,
    /// When true every block gets its own page, released on free (`WGRAD_NO_CACHE=1`).
    pub no_cache: bool,
}

impl ArenaConfig {
    /// The default sizing for a given alignment and page cap.
    pub fn new(align: u64, max_page: u64) -> Self {
        let align = align.max(4);
        let max_page = max_page / align * align;
        ArenaConfig {
            align,
            max_page,
            small_limit: MIB,
            small_page: 2 * MIB,
            no_cache: false,
        }
    }
}

/// Where a block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The page.
    pub page: PageId,
    /// Byte offset in the page (a multiple of `align`).
    pub offset: u64,
    /// Bytes reserved for the block (a multiple of `align`, at least the rounded request).
    pub size: u64,
    /// The block's entry in its page's span table, so that a free finds it without a search.
    pub slot: u32,
}

/// No span on this side.
const NONE: u32 = u32::MAX;

/// A byte range of a page, used or free, linked to its neighbours in offset order.
#[derive(Clone, Copy, Debug)]
struct Span {
    offset: u64,
    size: u64,
    free: bool,
    prev: u32,
    next: u32,
}

/// One page's spans: a table of them linked in offset order. Every byte belongs to exactly one
/// span, used or free; no two free spans touch (`Arena::check`).
///
/// A block's placement carries its slot in the table and a free span's entry in the free set
/// carries its slot, so neither an allocation nor a free searches: a free finds its
/// neighbours through the links. The spans were three hash maps (used by offset, free by
/// offset and by end), whose upkeep was about a tenth of the recording thread's instructions
/// in a GPT step; a sorted vector of them cost nearly as much again in shifts (BENCHMARKS.md).
#[derive(Debug)]
struct Page {
    size: u64,
    pool: PoolKind,
    /// The span table; slot 0 is always the span at offset 0 (spans merge into the earlier).
    slots: Vec<Span>,
    /// Slots no span uses, for reuse.
    vacant: Vec<u32>,
    /// Spans in use.
    used: usize,
}

/// A freed span merged: its slot, offset and size, and each neighbour merged into it as
/// (size, offset, slot).
type Merged = (u32, u64, u64, [Option<(u64, u64, u32)>; 2]);

impl Page {
    fn new(size: u64, pool: PoolKind) -> Page {
        Page {
            size,
            pool,
            slots: vec![Span {
                offset: 0,
                size,
                free: true,
                prev: NONE,
                next: NONE,
            }],
            vacant: Vec::new(),
            used: 0,
        }
    }

    fn span(&self, slot: u32) -> Option<&Span> {
        self.slots.get(slot as usize)
    }

    /// Marks the free span in `slot` used for `block` bytes, the `tail` bytes after it a free
    /// span of their own: its slot (or `None` without a tail); `Err` when the slot is not free.
    fn take(&mut self, slot: u32, block: u64, tail: u64) -> std::result::Result<Option<u32>, ()> {
        let s = *self
            .span(slot)
            .filter(|s| s.free && s.size == block + tail)
            .ok_or(())?;
        self.used += 1;
        self.slots[slot as usize].free = false;
        self.slots[slot as usize].size = block;
        if tail == 0 {
            return Ok(None);
        }
        let t = Span {
            offset: s.offset + block,
            size: tail,
            free: true,
            prev: slot,
            next: s.next,
        };
        let ts = match self.vacant.pop() {
            Some(v) => {
                self.slots[v as usize] = t;
                v
            }
            None => {
                self.slots.push(t);
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[slot as usize].next = ts;
        if s.next != NONE {
            self.slots[s.next as usize].prev = ts;
        }
        Ok(Some(ts))
    }

    /// Unlinks the span in `slot` (merged into a neighbour) and keeps the slot for reuse.
    fn unlink(&mut self, slot: u32) {
        let s = self.slots[slot as usize];
        if s.prev != NONE {
            self.slots[s.prev as usize].next = s.next;
        }
        if s.next != NONE {
            self.slots[s.next as usize].prev = s.prev;
        }
        self.vacant.push(slot);
    }

    /// Frees the used span in `slot`, which must start at `offset` and hold `size` bytes, and
    /// merges it with its free neighbours; `None` when it does not match.
    fn release(&mut self, slot: u32, offset: u64, size: u64) -> Option<Merged> {
        let s = *self
            .span(slot)
            .filter(|s| !s.free && s.offset == offset && s.size == size)?;
        self.used -= 1;
        let (mut at, mut start, mut len) = (slot, offset, size);
        let mut away = [None; 2];
        if let Some(&n) = self.span(s.next).filter(|n| n.free) {
            away[0] = Some((n.size, n.offset, s.next));
            len += n.size;
            self.unlink(s.next);
        }
        if let Some(&p) = self.span(s.prev).filter(|p| p.free) {
            away[1] = Some((p.size, p.offset, s.prev));
            (at, start) = (s.prev, p.offset);
            len += p.size;
            self.unlink(slot);
        }
        let m = &mut self.slots[at as usize];
        (m.free, m.size) = (true, len);
        Some((at, start, len, away))
    }

    /// Whether the page is one free span.
    fn is_empty(&self) -> bool {
        self.used == 0
    }
}

/// A free span as (size, page, offset, slot): the order best fit searches in, and where the
/// span sits in its page's table.
type Span4 = (u64, PageId, u64, u32);

/// One pool's free spans in order; the best fit for a request is the first span at or after
/// (size, 0, 0, 0). A sorted vector while small, which is the usual case: a GPT training step
/// on lavapipe averaged under four spans a pool. A B-tree that small allocated its one node as
/// it filled and freed it as it emptied, and its upkeep was about 7% of the recording thread's
/// instructions (callgrind, BENCHMARKS.md). Past `TREE_AT` spans it becomes a B-tree until it
/// shrinks again, so that a fragmented arena does not pay for long shifts.
#[derive(Debug)]
enum FreeSet {
    Sorted(Vec<Span4>),
    Tree(BTreeSet<Span4>),
}

impl FreeSet {
    const TREE_AT: usize = 1024;
    /// Back to a vector below this (apart from `TREE_AT`, so a set near the edge does not
    /// switch at every call).
    const SORTED_AT: usize = 256;

    fn new() -> FreeSet {
        FreeSet::Sorted(Vec::new())
    }

    fn insert(&mut self, s: Span4) {
        match self {
            FreeSet::Sorted(v) => {
                let i = v.partition_point(|&e| e < s);
                v.insert(i, s);
                if v.len() > Self::TREE_AT {
                    *self = FreeSet::Tree(v.drain(..).collect());
                }
            }
            FreeSet::Tree(t) => {
                t.insert(s);
            }
        }
    }

    fn remove(&mut self, s: &Span4) -> bool {
        match self {
            FreeSet::Sorted(v) => match v.binary_search(s) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            FreeSet::Tree(t) => {
                let found = t.remove(s);
                if t.len() < Self::SORTED_AT {
                    *self = FreeSet::Sorted(t.iter().copied().collect());
                }
                found
            }
        }
    }

    /// Removes and returns the best fit for `size`.
    fn take_fit(&mut self, size: u64) -> Option<Span4> {
        let s = match self {
            FreeSet::Sorted(v) => {
                let i = v.partition_point(|&e| e < (size, 0, 0, 0));
                return (i < v.len()).then(|| v.remove(i));
            }
            FreeSet::Tree(t) => *t.range((size, 0, 0, 0)..).next()?,
        };
        self.remove(&s);
        Some(s)
    }

    /// The largest span.
    fn last(&self) -> Option<Span4> {
        match self {
            FreeSet::Sorted(v) => v.last().copied(),
            FreeSet::Tree(t) => t.last().copied(),
        }
    }

    fn contains(&self, s: &Span4) -> bool {
        match self {
            FreeSet::Sorted(v) => v.binary_search(s).is_ok(),
            FreeSet::Tree(t) => t.contains(s),
        }
    }

    fn len(&self) -> usize {
        match self {
            FreeSet::Sorted(v) => v.len(),
            FreeSet::Tree(t) => t.len(),
        }
    }
}

/// The allocator's state.
#[derive(Debug)]
pub struct Arena {
    cfg: ArenaConfig,
    pages: FastMap<PageId, Page>,
    free_small: FreeSet,
    free_large: FreeSet,
    next_page: PageId,
}

impl Arena {
    /// An empty arena.
    pub fn new(cfg: ArenaConfig) -> Self {
        Arena {
            cfg,
            pages: FastMap::default(),
            free_small: FreeSet::new(),
            free_large: FreeSet::new(),
            next_page: 0,
        }
    }

    /// The sizing rules.
    pub fn config(&self) -> &ArenaConfig {
        &self.cfg
    }

    /// The block size a request of `bytes` needs: rounded up to the alignment, never zero, so
    /// that an empty tensor still has a valid (non-empty) binding.
    pub fn round(&self, bytes: u64) -> u64 {
        bytes.max(1).div_ceil(self.cfg.align) * self.cfg.align
    }

    /// The pool a rounded size belongs to.
    pub fn pool_for(&self, size: u64) -> PoolKind {
        if size <= self.cfg.small_limit {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// The page size to create for a rounded request, capped at `max_page` (never below `size`;
    /// the caller rejects sizes above `max_page` first).
    pub fn page_size_for(&self, size: u64) -> u64 {
        if self.cfg.no_cache {
            return size;
        }
        let want = match self.pool_for(size) {
            PoolKind::Small => self.cfg.small_page,
            PoolKind::Large if size < 10 * MIB => 20 * MIB,
            PoolKind::Large => size.div_ceil(2 * MIB) * 2 * MIB,
        };
        want.min(self.cfg.max_page).max(size)
    }

    fn free_set(&mut self, pool: PoolKind) -> &mut FreeSet {
        match pool {
            PoolKind::Small => &mut self.free_small,
            PoolKind::Large => &mut self.free_large,
        }
    }

    /// Best fit for a rounded `size` among cached free blocks; `None` when nothing fits.
    pub fn try_alloc(&mut self, size: u64) -> Option<Placement> {
        debug_assert!(size.is_multiple_of(self.cfg.align) && size > 0);
        if self.cfg.no_cache {
            return None;
        }
        let pool = self.pool_for(size);
        let (free_size, page, offset, slot) = self.free_set(pool).take_fit(size)?;
        Some(self.take(page, slot, offset, free_size, size))
    }

    /// Marks the free span at (page, offset) used for `size` bytes, splitting off the rest when
    /// it is worth keeping: any aligned remainder in the small pool, 1 MiB or more in the large
    /// one (a smaller tail stays with the block rather than fragment large pages).
    fn take(
        &mut self,
        page_id: PageId,
        slot: u32,
        offset: u64,
        free_size: u64,
        size: u64,
    ) -> Placement {
        let min_split = match self.pool_for(size) {
            PoolKind::Small => self.cfg.align,
            PoolKind::Large => MIB,
        };
        let rest = free_size - size;
        let (block, tail) = if rest >= min_split {
            (size, rest)
        } else {
            (free_size, 0)
        };
        let pool = {
            let Some(page) = self.pages.get_mut(&page_id) else {
                unreachable!("free list names a page that does not exist")
            };
            let Ok(tail_slot) = page.take(slot, block, tail) else {
                unreachable!("free list names a span that is not free: {page_id}:{offset}")
            };
            (page.pool, tail_slot)
        };
        if let (pool, Some(ts)) = pool {
            self.free_set(pool)
                .insert((tail, page_id, offset + block, ts));
        }
        Placement {
            page: page_id,
            offset,
            size: block,
            slot,
        }
    }

    /// Registers a new page of `size` bytes (one free span) and serves `request` from it.
    pub fn alloc_in_new_page(&mut self, page_size: u64, request: u64) -> (PageId, Placement) {
        let id = self.next_page;
        self.next_page += 1;
        let pool = self.pool_for(request);
        self.pages.insert(id, Page::new(page_size, pool));
        let placement = self.take(id, 0, 0, page_size, request);
        (id, placement)
    }

    /// Returns a block to its page and merges it with free neighbours. With `no_cache`, the now
    /// empty page is removed and its id returned so the caller can destroy the buffer.
    pub fn free(&mut self, p: Placement) -> Option<PageId> {
        let no_cache = self.cfg.no_cache;
        let Some(page) = self.pages.get_mut(&p.page) else {
            unreachable!("free of a block whose page does not exist")
        };
        let pool = page.pool;
        let Some((slot, start, len, merged_away)) = page.release(p.slot, p.offset, p.size) else {
            unreachable!("double free or foreign block at {p:?}")
        };
        let whole = page.is_empty();
        let set = self.free_set(pool);
        for (s, off, sl) in merged_away.into_iter().flatten() {
            set.remove(&(s, p.page, off, sl));
        }
        if no_cache && whole {
            self.pages.remove(&p.page);
            return Some(p.page);
        }
        self.free_set(pool).insert((len, p.page, start, slot));
        None
    }

    /// Removes every page whose blocks are all free and returns (id, size) of each.
    pub fn release_free_pages(&mut self) -> Vec<(PageId, u64)> {
        self.release_free_pages_over(0)
    }

    /// Pages whose blocks are all free, as (id, size, pool).
    fn empty_pages(&self) -> Vec<(PageId, u64, PoolKind)> {
        self.pages
            .iter()
            .filter(|(_, pg)| pg.is_empty())
            .map(|(&id, pg)| (id, pg.size, pg.pool))
            .collect()
    }

    /// Bytes of pages whose blocks are all free (what releasing the cache would return).
    pub fn free_page_bytes(&self) -> u64 {
        self.empty_pages().iter().map(|e| e.1).sum()
    }

    /// Removes empty pages, largest first, until at most `keep` bytes of empty pages remain;
    /// returns (id, size) of each removed.
    pub fn release_free_pages_over(&mut self, keep: u64) -> Vec<(PageId, u64)> {
        let mut empty = self.empty_pages();
        let mut total: u64 = empty.iter().map(|e| e.1).sum();
        // Largest first (then by id, so the order does not depend on the map's): fewest
        // driver calls, and small pages, the ones reused most, stay.
        empty.sort_by_key(|e| (std::cmp::Reverse(e.1), e.0));
        let mut out = Vec::new();
        for (id, size, pool) in empty {
            if total <= keep {
                break;
            }
            self.pages.remove(&id);
            // An empty page is one free span, in slot 0.
            self.free_set(pool).remove(&(size, id, 0, 0));
            total -= size;
            out.push((id, size));
        }
        out
    }

    /// The largest cached free block, in bytes (0 when none).
    pub fn largest_free(&self) -> u64 {
        let a = self.free_small.last().map_or(0, |e| e.0);
        let b = self.free_large.last().map_or(0, |e| e.0);
        a.max(b)
    }

    /// Number of pages, small and large.
    pub fn page_counts(&self) -> (usize, usize) {
        let small = self
            .pages
            .values()
            .filter(|p| p.pool == PoolKind::Small)
            .count();
        (small, self.pages.len() - small)
    }

    /// Checks every invariant; returns a description of the first violation. Used by tests.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut free_count = 0;
        for (&id, page) in &self.pages {
            // Every span in offset order through the links: (offset, size, free, slot).
            let mut spans = Vec::new();
            let (mut at, mut prev) = (0u32, NONE);
            while at != NONE {
                let Some(sp) = page.span(at) else {
                    return Err(format!("page {id}: link to missing slot {at}"));
                };
                if sp.prev != prev || spans.len() > page.slots.len() || page.vacant.contains(&at) {
                    return Err(format!("page {id}: broken links at slot {at}"));
                }
                spans.push((sp.offset, sp.size, sp.free, at));
                (prev, at) = (at, sp.next);
            }
            if spans.len() + page.vacant.len() != page.slots.len() {
                return Err(format!("page {id}: slots neither linked nor vacant"));
            }
            if spans.iter().filter(|s| !s.2).count() != page.used {
                return Err(format!("page {id}: {} spans counted in use", page.used));
            }
            let mut expect = 0u64;
            let mut prev_free = false;
            for &(off, size, free, slot) in &spans {
                if off != expect {
                    return Err(format!(
                        "page {id}: gap or overlap at {off}, expected {expect}"
                    ));
                }
                if off % self.cfg.align != 0 || size % self.cfg.align != 0 || size == 0 {
                    return Err(format!("page {id}: misaligned span {off}+{size}"));
                }
                if free && prev_free {
                    return Err(format!(
                        "page {id}: adjacent free spans not merged at {off}"
                    ));
                }
                if free {
                    free_count += 1;
                    let set = match page.pool {
                        PoolKind::Small => &self.free_small,
                        PoolKind::Large => &self.free_large,
                    };
                    if !set.contains(&(size, id, off, slot)) {
                        return Err(format!("page {id}: free span {off} missing from free list"));
                    }
                }
                prev_free = free;
                expect = off + size;
            }
            if expect != page.size {
                return Err(format!(
                    "page {id}: spans cover {expect} of {} bytes",
                    page.size
                ));
            }
            let largest = spans.iter().map(|s| s.1).max().unwrap_or(0);
            if page.size > self.cfg.max_page.max(largest) {
                return Err(format!("page {id}: size {} above the page cap", page.size));
            }
        }
        if free_count != self.free_small.len() + self.free_large.len() {
            return Err("free lists hold entries for spans that are not free".into());
        }
        Ok(())
    }

    /// True when every page is a single free span.
    pub fn all_free(&self) -> bool {
        self.pages.values().all(|p| p.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arena() -> Arena {
        Arena::new(ArenaConfig::new(256, 64 * MIB))
    }

    fn alloc(a: &mut Arena, bytes: u64) -> Placement {
        let size = a.round(bytes);
        if let Some(p) = a.try_alloc(size) {
            return p;
        }
        let ps = a.page_size_for(size);
        a.alloc_in_new_page(ps, size).1
    }

    #[test]
    fn reuse_and_coalesce() {
        let mut a = arena();
        let x = alloc(&mut a, 1000);
        let y = alloc(&mut a, 1000);
        assert_eq!(x.page, y.page);
        assert_eq!(y.offset, 1024);
        a.free(x);
        a.free(y);
        assert_eq!(a.check(), Ok(()));
        assert!(a.all_free());
        let z = alloc(&mut a, 2048);
        assert_eq!(
            (z.page, z.offset),
            (x.page, 0),
            "freed neighbours merged and reused"
        );
    }

    /// The free set answers as an ordered set would, as a vector and as a tree: filled past
    /// `TREE_AT` and emptied below `SORTED_AT`, with removals of absent spans and best fits.
    #[test]
    fn free_set_matches_an_ordered_set() {
        let mut set = FreeSet::new();
        let mut model = BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut went_tree = false;
        for round in 0..2 {
            // Fill (mostly inserts), then drain (mostly removals and fits).
            for _ in 0..3000 {
                let s = (
                    next(64) * 256 + 256,
                    next(8),
                    next(1 << 20) * 256,
                    next(4) as u32,
                );
                let insert = if round == 0 {
                    next(4) < 3
                } else {
                    next(8) == 0
                };
                if insert {
                    set.insert(s);
                    model.insert(s);
                } else if next(4) == 0 {
                    assert_eq!(set.remove(&s), model.remove(&s));
                } else {
                    let want = model.range((s.0, 0, 0, 0)..).next().copied();
                    if let Some(w) = want {
                        model.remove(&w);
                    }
                    assert_eq!(set.take_fit(s.0), want);
                }
                went_tree |= matches!(set, FreeSet::Tree(_));
                assert_eq!(set.len(), model.len());
                assert_eq!(set.last(), model.last().copied());
                assert!(set.contains(&s) == model.contains(&s));
            }
        }
        assert!(went_tree, "the test never reached the tree");
        assert!(
            matches!(set, FreeSet::Sorted(_)),
            "the set never shrank back to a vector"
        );
    }

    #[test]
    fn pools_and_page_sizes() {
        let a = arena();
        assert_eq!(a.page_size_for(256), 2 * MIB);
        assert_eq!(a.page_size_for(2 * MIB), 20 * MIB);
        assert_eq!(a.page_size_for(11 * MIB), 12 * MIB);
        assert_eq!(a.page_size_for(63 * MIB), 64 * MIB);
        let capped = Arena::new(ArenaConfig::new(256, 8 * MIB));
        assert_eq!(
            capped.page_size_for(2 * MIB),
            8 * MIB,
            "pages never exceed the cap"
        );
    }

    #[test]
    fn release_only_empty_pages() {
        let mut a = arena();
        let x = alloc(&mut a, 100);
        let _y = alloc(&mut a, 5 * MIB);
        a.free(x);
        let released = a.release_free_pages();
        assert_eq!(released.len(), 1);
        assert_eq!(a.page_counts(), (0, 1));
        assert_eq!(a.check(), Ok(()));
    }

    #[test]
    fn no_cache_frees_pages() {
        let mut cfg = ArenaConfig::new(256, 64 * MIB);
        cfg.no_cache = true;
        let mut a = Arena::new(cfg);
        let x = alloc(&mut a, 100);
        let y = alloc(&mut a, 100);
        assert_ne!(x.page, y.page);
        assert_eq!(a.free(x), Some(x.page));
        assert_eq!(a.page_counts(), (1, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random alloc/free sequences keep every invariant: aligned offsets, live blocks never
        /// overlap, and after freeing everything each page is one free block.
        #[test]
        fn random_sequences(ops in prop::collection::vec((0u8..3, 1u64..3_000_000, any::<prop::sample::Index>()), 1..300)) {
            let mut a = arena();
            let mut live: Vec<Placement> = Vec::new();
            for (kind, bytes, pick) in ops {
                if kind < 2 || live.is_empty() {
                    // Mostly small sizes, some large, so both pools and splits are exercised.
                    let bytes = if kind == 0 { bytes % 5000 + 1 } else { bytes };
                    let p = alloc(&mut a, bytes);
                    prop_assert_eq!(p.offset % 256, 0);
                    prop_assert!(p.size >= a.round(bytes));
                    for q in &live {
                        let disjoint = q.page != p.page || q.offset + q.size <= p.offset || p.offset + p.size <= q.offset;
                        prop_assert!(disjoint, "{:?} overlaps {:?}", p, q);
                    }
                    live.push(p);
                } else {
                    let i = pick.index(live.len());
                    a.free(live.swap_remove(i));
                }
                a.check().map_err(TestCaseError::fail)?;
            }
            for p in live.drain(..) {
                a.free(p);
            }
            a.check().map_err(TestCaseError::fail)?;
            prop_assert!(a.all_free());
        }
    }
}
