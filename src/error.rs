//! The one error type of the crate.
//!
//! Every fallible operation returns [`Result`]. Variants carry what a person needs to act on
//! the error: the op and the shapes for a shape mismatch, the numbers for an out-of-memory.

use crate::dtype::DType;

/// Result alias used throughout wgrad.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in wgrad.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit together; names the op and the shapes.
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The op that was called.
        op: &'static str,
        /// The shapes involved, in words.
        detail: String,
    },

    /// An input of the wrong dtype.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DType {
        /// The op that was called.
        op: &'static str,
        /// What the op needs.
        expected: DType,
        /// What it was given.
        got: DType,
    },

    /// The memory budget (or the device) cannot hold the allocation. Nothing already allocated
    /// was lost: drop tensors, call `empty_cache`, and try again.
    #[error(
        "out of memory: requested {} with {} allocated and {} reserved (limit {}, largest free block {})",
        fmt_bytes(*requested), fmt_bytes(*allocated), fmt_bytes(*reserved), fmt_limit(*limit), fmt_bytes(*largest_free)
    )]
    OutOfMemory {
        /// Bytes asked for (before rounding).
        requested: u64,
        /// The budget in bytes (`u64::MAX` when none is set).
        limit: u64,
        /// Bytes in live tensors.
        allocated: u64,
        /// Bytes held in device buffers by the arena.
        reserved: u64,
        /// The largest free block in the cache.
        largest_free: u64,
    },

    /// A request past an adapter limit (a binding larger than the storage-binding limit, a grid
    /// larger than the dispatch limit). Names the limit.
    #[error("{what}: {requested} exceeds the adapter limit {limit_name} = {limit}")]
    LimitExceeded {
        /// What was being done.
        what: String,
        /// The size or count that was asked for.
        requested: u64,
        /// The wgpu limit's name.
        limit_name: &'static str,
        /// The adapter's value of that limit.
        limit: u64,
    },

    /// The adapter lacks a feature the call needs.
    #[error("unsupported on this adapter: {0}")]
    Unsupported(String),

    /// No adapter matched (or none exists).
    #[error("no suitable GPU adapter: {0}")]
    NoAdapter(String),

    /// The device was lost (driver reset, removal). Tensors on it are gone.
    #[error("device lost: {0}")]
    DeviceLost(String),

    /// wgpu reported an error we did not prevent by validation (a wgrad bug if it happens).
    #[error("GPU error: {0}")]
    Gpu(String),

    /// A broken internal invariant (a launch that does not match its kernel, a gradient of the
    /// wrong shape): a wgrad bug, please report it with the message.
    #[error("internal error (a wgrad bug): {0}")]
    Internal(String),

    /// An argument outside its domain (an axis past the rank, a zero batch size...).
    #[error("{op}: {detail}")]
    Invalid {
        /// The op that was called.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },

    /// A file whose contents are not what was expected (IDX, safetensors, record files).
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },

    /// Reading or writing a file failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            detail: detail.into(),
        }
    }

    /// Shorthand for [`Error::Shape`].
    pub(crate) fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Shape {
            op,
            detail: detail.into(),
        }
    }

    /// Shorthand for [`Error::Format`].
    pub(crate) fn format(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            detail: detail.into(),
        }
    }

    /// True for [`Error::OutOfMemory`]; batch-size search uses it.
    ///
    /// ```
    /// use wgrad::{DType, Error};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// dev.set_memory_limit(Some(16 << 20)); // a 16 MiB budget
    /// let kept = dev.zeros(&[1024], DType::F32)?; // 4 KiB: fits
    /// let err = dev.zeros(&[16 << 20], DType::F32).unwrap_err(); // 64 MiB: does not
    /// assert!(err.is_oom());
    /// if let Error::OutOfMemory { requested, limit, .. } = err {
    ///     assert_eq!((requested, limit), (64 << 20, 16 << 20));
    /// }
    /// assert_eq!(kept.to_vec::<f32>()?, vec![0.0; 1024]); // nothing live was lost
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_oom(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }
}

/// Bytes in the largest binary unit that keeps the number readable ("1.50 MiB").
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn fmt_limit(l: u64) -> String {
    if l == u64::MAX {
        "none".to_string()
    } else {
        fmt_bytes(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn oom_message_names_numbers() {
        let e = Error::OutOfMemory {
            requested: 1 << 20,
            limit: 1 << 30,
            allocated: 5 << 20,
            reserved: 8 << 20,
            largest_free: 4096,
        };
        let s = e.to_string();
        assert!(
            s.contains("1.00 MiB") && s.contains("1.00 GiB") && s.contains("4.00 KiB"),
            "{s}"
        );
        assert!(e.is_oom());
    }
}
