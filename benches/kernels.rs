//! `cargo bench --bench kernels`: GFLOP/s of matmul, conv2d and attention, GB/s of softmax and
//! elementwise ops, at sizes small enough for lavapipe. (Criterion's throughput unit is
//! "elements"; here one element is one floating-point operation or one byte, as named.)
//! For large sizes and a comparison with PyTorch on a GPU, see examples/bench.rs.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::ops::Conv2dOpts;
use wgrad::{DType, Device, Tensor};

fn run(dev: &Device, f: impl Fn() -> wgrad::Result<Tensor>) {
    let t = f().expect("kernel");
    dev.sync().expect("sync");
    drop(t);
}

fn kernels(c: &mut Criterion) {
    let dev = Device::new().expect("device");
    let mut g = c.benchmark_group("kernels");
    g.sample_size(10);
    for dt in [DType::F32, DType::F16] {
        let n = 256;
        let a = Tensor::randn(&dev, &[n, n], 0.0, 1.0, dt).unwrap();
        let b = Tensor::randn(&dev, &[n, n], 0.0, 1.0, dt).unwrap();
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_function(
            BenchmarkId::new(format!("matmul {dt} (FLOP)"), format!("{n}^3")),
            |bn| bn.iter(|| run(&dev, || a.matmul(&b))),
        );

        let x = Tensor::randn(&dev, &[8, 16, 28, 28], 0.0, 1.0, dt).unwrap();
        let w = Tensor::randn(&dev, &[16, 16, 3, 3], 0.0, 1.0, dt).unwrap();
        g.throughput(Throughput::Elements(2 * (8 * 16 * 28 * 28 * 16 * 9) as u64));
        let opts = Conv2dOpts {
            padding: (1, 1),
            ..Default::default()
        };
        g.bench_function(
            BenchmarkId::new(format!("conv2d {dt} (FLOP)"), "8x16x28x28, 3x3"),
            |bn| bn.iter(|| run(&dev, || x.conv2d(&w, None, opts))),
        );

        let (bh, s, d) = (4, 128, 64);
        let q = Tensor::randn(&dev, &[bh, s, d], 0.0, 1.0, dt).unwrap();
        g.throughput(Throughput::Elements(4 * (bh * s * s * d) as u64));
        g.bench_function(
            BenchmarkId::new(format!("attention {dt} (FLOP)"), format!("{bh}x{s}x{d}")),
            |bn| bn.iter(|| run(&dev, || Tensor::attention(&q, &q, &q, false, None))),
        );

        let rows = Tensor::randn(&dev, &[256, 1024], 0.0, 1.0, dt).unwrap();
        g.throughput(Throughput::Bytes(2 * rows.nbytes()));
        g.bench_function(
            BenchmarkId::new(format!("softmax {dt} (bytes)"), "256x1024"),
            |bn| bn.iter(|| run(&dev, || rows.softmax())),
        );

        let e = Tensor::randn(&dev, &[1 << 20], 0.0, 1.0, dt).unwrap();
        g.throughput(Throughput::Bytes(3 * e.nbytes()));
        g.bench_function(
            BenchmarkId::new(format!("add {dt} (bytes)"), "2^20"),
            |bn| bn.iter(|| run(&dev, || e.add(&e))),
        );
    }
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
