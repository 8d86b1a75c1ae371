//! Data: datasets, a prefetching loader that overlaps host work and uploads with compute,
//! memory-mapped record files, MNIST's IDX files, and character-level text.
//!
//! A [`Dataset`] hands out samples by index on the host: features of one element type and
//! u32 labels. [`InMemory`] holds them in vectors, [`MmapDataset`] reads a record file
//! ([`write_records`]) in place, [`mnist`] reads the IDX files, and [`CharText`] cuts a text
//! into next-character windows. A [`DataLoader`] turns one into [`Batch`]es of device
//! tensors: per epoch it orders the samples (shuffled by a seed, so an epoch can be
//! replayed), and worker threads collate and upload the next batches while the training
//! thread runs the current one ([`LoaderOptions`]).

mod dataset;
mod loader;
pub mod mnist;
mod records;
mod text;

pub use dataset::{Dataset, InMemory};
pub use loader::{Batch, DataLoader, LoaderOptions};
pub use records::{MmapDataset, write_records};
pub use text::CharText;
