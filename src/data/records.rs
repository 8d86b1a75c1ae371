//! Fixed-size records in one binary file, read through a memory map (for datasets larger
//! than RAM: pages come from the file on demand, nothing is copied up front).
//!
//! Layout (little-endian):
//! ```text
//! 0   8 bytes  magic "WGRDREC1"
//! 8   u32      feature type: 0 = u8 (scaled to [0, 1] when read), 1 = f32
//! 12  u32      features per record
//! 16  u64      record count
//! 24  8 bytes  zero
//! 32  records: features, then a u32 label
//! ```
//! A file whose size is not the header plus a whole number of records, or whose header does
//! not match, is rejected with an error naming the file.

use super::dataset::Dataset;
use crate::error::{Error, Result};
use memmap2::Mmap;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 8] = b"WGRDREC1";
const HEADER: usize = 32;

/// A record file opened for reading.
pub struct MmapDataset {
    map: Mmap,
    f32_features: bool,
    features: usize,
    records: usize,
    shape: Vec<usize>,
}

impl MmapDataset {
    /// Opens `path`; `shape` is how one record's features are viewed (its product must be the
    /// file's feature count).
    pub fn open(path: impl AsRef<Path>, shape: &[usize]) -> Result<MmapDataset> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = std::fs::File::open(path)?;
        // SAFETY: read-only map; the file must not be truncated while the dataset is alive
        // (as with any memory-mapped file).
        let map = unsafe { Mmap::map(&file)? };
        if map.len() < HEADER || &map[..8] != MAGIC {
            return Err(Error::format(name, "not a wgrad record file (bad magic)"));
        }
        let word = |at: usize| u32::from_le_bytes([map[at], map[at + 1], map[at + 2], map[at + 3]]);
        let kind = word(8);
        let features = word(12) as usize;
        let records = u64::from_le_bytes(map[16..24].try_into().unwrap_or([0; 8])) as usize;
        if kind > 1 {
            return Err(Error::format(name, format!("unknown feature type {kind}")));
        }
        let f32_features = kind == 1;
        let rec = features * if f32_features { 4 } else { 1 } + 4;
        let body = map.len() - HEADER;
        if !body.is_multiple_of(rec) {
            return Err(Error::format(
                name,
                format!("{body} bytes of records is not a whole number of {rec}-byte records"),
            ));
        }
        if body / rec != records {
            return Err(Error::format(
                name,
                format!(
                    "header says {records} records, the file holds {}",
                    body / rec
                ),
            ));
        }
        if shape.iter().product::<usize>() != features {
            return Err(Error::format(
                name,
                format!("records have {features} features, not {shape:?}"),
            ));
        }
        Ok(MmapDataset {
            map,
            f32_features,
            features,
            records,
            shape: shape.to_vec(),
        })
    }

    fn record_len(&self) -> usize {
        self.features * if self.f32_features { 4 } else { 1 } + 4
    }
}

impl Dataset for MmapDataset {
    type X = f32;
    fn len(&self) -> usize {
        self.records
    }
    fn x_shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    fn y_shape(&self) -> Vec<usize> {
        Vec::new()
    }
    fn get(&self, index: usize, x: &mut [f32], y: &mut [u32]) -> Result<()> {
        if index >= self.records {
            return Err(Error::invalid(
                "MmapDataset",
                format!("record {index} out of {}", self.records),
            ));
        }
        let at = HEADER + index * self.record_len();
        let feat = &self.map[at..at + self.record_len() - 4];
        if self.f32_features {
            for (o, c) in x.iter_mut().zip(feat.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        } else {
            for (o, &b) in x.iter_mut().zip(feat) {
                *o = b as f32 / 255.0;
            }
        }
        let l = &self.map[at + self.record_len() - 4..at + self.record_len()];
        y[0] = u32::from_le_bytes([l[0], l[1], l[2], l[3]]);
        Ok(())
    }
}

/// Writes u8 feature records (`features` per record) with their labels.
pub fn write_records(
    path: impl AsRef<Path>,
    features: usize,
    data: &[u8],
    labels: &[u32],
) -> Result<()> {
    if data.len() != features * labels.len() {
        return Err(Error::shape(
            "write_records",
            format!(
                "{} bytes for {} records of {features}",
                data.len(),
                labels.len()
            ),
        ));
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(MAGIC)?;
    f.write_all(&0u32.to_le_bytes())?;
    f.write_all(&(features as u32).to_le_bytes())?;
    f.write_all(&(labels.len() as u64).to_le_bytes())?;
    f.write_all(&[0u8; 8])?;
    for (rec, &l) in data.chunks_exact(features.max(1)).zip(labels) {
        f.write_all(rec)?;
        f.write_all(&l.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}
