//! Writes MNIST IDX files as a wgrad record file (fixed-size records read through a memory
//! map by `MmapDataset`).
//!
//! ```text
//! cargo run --release --example make_records -- [--data DIR] [--prefix t10k] [--out mnist.rec]
//! ```
//! Defaults: the test set shipped in data/mnist, written to mnist-t10k.rec.

use std::path::PathBuf;
use wgrad::Result;
use wgrad::data::{Dataset, MmapDataset, mnist, write_records};

fn main() -> Result<()> {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let mut prefix = "t10k".to_string();
    let mut out: Option<PathBuf> = None;
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{f} needs a value"));
        match f.as_str() {
            "--data" => dir = PathBuf::from(v),
            "--prefix" => prefix = v,
            "--out" => out = Some(PathBuf::from(v)),
            other => panic!("unknown flag {other}"),
        }
    }
    let out = out.unwrap_or_else(|| PathBuf::from(format!("mnist-{prefix}.rec")));
    let find = |stem: &str| {
        [dir.join(format!("{stem}.gz")), dir.join(stem)]
            .into_iter()
            .find(|p| p.exists())
    };
    let images = find(&format!("{prefix}-images-idx3-ubyte"))
        .unwrap_or_else(|| panic!("no {prefix} images in {}", dir.display()));
    let labels = find(&format!("{prefix}-labels-idx1-ubyte"))
        .unwrap_or_else(|| panic!("no {prefix} labels in {}", dir.display()));
    let (pixels, n, rows, cols) = mnist::read_images(&images)?;
    let labels: Vec<u32> = mnist::read_labels(&labels)?
        .into_iter()
        .map(u32::from)
        .collect();
    write_records(&out, rows * cols, &pixels, &labels)?;
    // Read it back through the memory map as a check.
    let ds = MmapDataset::open(&out, &[1, rows, cols])?;
    let (mut x, mut y) = (vec![0f32; rows * cols], [0u32]);
    ds.get(n - 1, &mut x, &mut y)?;
    println!(
        "{n} records of {rows}x{cols} -> {} ({} bytes); last label {}",
        out.display(),
        std::fs::metadata(&out)?.len(),
        y[0]
    );
    Ok(())
}
