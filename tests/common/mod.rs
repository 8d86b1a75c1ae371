//! Shared test helpers: a device, random data, the tolerance check, CPU references in f64.
#![allow(dead_code)]

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
