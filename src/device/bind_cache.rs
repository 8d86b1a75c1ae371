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

use crate::hash::FastMap;

/// Entries kept before the cache is cleared.
pub(crate) const MAX_ENTRIES: usize = 8192;

/// Most storage bindings a dispatch may have.
pub(crate) const MAX_STORAGE: usize = 10;

/// What a bind group binds. The storage ranges sit inline, not behind a pointer: a lookup
/// then reads the table's entry alone, where a vector's elements cost one more cache miss
/// each launch (and an allocation to build the key; seen in a lavapipe profile).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    layout: wgpu::BindGroupLayout,
    /// Bytes of the parameter block (the binding's size; its offset is dynamic).
    params: u64,
    /// (buffer, offset, size) of each storage binding, in binding order; `None` past the
    /// last.
    storage: [Option<(wgpu::Buffer, u64, u64)>; MAX_STORAGE],
}

impl BindKey {
    /// The key of `layout` binding a parameter block of `params` bytes and `storage` ranges
    /// in order; `None` past [`MAX_STORAGE`].
    pub(crate) fn new(
        layout: &wgpu::BindGroupLayout,
        params: u64,
        storage: impl ExactSizeIterator<Item = (wgpu::Buffer, u64, u64)>,
    ) -> Option<BindKey> {
        if storage.len() > MAX_STORAGE {
            return None;
        }
        let mut key = BindKey {
            layout: layout.clone(),
            params,
            storage: [const { None }; MAX_STORAGE],
        };
        for (slot, s) in key.storage.iter_mut().zip(storage) {
            *slot = Some(s);
        }
        Some(key)
    }

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
}

#[derive(Default)]
pub(crate) struct BindCache {
    map: FastMap<BindKey, wgpu::BindGroup>,
    /// Bind groups created / found, for the tests and the profiler's curious.
    pub created: u64,
    pub reused: u64,
}

impl BindCache {
    /// The bind group for `key`, made by `make` the first time.
    pub(crate) fn get_or(
        &mut self,
        key: BindKey,
        make: impl FnOnce(&BindKey) -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        if let Some(bg) = self.map.get(&key) {
            self.reused += 1;
            return bg.clone();
        }
        if self.map.len() >= MAX_ENTRIES {
            self.map.clear();
        }
        self.created += 1;
        let bg = make(&key);
        self.map.insert(key, bg.clone());
        bg
    }

    /// Drops every entry that binds `buffer` (a page going back to the driver). Bind groups
    /// already recorded in a batch keep their own handles until it is submitted.
    pub(crate) fn forget(&mut self, buffer: &wgpu::Buffer) {
        self.map
            .retain(|k, _| !k.storage().any(|(b, ..)| b == buffer));
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
