//! MNIST in its IDX format (optionally gzip'd), as published by LeCun, Cortes and Burges.

use super::dataset::InMemory;
use crate::error::{Error, Result};
use std::path::Path;

/// Reads a whole file, inflating it when it starts with the gzip magic (with the `gzip`
/// feature; without it a gzip'd file is an error that says so). At most `limit` bytes are
/// inflated: an IDX file's size follows from its header, so a stream that inflates past any
/// valid size is refused without holding more than that in memory.
fn read_maybe_gz(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let raw = std::fs::read(path)?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    #[cfg(feature = "gzip")]
    {
        use std::io::Read;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(limit.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| Error::format(path.display().to_string(), format!("gzip: {e}")))?;
        Ok(out)
    }
    #[cfg(not(feature = "gzip"))]
    {
        let _ = limit;
        Err(Error::format(
            path.display().to_string(),
            "gzip'd, and wgrad was built without its `gzip` feature: inflate it first (gunzip)",
        ))
    }
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The largest IDX file read: 2^32 - 1 items of at most 2^16 bytes each would not fit in
/// memory anyway, and a header that claims more is damaged.
const IDX_LIMIT: u64 = 1 << 40;

/// Images from an IDX3 file: (pixels, count, rows, cols).
pub fn read_images(path: &Path) -> Result<(Vec<u8>, usize, usize, usize)> {
    let b = read_maybe_gz(path, IDX_LIMIT)?;
    let bad = |why: String| Error::format(path.display().to_string(), why);
    if b.len() < 16 || be_u32(&b, 0) != 2051 {
        return Err(bad("not an IDX image file (magic 2051)".into()));
    }
    let (n, r, c) = (be_u32(&b, 4), be_u32(&b, 8), be_u32(&b, 12));
    let want = (n as u64)
        .checked_mul(r as u64)
        .and_then(|p| p.checked_mul(c as u64))
        .and_then(|p| p.checked_add(16));
    if want != Some(b.len() as u64) {
        return Err(bad(format!(
            "header claims {n} images of {r}x{c}, the file holds {} bytes",
            b.len()
        )));
    }
    Ok((b[16..].to_vec(), n as usize, r as usize, c as usize))
}

/// Labels from an IDX1 file.
pub fn read_labels(path: &Path) -> Result<Vec<u8>> {
    let b = read_maybe_gz(path, IDX_LIMIT)?;
    let bad = |why: String| Error::format(path.display().to_string(), why);
    if b.len() < 8 || be_u32(&b, 0) != 2049 {
        return Err(bad("not an IDX label file (magic 2049)".into()));
    }
    let n = be_u32(&b, 4) as usize;
    if b.len() != 8 + n {
        return Err(bad(format!(
            "header claims {n} labels, the file holds {} bytes",
            b.len()
        )));
    }
    Ok(b[8..].to_vec())
}

/// Finds `stem` or `stem.gz` in `dir`.
fn find(dir: &Path, stem: &str) -> Option<std::path::PathBuf> {
    [dir.join(format!("{stem}.gz")), dir.join(stem)]
        .into_iter()
        .find(|p| p.exists())
}

/// One split as an in-memory dataset of [1, rows, cols] f32 images scaled to [0, 1].
pub fn load(dir: &Path, prefix: &str) -> Result<InMemory<f32>> {
    let img = find(dir, &format!("{prefix}-images-idx3-ubyte")).ok_or_else(|| {
        Error::format(
            dir.display().to_string(),
            format!("no {prefix}-images-idx3-ubyte(.gz) here"),
        )
    })?;
    let lab = find(dir, &format!("{prefix}-labels-idx1-ubyte")).ok_or_else(|| {
        Error::format(
            dir.display().to_string(),
            format!("no {prefix}-labels-idx1-ubyte(.gz) here"),
        )
    })?;
    let (pixels, n, r, c) = read_images(&img)?;
    let labels = read_labels(&lab)?;
    if labels.len() != n {
        return Err(Error::format(
            lab.display().to_string(),
            format!("{} labels for {n} images", labels.len()),
        ));
    }
    let x: Vec<f32> = pixels.iter().map(|&p| p as f32 / 255.0).collect();
    InMemory::new(x, labels.into_iter().map(u32::from).collect(), &[1, r, c])
}
