//! Data: datasets, a prefetching loader that overlaps host work and uploads with compute,
//! memory-mapped record files, MNIST's IDX files, and character-level text.

mod dataset;
mod loader;
pub mod mnist;
mod records;
mod text;

pub use dataset::{Dataset, InMemory};
pub use loader::{Batch, DataLoader, LoaderOptions};
pub use records::{MmapDataset, write_records};
pub use text::CharText;
