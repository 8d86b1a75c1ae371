//! Shared test helpers: a device, random data, the tolerance check, CPU references in f64.
#![allow(dead_code)]

pub mod ops;

use wgrad::{Device, DeviceOptions};

/// A fresh device with options from the environment (so CI can run the suite with
/// `WGRAD_DISABLE=f16,subgroups` to cover the fallback paths).
pub fn device() -> Device {
    Device::with_options(DeviceOptions::from_env().expect("WGRAD_* variables"))
        .expect("a wgpu adapter (install mesa-vulkan-drivers)")
}

/// A device with explicit options (environment feature switches still apply).
pub fn device_with(f: impl FnOnce(&mut DeviceOptions)) -> Device {
    let mut o = DeviceOptions::from_env().expect("WGRAD_* variables");
    f(&mut o);
    Device::with_options(o).expect("a wgpu adapter")
}

/// A small deterministic generator (xorshift*), so failures reproduce from the printed seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

use half::f16;
use wgrad::{DType, Tensor};

/// Tolerance constants per dtype, in one place: |gpu - ref| <= atol + rtol * |ref|.
pub fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-4),
        // f16 storage: inputs and outputs rounded to 11 bits, arithmetic in f32.
        DType::F16 => (2e-3, 4e-3),
        // bf16 storage: 8 significant bits, 8x f16's rounding error.
        DType::BF16 => (1.6e-2, 3.2e-2),
        DType::U32 => (0.0, 0.0),
    }
}

/// The values a tensor of `dtype` holds for `data` (f16 and bf16 round).
pub fn rounded(data: &[f32], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F16 => data.iter().map(|&v| f16::from_f32(v).to_f64()).collect(),
        DType::BF16 => data
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f64())
            .collect(),
        _ => data.iter().map(|&v| v as f64).collect(),
    }
}

/// A device tensor of `dtype` holding `data`.
pub fn tensor(dev: &wgrad::Device, data: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f32(dev, data, shape, dtype).unwrap()
}

/// Asserts every element is within tolerance (NaN never passes), with a message naming the
/// first bad index.
pub fn assert_close(got: &[f32], want: &[f64], dtype: DType, what: &str) {
    assert_close_tol(got, want, tol(dtype), what);
}

pub fn assert_close_tol(got: &[f32], want: &[f64], (atol, rtol): (f64, f64), what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let ok = err <= atol + rtol * w.abs()
            || (g.is_infinite() && w.is_infinite() && (g > 0.0) == (w > 0.0));
        assert!(
            ok && !g.is_nan(),
            "{what}: element {i}: got {g}, want {w} (err {err:.3e}, allowed {:.3e})",
            atol + rtol * w.abs()
        );
        if err > worst.1 {
            worst = (i, err);
        }
    }
}

/// A poisoning device (every new tensor starts as NaN) with environment options.
pub fn poisoned() -> wgrad::Device {
    device_with(|o| o.poison = true)
}

pub const SIZES: [usize; 5] = [1, 3, 17, 127, 1000];
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// How many times f16's error a dtype's storage adds (1 for f32 and f16, 8 for bf16): scales
/// tolerances written for f16.
pub fn f16_scale(dtype: DType) -> f64 {
    if dtype == DType::BF16 { 8.0 } else { 1.0 }
}

/// `op` applied elementwise to `a` (shape `sa`) and `b` (shape `sb`) broadcast to `out`,
/// in f64: the reference for broadcasting ops and their gradients.
pub fn broadcast_apply(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    out: &[usize],
    op: fn(f64, f64) -> f64,
) -> Vec<f64> {
    let n: usize = out.iter().product();
    let idx = |flat: usize, s: &[usize]| -> usize {
        let mut rem = flat;
        let mut coords = vec![0; out.len()];
        for k in (0..out.len()).rev() {
            coords[k] = rem % out[k];
            rem /= out[k];
        }
        let off = out.len() - s.len();
        let mut i = 0;
        for k in 0..s.len() {
            let c = if s[k] == 1 { 0 } else { coords[off + k] };
            i = i * s[k] + c;
        }
        i
    };
    (0..n).map(|i| op(a[idx(i, sa)], b[idx(i, sb)])).collect()
}

/// Whether `dev` runs the `wide` tensor-core product for f16 (what `forced(CoopWide)` gets).
pub fn runs_wide(dev: &wgrad::Device) -> bool {
    runs_wide_for(dev, DType::F16)
}

/// Whether `wide` runs `dtype`'s products on `dev` (bf16: where the device was opened with
/// bf16 cooperative matrices).
pub fn runs_wide_for(dev: &wgrad::Device, dtype: DType) -> bool {
    use wgrad::kernels::matmul::{Config, Operands, forced, plan};
    let square = Operands {
        a_strides: (128, 1),
        b_strides: (128, 1),
        offsets: (0, 0),
        batch_strides: (0, 0),
    };
    forced(Config::CoopWide, || {
        plan(dev, dtype, (128, 128, 128), &square)
    })
    .unwrap()
        == Config::CoopWide
}

/// Runs `f` under the profiler: its result and the names of the kernels it ran.
pub fn ran_kernels<R>(dev: &wgrad::Device, f: impl FnOnce() -> R) -> (R, Vec<String>) {
    dev.start_profiling().unwrap();
    let r = f();
    let ran = dev
        .stop_profiling()
        .unwrap()
        .by_kernel()
        .into_iter()
        .map(|s| s.name)
        .collect();
    (r, ran)
}

/// The repository's root, where `data/` and `tests/fixtures/` are: the directory this test
/// was built in, or, for a binary carried to another machine (benches/gpu_run.sh runs them
/// from `<checkout>/.gpu`), the nearest directory above the working directory that holds
/// both.
pub fn repo_root() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("tests/fixtures").is_dir() {
        return built;
    }
    let mut dir = std::env::current_dir().unwrap_or_default();
    loop {
        if dir.join("tests/fixtures").is_dir() && dir.join("data").is_dir() {
            return dir;
        }
        if !dir.pop() {
            return built;
        }
    }
}

/// A file or directory under `tests/fixtures/`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    repo_root().join("tests/fixtures").join(name)
}
