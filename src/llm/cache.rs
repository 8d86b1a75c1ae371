//! The key/value cache of a decoder: each layer's keys and values of every position seen so
//! far, on the device, so a new token attends to them without recomputing them.
//!
//! One tensor for the keys and one for the values per layer, `[batch, kv_heads, capacity,
//! head_dim]`, allocated once (from the device's arena, so the memory report shows them) when
//! the cache is made; each step writes its new positions in place and attention reads the
//! filled prefix through a view. Rows advance independently: prompts of different lengths
//! share one cache.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Keys and values of every layer for `batch` sequences of up to `capacity` positions.
pub struct KvCache {
    pub(crate) keys: Vec<Tensor>,
    pub(crate) values: Vec<Tensor>,
    lens: Vec<usize>,
    capacity: usize,
}

impl KvCache {
    /// An empty cache of `layers` layers for `batch` sequences of up to `capacity` positions.
    pub fn new(
        dev: &Device,
        layers: usize,
        batch: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
    ) -> Result<KvCache> {
        if batch == 0 || capacity == 0 {
            return Err(Error::invalid(
                "KvCache::new",
                format!("a cache of {batch} sequences of {capacity} positions"),
            ));
        }
        let shape = [batch, kv_heads, capacity, head_dim];
        let mut keys = Vec::with_capacity(layers);
        let mut values = Vec::with_capacity(layers);
        for _ in 0..layers {
            keys.push(Tensor::zeros(dev, &shape, dtype)?);
            values.push(Tensor::zeros(dev, &shape, dtype)?);
        }
        Ok(KvCache {
            keys,
            values,
            lens: vec![0; batch],
            capacity,
        })
    }

    /// Sequences the cache holds.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Positions each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions sequence `row` has filled.
    pub fn len(&self, row: usize) -> usize {
        self.lens.get(row).copied().unwrap_or(0)
    }

    /// True when no sequence has a position.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// Forgets every position (the memory stays allocated).
    pub fn clear(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
    }

    /// Bytes the cache holds on the device.
    pub fn nbytes(&self) -> u64 {
        self.keys
            .iter()
            .chain(&self.values)
            .map(Tensor::nbytes)
            .sum()
    }

    /// Checks that `rows` exist and can take `new` more positions each.
    pub(crate) fn check(&self, rows: &[usize], new: usize) -> Result<()> {
        for &r in rows {
            let Some(&len) = self.lens.get(r) else {
                return Err(Error::invalid(
                    "KvCache",
                    format!("row {r} of a cache of {} sequences", self.batch()),
                ));
            };
            if len + new > self.capacity {
                return Err(Error::invalid(
                    "KvCache",
                    format!(
                        "sequence {r} would hold {} positions, past the cache's {} (the context)",
                        len + new,
                        self.capacity
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Writes layer `layer`'s new keys and values `[kv_heads, new, head_dim]` of sequence
    /// `row` at its current length (the length advances in [`KvCache::advance`]).
    pub(crate) fn write(&self, layer: usize, row: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let at = self.lens[row];
        let n = k.shape()[1];
        for (cache, new) in [(&self.keys[layer], k), (&self.values[layer], v)] {
            let slot = cache.narrow(0, row, 1)?.squeeze(0)?.narrow(1, at, n)?;
            slot.assign(new)?;
        }
        Ok(())
    }

    /// Layer `layer`'s keys and values of sequence `row`, its first `len` positions, as
    /// `[1, kv_heads, len, head_dim]` views.
    pub(crate) fn prefix(&self, layer: usize, row: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let view = |t: &Tensor| t.narrow(0, row, 1)?.narrow(2, 0, len);
        Ok((view(&self.keys[layer])?, view(&self.values[layer])?))
    }

    /// Marks `new` more positions filled in each of `rows`.
    pub(crate) fn advance(&mut self, rows: &[usize], new: usize) {
        for &r in rows {
            self.lens[r] += new;
        }
    }
}
