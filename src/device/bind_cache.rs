//! Bind groups kept for reuse, keyed by what they bind.
//!
//! Why: a training step repeats the same launches on the same memory (the pool hands the
//! same blocks back each step), and creating a bind group per dispatch costs the host
//! microseconds each, milliseconds of a GPT step's hundreds of dispatches
//! (docs/performance.md, the host path). The
//! kernel's parameters are bound with a dynamic offset into the stream's parameter buffer, so
//! a bind group depends only on the pipeline's layout, the parameter block's size and the
//! storage ranges, and the next step finds it here.
//!
//! Lifetime: an entry holds its buffers alive. The memory pool calls [`BindCache::forget`]
//! whenever it returns a page to the driver, so no entry outlives its memory; the cache is
//! also cleared past [`MAX_ENTRIES`] (workloads whose shapes keep changing), which costs
//! only re-creation.

use super::stream::Slice;
use crate::hash::{FastHasher, FastMap};
use std::hash::Hasher;

/// Entries kept before the cache is cleared.
pub(crate) const MAX_ENTRIES: usize = 8192;

/// Most storage bindings a dispatch may have: the grouped optimizer update's 21 (four
/// parameters' five blocks each, and the control block).
pub(crate) const MAX_STORAGE: usize = 21;

/// A storage binding's size as bound: wgpu refuses a zero-sized binding.
pub(crate) fn bound_size(s: &Slice<'_>) -> u64 {
    s.size.max(4)
}

/// Words of a key before its ranges: layout id, parameter bytes, range count.
const HEAD: usize = 3;

/// A storage binding as the cache keys it: (page, offset, bound size).
pub(crate) trait Bound {
    fn range(&self) -> [u64; 3];
}

impl Bound for Slice<'_> {
    fn range(&self) -> [u64; 3] {
        [self.page, self.offset, bound_size(self)]
    }
}

impl Bound for [u64; 3] {
    fn range(&self) -> [u64; 3] {
        *self
    }
}

/// Writes the words of what a bind group binds into `out` (`HEAD + 3 storage.len()` long):
/// the pipeline's layout by its id, the parameter block's bytes, and each storage range as
/// (page, offset, bound size). Page ids are never reused on a device, so no entry can match a
/// later page; the bind group itself holds its buffers alive.
fn key_words(layout: u64, params: u64, storage: &[impl Bound], out: &mut [u64]) {
    out[..HEAD].copy_from_slice(&[layout, params, storage.len() as u64]);
    for (w, s) in out[HEAD..].chunks_exact_mut(3).zip(storage) {
        w.copy_from_slice(&s.range());
    }
}

/// Whether `words` (one entry's key) is the key of (`layout`, `params`, `storage`).
fn same_key(words: &[u64], layout: u64, params: u64, storage: &[impl Bound]) -> bool {
    words.len() == HEAD + 3 * storage.len()
        && words[0] == layout
        && words[1] == params
        && words[HEAD..]
            .chunks_exact(3)
            .zip(storage)
            .all(|(w, s)| *w == s.range())
}

fn hash_words(words: &[u64]) -> u64 {
    let mut h = FastHasher::default();
    for &w in words {
        h.write_u64(w);
    }
    h.finish()
}

/// One bind group, and where its key lies in [`BindCache::keys`].
struct Entry<V> {
    start: u32,
    len: u32,
    /// The next entry whose key has the same hash (`u32::MAX`: none).
    next: u32,
    bg: V,
}

/// The cache. Entries are kept in the order they were made, their keys packed one after
/// another in one vector, and a lookup first tries the entry after the one the last lookup
/// found: a training step makes its bind groups in launch order on its first pass and asks for
/// them in the same order on every later one, so lookups walk both vectors front to back and
/// the hash table is read only where the order breaks.
///
/// Why: as one hash table of handles, a lookup missed the cache on the slot and on what it
/// pointed to; a profile of the GPT step on lavapipe (`perf`) put the cache at over a tenth
/// of the recording thread's time, nearly all of it in those loads.
pub(crate) struct BindCache<V = wgpu::BindGroup> {
    keys: Vec<u64>,
    entries: Vec<Entry<V>>,
    /// The first entry of each key hash.
    index: FastMap<u64, u32>,
    /// The entry the last lookup found or made.
    last: usize,
    /// Bind groups created / found, for the tests and the profiler's curious.
    pub created: u64,
    pub reused: u64,
}

impl<V> Default for BindCache<V> {
    fn default() -> Self {
        BindCache {
            keys: Vec::new(),
            entries: Vec::new(),
            index: FastMap::default(),
            last: 0,
            created: 0,
            reused: 0,
        }
    }
}

impl<V: Clone> BindCache<V> {
    fn words(&self, e: &Entry<V>) -> &[u64] {
        &self.keys[e.start as usize..(e.start + e.len) as usize]
    }

    /// The entry binding exactly (`layout`, `params`, `storage`), if kept.
    fn find(&self, layout: u64, params: u64, storage: &[impl Bound]) -> Option<usize> {
        // The launch order repeating.
        let next = self.last + 1;
        if let Some(e) = self.entries.get(next)
            && same_key(self.words(e), layout, params, storage)
        {
            return Some(next);
        }
        // The key on the stack (no allocation where the order breaks); the caller keeps
        // `storage` within MAX_STORAGE.
        let mut buf = [0u64; HEAD + 3 * MAX_STORAGE];
        let words = buf.get_mut(..HEAD + 3 * storage.len())?;
        key_words(layout, params, storage, words);
        let words = &*words;
        let mut at = *self.index.get(&hash_words(words))?;
        while let Some(e) = self.entries.get(at as usize) {
            if self.words(e) == words {
                return Some(at as usize);
            }
            at = e.next;
        }
        None
    }

    /// Appends an entry (after the caller found none with this key).
    fn push(&mut self, layout: u64, params: u64, storage: &[impl Bound], bg: V) {
        let start = self.keys.len();
        let len = HEAD + 3 * storage.len();
        self.keys.resize(start + len, 0);
        key_words(layout, params, storage, &mut self.keys[start..]);
        let at = self.entries.len() as u32;
        let hash = hash_words(&self.keys[start..]);
        let next = self.index.insert(hash, at).unwrap_or(u32::MAX);
        self.entries.push(Entry {
            start: start as u32,
            len: len as u32,
            next,
            bg,
        });
        self.last = at as usize;
    }

    /// The bind group binding `params` bytes of parameters and `storage` in order with the
    /// layout whose id is `layout`, made by `make` the first time; `None` past
    /// [`MAX_STORAGE`] bindings.
    pub(crate) fn get_or(
        &mut self,
        layout: u64,
        params: u64,
        storage: &[impl Bound],
        make: impl FnOnce() -> V,
    ) -> Option<V> {
        if storage.len() > MAX_STORAGE {
            return None;
        }
        if let Some(i) = self.find(layout, params, storage) {
            self.last = i;
            self.reused += 1;
            return Some(self.entries[i].bg.clone());
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.clear();
        }
        self.created += 1;
        let bg = make();
        self.push(layout, params, storage, bg.clone());
        Some(bg)
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.entries.clear();
        self.index.clear();
        self.last = 0;
    }

    /// Drops every entry that binds page `page` (going back to the driver), keeping the others
    /// in their order. Bind groups already recorded in a batch keep their buffers until it is
    /// submitted.
    pub(crate) fn forget(&mut self, page: u64) {
        let binds = |w: &[u64]| w[HEAD..].chunks_exact(3).any(|r| r[0] == page);
        if !self.entries.iter().any(|e| binds(self.words(e))) {
            return;
        }
        let keys = std::mem::take(&mut self.keys);
        let entries = std::mem::take(&mut self.entries);
        self.index.clear();
        for e in entries {
            let w = &keys[e.start as usize..(e.start + e.len) as usize];
            if binds(w) {
                continue;
            }
            let start = self.keys.len();
            self.keys.extend_from_slice(w);
            let at = self.entries.len() as u32;
            let next = self.index.insert(hash_words(w), at).unwrap_or(u32::MAX);
            self.entries.push(Entry {
                start: start as u32,
                len: e.len,
                next,
                bg: e.bg,
            });
        }
        self.last = 0;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Cache = BindCache<u32>;

    /// Looks up `ranges` with layout `layout`; a new entry's value is `made`.
    fn get(c: &mut Cache, layout: u64, ranges: &[[u64; 3]], made: u32) -> u32 {
        c.get_or(layout, 16, ranges, || made).unwrap_or(u32::MAX)
    }

    #[test]
    fn entries_are_found_in_order_out_of_order_and_told_apart() {
        let mut c = Cache::default();
        let keys: [(u64, &[[u64; 3]]); 7] = [
            (1, &[[0, 0, 256], [0, 256, 512]]),
            (2, &[[0, 0, 256], [0, 256, 512]]),
            (1, &[[1, 0, 256], [0, 256, 512]]),
            (1, &[[0, 0, 256], [0, 512, 512]]),
            (1, &[[0, 0, 256], [0, 256, 768]]),
            (1, &[[0, 0, 256]]),
            (1, &[[0, 0, 256], [0, 256, 512], [0, 0, 4]]),
        ];
        for (i, (l, r)) in keys.iter().enumerate() {
            assert_eq!(get(&mut c, *l, r, i as u32), i as u32);
        }
        assert_eq!((c.created, c.len()), (7, 7));
        // The same order again (each the entry after the last), then backwards.
        for (i, (l, r)) in keys.iter().enumerate() {
            assert_eq!(get(&mut c, *l, r, 99), i as u32);
        }
        for (i, (l, r)) in keys.iter().enumerate().rev() {
            assert_eq!(get(&mut c, *l, r, 99), i as u32);
        }
        assert_eq!((c.created, c.reused), (7, 14));
        // A different parameter size is another bind group.
        assert_eq!(c.get_or(1, 32, keys[0].1, || 50), Some(50));
        assert_eq!(
            c.get_or(1, 16, &[[0u64, 0, 0]; MAX_STORAGE + 1], || 51),
            None
        );
    }

    #[test]
    fn forgetting_a_page_drops_its_entries_and_keeps_the_rest() {
        let mut c = Cache::default();
        get(&mut c, 1, &[[3, 0, 256]], 0);
        get(&mut c, 1, &[[4, 0, 256], [3, 256, 256]], 1);
        get(&mut c, 1, &[[4, 0, 256]], 2);
        get(&mut c, 2, &[[5, 0, 256]], 3);
        c.forget(3);
        assert_eq!(c.len(), 2);
        assert_eq!(get(&mut c, 1, &[[4, 0, 256]], 9), 2);
        assert_eq!(get(&mut c, 2, &[[5, 0, 256]], 9), 3);
        // Page 3's entries are made again.
        assert_eq!(get(&mut c, 1, &[[3, 0, 256]], 7), 7);
        c.forget(8);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn colliding_hashes_chain() {
        let mut c = Cache::default();
        let mut words = [0u64; HEAD + 3];
        key_words(1, 16, &[[0u64, 0, 256]], &mut words);
        // A second entry forced under the first's hash: both stay reachable.
        get(&mut c, 1, &[[0, 0, 256]], 0);
        let h = hash_words(&words);
        let start = c.keys.len();
        c.keys.resize(start + HEAD + 3, 0);
        key_words(1, 16, &[[9u64, 0, 256]], &mut c.keys[start..]);
        let next = c.index.insert(h, 1).unwrap_or(u32::MAX);
        c.entries.push(Entry {
            start: start as u32,
            len: (c.keys.len() - start) as u32,
            next,
            bg: 1,
        });
        c.last = 1;
        assert_eq!(c.find(1, 16, &[[0u64, 0, 256]]), Some(0));
        c.last = 0;
        assert_eq!(c.find(1, 16, &[[9u64, 0, 256]]), Some(1));
    }
}
