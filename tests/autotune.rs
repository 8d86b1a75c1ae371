//! The kernel tuner: products measured once, the choice cached on disk, read back by the next
//! device, results still right. One test in its own binary: it sets process-wide
//! environment variables (`WGRAD_AUTOTUNE=all` also measures on lavapipe and small shapes).

mod common;

use common::Rng;
use wgrad::kernels::autotune::BUDGET;
use wgrad::kernels::autotune_stats;
use wgrad::{Device, DeviceOptions, Tensor};

fn product(dev: &Device, rng: &mut Rng, (m, n, k): (usize, usize, usize)) {
    let a: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.uniform()).collect();
    let ta = Tensor::from_slice(dev, &a, &[m, k]).unwrap();
    let tb = Tensor::from_slice(dev, &b, &[k, n]).unwrap();
    let got = ta.matmul(&tb).unwrap().to_vec::<f32>().unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            let g = got[i * n + j] as f64;
            assert!(
                (g - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{m}x{n}x{k} at ({i}, {j}): {g} against {want}"
            );
        }
    }
}

fn device() -> Device {
    Device::with_options(DeviceOptions::from_env().expect("WGRAD_* variables"))
        .expect("a wgpu adapter")
}

#[test]
fn choices_are_measured_once_and_cached_on_disk() {
    let dir = std::env::temp_dir().join(format!("wgrad-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this binary's only test sets them before any device exists.
    unsafe {
        std::env::set_var("WGRAD_CACHE_DIR", &dir);
        std::env::set_var("WGRAD_AUTOTUNE", "all");
        std::env::set_var("WGRAD_POISON", "1");
    }
    // Runs of 4 everywhere (three variants on lavapipe), and odd sizes (two).
    let shapes = [(64, 64, 64), (67, 35, 129)];
    let mut rng = Rng::new(11);

    let dev = device();
    for &s in &shapes {
        product(&dev, &mut rng, s);
        product(&dev, &mut rng, s);
    }
    // 64 x 64 x 64 has two variants everywhere (f32 `reg` and 64 x 64 tiles); the odd shape
    // has two on CPU adapters (the CPU kernel and the tiles) and one on GPUs.
    let first = autotune_stats(&dev).unwrap();
    assert!((1..=2).contains(&first.measured), "{first:?}");
    assert_eq!(
        first.hits, first.measured,
        "the second product of each shape: {first:?}"
    );
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one cache file for the adapter");
    let text = std::fs::read_to_string(files[0].path()).unwrap();
    assert!(text.contains("64x64x64"), "{text}");
    let lines = text.lines().filter(|l| !l.starts_with('#')).count() as u64;
    assert_eq!(lines, first.measured, "{text}");

    // A new device reads the file and measures nothing, unless the first device ran out of
    // its budget (a slow machine compiling the variants): then the shapes it left to the
    // rules are measured now, and nothing else.
    let dev2 = device();
    for &s in &shapes {
        product(&dev2, &mut rng, s);
    }
    let second = autotune_stats(&dev2).unwrap();
    let left = if first.spent >= BUDGET / 2 {
        shapes.len() as u64 - first.measured
    } else {
        0
    };
    assert_eq!(
        (second.loaded, second.hits),
        (first.measured, first.measured),
        "{first:?} then {second:?}"
    );
    assert!(second.measured <= left, "{first:?} then {second:?}");
    eprintln!(
        "autotune: first device spent {:?} measuring, the second {:?} choosing",
        first.spent, second.spent
    );

    // Unset, the default: off. The size rules, no measuring, no file read.
    unsafe { std::env::remove_var("WGRAD_AUTOTUNE") };
    let dev3 = device();
    for &s in &shapes {
        product(&dev3, &mut rng, s);
    }
    let third = autotune_stats(&dev3).unwrap();
    assert_eq!(
        (third.loaded, third.hits, third.measured),
        (0, 0, 0),
        "{third:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
