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
use crate::hash::{FastHasher, FastMap};
use std::hash::{Hash, Hasher};

/// Entries kept before the cache is cleared.
pub(crate) const MAX_ENTRIES: usize = 8192;

/// Most storage bindings a dispatch may have: the grouped optimizer update's 21 (four
/// parameters' five blocks each, and the control block).
pub(crate) const MAX_STORAGE: usize = 21;

/// What a bind group binds. The storage ranges sit inline, not behind a pointer: a lookup
/// then reads the table's entry alone, where a vector's elements cost one more cache miss
/// each launch (and an allocation to build the key; seen in a lavapipe profile). The key owns
/// its handles, so no entry can match a later buffer that reuses a dead one's address.
pub(crate) struct BindKey {
    layout: wgpu::BindGroupLayout,
    /// Bytes of the parameter block (the binding's size; its offset is dynamic).
    params: u64,
    /// (buffer, offset, size) of each storage binding, in binding order; `None` past the
    /// last.
    storage: [Option<(wgpu::Buffer, u64, u64)>; MAX_STORAGE],
}

/// A storage binding's size as bound: wgpu refuses a zero-sized binding.
fn bound_size(s: &Slice<'_>) -> u64 {
    s.size.max(4)
}

impl BindKey {
    pub(crate) fn layout(&self) -> &wgpu::BindGroupLayout {
        &self.layout
    }

    pub(crate) fn params(&self) -> u64 {
        self.params
    }

    /// The storage ranges, in binding order.
    pub(crate) fn storage(&self) -> impl Iterator<Item = &(wgpu::Buffer, u64, u64)> {
        self.storage.iter().map_while(Option::as_ref)
    }

    /// Whether this key binds exactly `layout`, `params` and `storage`.
    fn matches(&self, layout: &wgpu::BindGroupLayout, params: u64, storage: &[Slice<'_>]) -> bool {
        self.layout == *layout
            && self.params == params
            && self.storage().count() == storage.len()
            && self
                .storage()
                .zip(storage)
                .all(|((b, o, n), s)| b == s.buffer && *o == s.offset && *n == bound_size(s))
    }
}

/// The hash a lookup and the entry it finds share, computed from borrowed handles so that a
/// lookup clones nothing (a clone is two atomic increments per buffer, and the drop two
/// decrements).
fn hash_of(layout: &wgpu::BindGroupLayout, params: u64, storage: &[Slice<'_>]) -> u64 {
    let mut h = FastHasher::default();
    layout.hash(&mut h);
    params.hash(&mut h);
    for s in storage {
        s.buffer.hash(&mut h);
        s.offset.hash(&mut h);
        bound_size(s).hash(&mut h);
    }
    h.finish()
}

#[derive(Default)]
pub(crate) struct BindCache {
    /// Entries by [`hash_of`] what they bind; a bucket holds more than one only when hashes
    /// collide.
    map: FastMap<u64, Vec<(BindKey, wgpu::BindGroup)>>,
    entries: usize,
    /// Bind groups created / found, for the tests and the profiler's curious.
    pub created: u64,
    pub reused: u64,
}

impl BindCache {
    /// The bind group binding `params` bytes of parameters and `storage` in order with
    /// `layout`, made by `make` the first time; `None` past [`MAX_STORAGE`] bindings.
    pub(crate) fn get_or(
        &mut self,
        layout: &wgpu::BindGroupLayout,
        params: u64,
        storage: &[Slice<'_>],
        make: impl FnOnce(&BindKey) -> wgpu::BindGroup,
    ) -> Option<wgpu::BindGroup> {
        if storage.len() > MAX_STORAGE {
            return None;
        }
        let hash = hash_of(layout, params, storage);
        if let Some(bucket) = self.map.get(&hash)
            && let Some((_, bg)) = bucket
                .iter()
                .find(|(k, _)| k.matches(layout, params, storage))
        {
            self.reused += 1;
            return Some(bg.clone());
        }
        if self.entries >= MAX_ENTRIES {
            self.map.clear();
            self.entries = 0;
        }
        let mut key = BindKey {
            layout: layout.clone(),
            params,
            storage: [const { None }; MAX_STORAGE],
        };
        for (slot, s) in key.storage.iter_mut().zip(storage) {
            *slot = Some((s.buffer.clone(), s.offset, bound_size(s)));
        }
        self.created += 1;
        let bg = make(&key);
        self.map.entry(hash).or_default().push((key, bg.clone()));
        self.entries += 1;
        Some(bg)
    }

    /// Drops every entry that binds `buffer` (a page going back to the driver). Bind groups
    /// already recorded in a batch keep their own handles until it is submitted.
    pub(crate) fn forget(&mut self, buffer: &wgpu::Buffer) {
        let mut entries = 0;
        self.map.retain(|_, bucket| {
            bucket.retain(|(k, _)| !k.storage().any(|(b, ..)| b == buffer));
            entries += bucket.len();
            !bucket.is_empty()
        });
        self.entries = entries;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries
    }
}
