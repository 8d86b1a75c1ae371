//! Transfer bandwidth and allocation latency.
//!
//! `cargo bench --bench memory` reports upload and download throughput (GB/s, host <-> device
//! through the staging buffers, including the wait for the device) and the latency of an
//! allocation served from the cache.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use wgrad::{DType, Device, Tensor};

fn transfers(c: &mut Criterion) {
    let dev = Device::new().expect("device");
    let mut g = c.benchmark_group("transfer");
    g.sample_size(20);
    for mib in [1usize, 16, 64] {
        let n = mib << 18; // f32 elements
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        g.throughput(Throughput::Bytes((n * 4) as u64));
        g.bench_with_input(
            BenchmarkId::new("upload", format!("{mib}MiB")),
            &n,
            |b, &n| {
                b.iter(|| {
                    let t = Tensor::from_slice(&dev, &data, &[n]).unwrap();
                    dev.sync().unwrap();
                    black_box(t);
                })
            },
        );
        let t = Tensor::from_slice(&dev, &data, &[n]).unwrap();
        g.bench_with_input(
            BenchmarkId::new("download", format!("{mib}MiB")),
            &n,
            |b, _| b.iter(|| black_box(t.to_vec::<f32>().unwrap())),
        );
    }
    g.finish();
}

fn allocation(c: &mut Criterion) {
    let dev = Device::new().expect("device");
    // Warm the cache so every request below is a hit.
    drop(Tensor::zeros(&dev, &[1 << 16], DType::F32).unwrap());
    let mut g = c.benchmark_group("alloc");
    g.bench_function("cached 256KiB", |b| {
        b.iter(|| {
            let block = wgrad::testing::bench_alloc(&dev, 256 << 10).unwrap();
            black_box(block);
        })
    });
    g.finish();
}

criterion_group!(benches, transfers, allocation);
criterion_main!(benches);
