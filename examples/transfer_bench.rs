//! Host transfer speed of a device: upload, read-back, and a move between two devices, the
//! paths multi-device training takes (wgpu has no peer-to-peer copies).
//!
//! ```text
//! cargo run --release --example transfer_bench -- [--devices 0,1] [--mib 64] [--reps 10]
//! ```

use std::time::Instant;
use wgrad::parallel::open_devices;
use wgrad::{Result, Tensor};

/// Upload, read-back and device-to-device move rates.
#[derive(clap::Parser, Debug)]
#[command(name = "transfer_bench")]
struct Args {
    /// Two adapters (indices in `Device::all()`'s order); one index measures one device.
    #[arg(long, default_value = "0")]
    devices: String,
    /// Mebibytes per transfer.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Transfers timed (after one warm-up).
    #[arg(long, default_value_t = 10)]
    reps: usize,
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let devs = open_devices(&a.devices)?;
    let n = a.mib << 18;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let gb = (n * 4) as f64 / 1e9;
    let rate = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?;
        let t = Instant::now();
        for _ in 0..a.reps {
            f()?;
        }
        Ok(gb * a.reps as f64 / t.elapsed().as_secs_f64())
    };
    let d0 = &devs[0];
    let up = rate(&mut || {
        let t = Tensor::from_slice(d0, &host, &[n])?;
        d0.sync()?;
        drop(t);
        Ok(())
    })?;
    let x = Tensor::from_slice(d0, &host, &[n])?;
    let down = rate(&mut || x.to_vec::<f32>().map(|_| ()))?;
    println!(
        "{}: upload {up:.2} GB/s, read-back {down:.2} GB/s ({} MiB)",
        d0.info().name,
        a.mib
    );
    // Where a read-back's time goes: the device's copy and the map alone, then the copy out
    // of the mapping into memory the host keeps, then fresh memory on the host alone.
    let mapped = rate(&mut || x.to_vec_async::<f32>()?.wait_with(|_| ()))?;
    let mut keep = vec![0f32; n];
    let kept = rate(&mut || {
        x.to_vec_async::<f32>()?
            .wait_with(|s| keep.copy_from_slice(s))
    })?;
    let fresh_host = rate(&mut || {
        let v = host.clone();
        std::hint::black_box(&v);
        Ok(())
    })?;
    let kept_host = rate(&mut || {
        keep.copy_from_slice(&host);
        std::hint::black_box(&keep);
        Ok(())
    })?;
    println!(
        "read-back parts: copy and map {mapped:.2} GB/s, into kept memory {kept:.2} GB/s; \
         host copies: into fresh memory {fresh_host:.2} GB/s, into kept memory {kept_host:.2} GB/s"
    );
    if let Some(d1) = devs.get(1) {
        let mv = rate(&mut || {
            let y = x.to_device(d1)?;
            d1.sync()?;
            drop(y);
            Ok(())
        })?;
        println!(
            "move {} -> {}: {mv:.2} GB/s",
            d0.info().name,
            d1.info().name
        );
    }
    Ok(())
}
