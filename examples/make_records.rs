//! Writes MNIST IDX files as a wgrad record file (fixed-size records read through a memory
//! map by `MmapDataset`).
//!
//! ```text
//! cargo run --release --example make_records -- [--data DIR] [--prefix t10k] [--out mnist.rec]
//! ```
//! Defaults: the test set shipped in data/mnist, written to mnist-t10k.rec.

#[path = "common/repo.rs"]
mod repo;
use std::path::PathBuf;
use wgrad::Result;
use wgrad::data::{Dataset, MmapDataset, mnist, write_records};

/// Writes MNIST IDX files as a wgrad record file.
#[derive(clap::Parser, Debug)]
#[command(name = "make_records")]
struct Args {
    /// Directory of the IDX files (.gz or not) [default: data/mnist].
    #[arg(long)]
    data: Option<PathBuf>,
    /// File prefix: t10k or train.
    #[arg(long, default_value = "t10k")]
    prefix: String,
    /// The record file to write [default: mnist-PREFIX.rec].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let dir = a
        .data
        .unwrap_or_else(|| repo::repo_root().join("data/mnist"));
    let (prefix, out) = (a.prefix, a.out);
    let out = out.unwrap_or_else(|| PathBuf::from(format!("mnist-{prefix}.rec")));
    let find = |stem: &str| {
        [dir.join(format!("{stem}.gz")), dir.join(stem)]
            .into_iter()
            .find(|p| p.exists())
    };
    let missing = |what: &str| wgrad::Error::Format {
        path: dir.display().to_string(),
        detail: format!("no {prefix} {what} (.gz or not) in this directory"),
    };
    let images = find(&format!("{prefix}-images-idx3-ubyte")).ok_or_else(|| missing("images"))?;
    let labels = find(&format!("{prefix}-labels-idx1-ubyte")).ok_or_else(|| missing("labels"))?;
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
