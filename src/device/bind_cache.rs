//! Bind groups kept for reuse, keyed by what they bind.
//!
//! Why: a training step repeats the same launches on the same memory (the pool hands the
//! same blocks back each step), and creating a bind group per dispatch cost the host about
//! 5 us each, 2.1 ms of an f16 GPT step of 434 dispatches on an H100 (BENCHMARKS.md). The
//! kernel's parameters are bound with a dynamic offset into the stream's parameter buffer, so
//! a bind group depends only on the pipeline's layout, the parameter block's size and the
//! storage ranges, and the next step finds it here.
//!
//! Lifetime: an entry holds its buffers alive. The memory pool calls [`BindCache::forget`]
//! whenever it returns a page to the driver, so no entry outlives its memory; the cache is
//! also cleared past [`MAX_ENTRIES`] (workloads whose shapes keep changing), which costs
//! only re-creation.

use super::stream::Slice;
use crate::hash::FastMap;
use std::hash::{Hash, Hasher};

/// Entries kept before the cache is cleared.
pub(crate) const MAX_ENTRIES: usize = 8192;

/// Most storage bindings a dispatch may have: the grouped optimizer update's 21 (four
/// parameters' five blocks each, and the control block).
pub(crate) const MAX_STORAGE: usize = 21;

/// What a bind group binds, as plain numbers: the pipeline's layout by its id, and each storage
/// range by (page, offset, size). Page ids are never reused on a device, so no entry can match
/// a later page; the bind group itself holds its buffers alive.
///
/// Why numbers, kept in the table's own slots: a lookup then reads the control bytes and one
/// slot. The entries were a vector per hash holding the wgpu handles, and a lavapipe profile of
/// the GPT step (`perf`, twenty-sixth session) found the cache at 13% of the recording
/// thread's time, nearly all of it waiting on the vector's memory and the slot's.
#[derive(Clone, Copy)]
pub(crate) struct BindKey {
    layout: u64,
    /// Bytes of the parameter block (the binding's size; its offset is dynamic).
    params: u64,
    n: usize,
    /// (page, offset, bound size) of each storage binding, in binding order; zero past `n`.
    storage: [[u64; 3]; MAX_STORAGE],
}

/// A storage binding's size as bound: wgpu refuses a zero-sized binding.
pub(crate) fn bound_size(s: &Slice<'_>) -> u64 {
    s.size.max(4)
}

impl BindKey {
    /// The key of `storage` bound with layout `layout` and `params` bytes of parameters;
    /// `None` past [`MAX_STORAGE`] bindings.
    fn new(layout: u64, params: u64, storage: &[Slice<'_>]) -> Option<BindKey> {
        if storage.len() > MAX_STORAGE {
            return None;
        }
        let mut k = BindKey {
            layout,
            params,
            n: storage.len(),
            storage: [[0; 3]; MAX_STORAGE],
        };
        for (slot, s) in k.storage.iter_mut().zip(storage) {
            *slot = [s.page, s.offset, bound_size(s)];
        }
        Some(k)
    }

    fn used(&self) -> &[[u64; 3]] {
        &self.storage[..self.n]
    }
}

impl PartialEq for BindKey {
    fn eq(&self, o: &BindKey) -> bool {
        self.layout == o.layout && self.params == o.params && self.used() == o.used()
    }
}

impl Eq for BindKey {}

impl Hash for BindKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.layout);
        h.write_u64(self.params);
        for r in self.used() {
            h.write_u64(r[0]);
            h.write_u64(r[1]);
            h.write_u64(r[2]);
        }
    }
}

#[derive(Default)]
pub(crate) struct BindCache {
    map: FastMap<BindKey, wgpu::BindGroup>,
    /// Bind groups created / found, for the tests and the profiler's curious.
    pub created: u64,
    pub reused: u64,
}

impl BindCache {
    /// The bind group binding `params` bytes of parameters and `storage` in order with the
    /// layout whose id is `layout`, made by `make` the first time; `None` past
    /// [`MAX_STORAGE`] bindings.
    pub(crate) fn get_or(
        &mut self,
        layout: u64,
        params: u64,
        storage: &[Slice<'_>],
        make: impl FnOnce() -> wgpu::BindGroup,
    ) -> Option<wgpu::BindGroup> {
        let key = BindKey::new(layout, params, storage)?;
        if let Some(bg) = self.map.get(&key) {
            self.reused += 1;
            return Some(bg.clone());
        }
        if self.map.len() >= MAX_ENTRIES {
            self.map.clear();
        }
        self.created += 1;
        let bg = make();
        self.map.insert(key, bg.clone());
        Some(bg)
    }

    /// Drops every entry that binds page `page` (going back to the driver). Bind groups
    /// already recorded in a batch keep their buffers until it is submitted.
    pub(crate) fn forget(&mut self, page: u64) {
        self.map
            .retain(|k, _| k.used().iter().all(|r| r[0] != page));
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::FastHasher;

    fn key(layout: u64, ranges: &[[u64; 3]]) -> BindKey {
        let mut k = BindKey {
            layout,
            params: 16,
            n: ranges.len(),
            storage: [[0; 3]; MAX_STORAGE],
        };
        k.storage[..ranges.len()].copy_from_slice(ranges);
        k
    }

    fn hash(k: &BindKey) -> u64 {
        let mut h = FastHasher::default();
        k.hash(&mut h);
        h.finish()
    }

    #[test]
    fn keys_tell_layouts_pages_offsets_sizes_and_counts_apart() {
        let a = key(1, &[[0, 0, 256], [0, 256, 512]]);
        assert!(a == key(1, &[[0, 0, 256], [0, 256, 512]]));
        assert_eq!(hash(&a), hash(&key(1, &[[0, 0, 256], [0, 256, 512]])));
        for other in [
            key(2, &[[0, 0, 256], [0, 256, 512]]),
            key(1, &[[1, 0, 256], [0, 256, 512]]),
            key(1, &[[0, 0, 256], [0, 512, 512]]),
            key(1, &[[0, 0, 256], [0, 256, 768]]),
            key(1, &[[0, 0, 256]]),
            key(1, &[[0, 0, 256], [0, 256, 512], [0, 0, 0]]),
        ] {
            assert!(a != other);
        }
    }
}
