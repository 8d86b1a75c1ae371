//! The core count measured by timing products (`kernels::cores`): the same as the driver's
//! report where the driver gives one (`wide`'s tiles, or `reg`'s where `wide` does not run,
//! as on Metal and DX12: `WGRAD_DISABLE=spirv,elements,coop` stands in for them), and kept on
//! disk for the next device.
//! One test in its own binary: it sets process-wide environment variables
//! (`WGRAD_CORES=measure`, the cache directory).

use wgrad::{DType, Device, DeviceOptions, Tensor};

fn device() -> Device {
    Device::with_options(DeviceOptions::from_env().expect("WGRAD_* variables"))
        .expect("a wgpu adapter")
}

/// One f16 product, checked, so that a device plans (and so settles its core count).
fn product(dev: &Device) {
    let (m, n, k) = (256, 128, 64);
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 7) as f32 - 3.0) / 4.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i % 5) as f32 - 2.0) / 4.0).collect();
    let ta = Tensor::from_slice(dev, &a, &[m, k])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let tb = Tensor::from_slice(dev, &b, &[k, n])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let got = ta
        .matmul(&tb)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (idx, g) in got.iter().enumerate() {
        let (i, j) = (idx / n, idx % n);
        let want: f64 = (0..k)
            .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
            .sum();
        // Exact: every operand and partial sum is a multiple of 1/16 well inside f16.
        assert_eq!(*g as f64, want, "({i}, {j})");
    }
}

#[test]
fn cores_measured_by_timing_match_the_report_and_are_kept() {
    let dev = device();
    let reported = dev.hardware().cores;
    let started = std::time::Instant::now();
    let measured = wgrad::kernels::cores::measure(&dev).unwrap();
    let took = started.elapsed();
    let gpu = !dev.info().is_cpu();
    println!(
        "{}: reported {reported:?}, measured {measured:?} in {:.0} ms",
        dev.info().name,
        took.as_secs_f64() * 1e3
    );
    if gpu {
        // The curve the count is read from, around the reported count when there is one.
        let c = reported.unwrap_or(64);
        let counts = [
            1,
            c / 2,
            c,
            c + 1,
            c + 2,
            2 * c,
            2 * c + 1,
            3 * c,
            3 * c + 1,
        ];
        let (tiling, times) = wgrad::kernels::cores::wave_times(&dev, &counts)
            .unwrap()
            .unwrap();
        let shown: Vec<String> = counts
            .iter()
            .zip(times)
            .map(|(c, t)| format!("{c}: {:.3} ms", t * 1e3))
            .collect();
        println!("{tiling:?} batch times: {}", shown.join(", "));
    }
    if !gpu {
        // Nothing to time on a CPU adapter (lavapipe).
        assert_eq!(measured, None);
    } else if let Some(r) = reported {
        assert_eq!(measured, Some(r), "the measured count against the driver's");
    }
    drop(dev);

    // A device told to measure: no count before its first product, the measured one after
    // it, written to the cache; a second device reads it back.
    let dir = std::env::temp_dir().join(format!("wgrad-cores-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this binary's only test sets these before any other thread reads them.
    unsafe {
        std::env::set_var("WGRAD_CORES", "measure");
        std::env::set_var("WGRAD_CACHE_DIR", &dir);
    }
    let dev = device();
    assert_eq!(dev.hardware().cores, None);
    product(&dev);
    let kept: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    if !gpu {
        assert_eq!(dev.hardware().cores, None);
        assert!(kept.is_empty(), "nothing measured, nothing kept: {kept:?}");
        return;
    }
    assert_eq!(dev.hardware().cores, measured);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let text = std::fs::read_to_string(&kept[0]).unwrap();
    let count = text.lines().find(|l| !l.starts_with('#')).unwrap();
    match measured {
        Some(n) => assert_eq!(count, n.to_string()),
        None => assert_eq!(count, "none"),
    }
    drop(dev);

    // The file stands for the next device: a count written there is the one it takes.
    std::fs::write(&kept[0], "# edited\n7\n").unwrap();
    let dev = device();
    product(&dev);
    assert_eq!(dev.hardware().cores, Some(7));
    drop(dev);

    // A damaged file is not taken: the count is measured again.
    std::fs::write(&kept[0], "# edited\n7x\n").unwrap();
    let dev = device();
    product(&dev);
    assert_eq!(dev.hardware().cores, measured);
    let _ = std::fs::remove_dir_all(&dir);
}
