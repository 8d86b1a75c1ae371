//! The memory pool and staging: reuse safety, steady state, budget, round trips.

mod common;

use common::{Rng, device, device_with};
use half::f16;
use wgrad::{DType, Error, Tensor};

/// A block freed while queued commands still read it is handed to a new tensor and
/// overwritten by a host upload: the queued reads must still see the old contents.
#[test]
fn write_after_free() {
    let dev = device_with(|o| o.no_cache = false);
    let n = 1000;
    for flush_between in [false, true] {
        let a = Tensor::from_slice(&dev, &vec![1.5f32; n], &[n]).unwrap();
        let b = a.mul_scalar(2.0).unwrap(); // queued, reads a
        let loc = a.storage_location();
        drop(a);
        if flush_between {
            dev.flush().unwrap();
        }
        let c = Tensor::from_slice(&dev, &vec![7.0f32; n], &[n]).unwrap();
        assert_eq!(
            c.storage_location(),
            loc,
            "the freed block is reused at once"
        );
        let d = c.add_scalar(1.0).unwrap();
        assert!(
            b.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0),
            "a queued read saw the later upload"
        );
        assert!(d.to_vec::<f32>().unwrap().iter().all(|&v| v == 8.0));
    }
}

/// The same hazard through a kernel: a freed input block reused as a later kernel's output.
#[test]
fn kernel_write_after_free() {
    let dev = device();
    let mut rng = Rng::new(1);
    let x: Vec<f32> = rng.vec(4096);
    let a = Tensor::from_slice(&dev, &x, &[4096]).unwrap();
    let b = a.exp().unwrap();
    drop(a);
    let z = Tensor::zeros(&dev, &[4096], DType::F32).unwrap(); // likely a's block
    let got = b.to_vec::<f32>().unwrap();
    for (g, v) in got.iter().zip(&x) {
        assert!((g - v.exp()).abs() <= 1e-6 + 1e-5 * v.exp().abs());
    }
    assert!(z.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
}

/// After a few iterations of a repeated workload, no buffer of any kind is created.
#[test]
fn steady_state_allocates_nothing() {
    let dev = device_with(|o| o.no_cache = false);
    let mut rng = Rng::new(2);
    let data = rng.vec(3 * 1000);
    let mut after_warmup = 0;
    let mut binds_warm = dev.dispatch_stats();
    for it in 0..30 {
        let x = Tensor::from_slice(&dev, &data, &[3, 1000]).unwrap();
        let w = dev.randn(&[3, 1000], DType::F32).unwrap();
        let y = x.mul(&w).unwrap().relu().unwrap().sum(1, false).unwrap();
        let h = y.to_dtype(DType::F16).unwrap();
        let _ = h.to_vec::<f16>().unwrap();
        let _ = y.mean_all().unwrap().to_scalar().unwrap();
        if it == 4 {
            after_warmup = dev.memory_stats().total_device_allocs();
            binds_warm = dev.dispatch_stats();
        }
    }
    let s = dev.memory_stats();
    assert_eq!(
        s.total_device_allocs(),
        after_warmup,
        "buffers created in the steady loop:\n{}",
        dev.memory_report()
    );
    assert!(s.hit_rate() > 0.9, "{}", dev.memory_report());
    // The same launches on the same blocks: every bind group is reused.
    let b = dev.dispatch_stats();
    assert_eq!(
        b.bind_groups_created, binds_warm.bind_groups_created,
        "{b:?}"
    );
    assert_eq!(
        b.bind_groups_reused - binds_warm.bind_groups_reused,
        b.dispatches - binds_warm.dispatches,
        "{b:?}"
    );
    // Pages going back to the driver take their bind groups with them.
    assert!(b.bind_groups_kept > 0);
    dev.sync().unwrap();
    dev.empty_cache();
    let after = dev.dispatch_stats();
    assert_eq!(
        after.bind_groups_kept,
        0,
        "{after:?}\n{}",
        dev.memory_report()
    );
}

/// Past the budget an allocation fails with a clear error; live tensors survive, and after
/// dropping some the same allocation succeeds.
#[test]
fn budget_oom_then_recovery() {
    let dev = device_with(|o| o.memory_limit = Some(wgrad::MemoryLimit::Bytes(24 << 20)));
    let n = (3 << 20) / 4; // 3 MiB of f32
    let mut live = Vec::new();
    let err = loop {
        let v = live.len() as f32;
        match Tensor::full(&dev, &[n], v, DType::F32) {
            Ok(t) => live.push(t),
            Err(e) => break e,
        }
        assert!(live.len() < 100, "the budget was never enforced");
    };
    match &err {
        Error::OutOfMemory {
            requested,
            limit,
            allocated,
            reserved,
            ..
        } => {
            assert_eq!(*requested, (n * 4) as u64);
            assert_eq!(*limit, 24 << 20);
            assert!(*allocated <= *limit && *reserved <= *limit);
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("out of memory") && msg.contains("24.00 MiB"),
        "{msg}"
    );
    // Nothing already allocated was lost.
    for (i, t) in live.iter().enumerate() {
        let v = t.to_vec::<f32>().unwrap();
        assert!(v.iter().all(|&x| x == i as f32), "tensor {i} was damaged");
    }
    let s = dev.memory_stats();
    assert_eq!(s.ooms, 1);
    assert!(s.reserved <= 24 << 20);
    live.truncate(live.len() / 2);
    let t = Tensor::full(&dev, &[n], 9.0, DType::F32).expect("allocation after dropping tensors");
    assert_eq!(t.to_vec::<f32>().unwrap()[n - 1], 9.0);
}

/// An allocation past the adapter's binding limit names the limit.
#[test]
fn past_binding_limit_is_an_error() {
    let dev = device();
    let too_big = (dev.caps().max_binding / 4 + 1024) as usize;
    let e = Tensor::zeros(&dev, &[too_big], DType::F32).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert!(
        e.to_string().contains("max_storage_buffer_binding_size"),
        "{e}"
    );
}

#[test]
fn round_trips() {
    let dev = device();
    let mut rng = Rng::new(3);
    for n in [0usize, 1, 3, 1000, (1 << 20) + 3] {
        let x = rng.vec(n);
        let t = Tensor::from_slice(&dev, &x, &[n]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), x, "f32 round trip of {n}");
        let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let t = Tensor::from_slice(&dev, &h, &[n]).unwrap();
        let back = t.to_vec::<f16>().unwrap();
        assert!(
            back.iter().zip(&h).all(|(a, b)| a.to_bits() == b.to_bits()),
            "f16 round trip of {n}"
        );
        // Async read-back of the same tensor.
        let fut = t.to_vec_async::<f16>().unwrap();
        let back = futures::executor::block_on(fut).unwrap();
        assert_eq!(back.len(), n);
        // Read in place from the mapping: the same elements, twice (the staging buffer went
        // back to the pool unmapped after the first).
        let t = Tensor::from_slice(&dev, &x, &[n]).unwrap();
        let mut kept = vec![f32::NAN; n];
        let len = t
            .to_vec_async::<f32>()
            .unwrap()
            .wait_with(|s| {
                kept.copy_from_slice(s);
                s.len()
            })
            .unwrap();
        assert_eq!((len, &kept), (n, &x), "wait_with of {n}");
        let sum: f64 = t
            .to_vec_async::<f32>()
            .unwrap()
            .wait_with(|s| s.iter().map(|&v| v as f64).sum())
            .unwrap();
        assert_eq!(sum, x.iter().map(|&v| v as f64).sum::<f64>());
    }
}

/// `sync` waits for work submitted before it too: a read-back submits its copy at once, so a
/// `sync` right after has nothing of its own to submit, and must still leave the read-back
/// complete (its future ready at the first poll, with no thread of its own to wait).
#[test]
fn sync_waits_for_earlier_submissions() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let dev = device();
    let x: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let t = Tensor::from_slice(&dev, &x, &[x.len()]).unwrap();
    let y = t.mul_scalar(3.0).unwrap();
    for round in 0..3 {
        let mut fut = std::pin::pin!(y.to_vec_async::<f32>().unwrap());
        dev.flush().unwrap();
        dev.sync().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => assert_eq!(v.unwrap()[4095], 3.0 * 4095.0),
            Poll::Pending => panic!("round {round}: the read-back was not complete after sync"),
        }
    }
}

/// Waiting on a read-back first hands the device what was recorded after it: a training
/// step's update waits for the last step's decision with the step's forward and backward
/// recorded, and kept in the stream they left the device idle through the wait and the
/// recording after it.
#[test]
fn a_read_back_wait_hands_over_the_work_recorded_after_it() {
    for (off, dev) in caching_devices_with_and_without_submit_thread() {
        let t = Tensor::from_slice(&dev, &[1.5f32; 64], &[64]).unwrap();
        let pending = t.to_vec_async::<f32>().unwrap();
        // Recorded, not yet submitted (far from a full batch).
        let y = t.mul_scalar(2.0).unwrap();
        let before = dev.dispatch_stats().submits;
        assert!(pending.wait().unwrap().iter().all(|&v| v == 1.5));
        assert_eq!(
            dev.dispatch_stats().submits,
            before + 1,
            "submit thread {}: the wait did not hand over the multiply",
            !off
        );
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
    }
}

/// A caching device with its submit thread, then one without (`off` = the thread disabled).
fn caching_devices_with_and_without_submit_thread() -> impl Iterator<Item = (bool, wgrad::Device)> {
    [false, true].into_iter().map(|off| {
        let dev = device_with(|o| {
            o.no_cache = false;
            o.disable_submit_thread = off;
        });
        (off, dev)
    })
}

/// Read-backs are queued without waiting for the submit thread (it maps their buffers once
/// their copies are submitted): each one still sees the value at its place in the stream,
/// with later writes to the same tensor queued behind it, awaited in any order, on the thread
/// and without it.
#[test]
fn readbacks_queued_mid_stream_keep_their_place() {
    for (off, dev) in caching_devices_with_and_without_submit_thread() {
        let n = 777;
        let mut t = Tensor::from_slice(&dev, &vec![0.0f32; n], &[n]).unwrap();
        let mut pending = Vec::new();
        for i in 1..=600 {
            t = t.add_scalar(1.0).unwrap();
            if i % 50 == 0 {
                pending.push((i, t.to_vec_async::<f32>().unwrap()));
            }
        }
        // Awaited last first: the earliest copies must not have been overwritten meanwhile.
        while let Some((i, r)) = pending.pop() {
            let got = r.wait().unwrap();
            assert!(
                got.iter().all(|&v| v == i as f32),
                "submit thread {}: read-back after step {i} saw {:?}",
                !off,
                &got[..3]
            );
        }
    }
}

/// Batches handed to the submit thread reach the queue in the order they were recorded: a
/// chain of launches long enough for several batches, each freeing the block the next one
/// reuses, uploads between them, and an upload large enough to double-buffer its staging,
/// give the same results with the thread and without it.
#[test]
fn submit_thread_keeps_order() {
    for (off, dev) in caching_devices_with_and_without_submit_thread() {
        assert_eq!(dev.dispatch_stats().submit_thread, !off);
        let n = 1000;
        let steps = 3 * 256 + 17;
        let mut t = Tensor::from_slice(&dev, &vec![0.0f32; n], &[n]).unwrap();
        let mut uploads = Vec::new();
        for i in 0..steps {
            t = t.add_scalar(1.0).unwrap();
            if i % 97 == 0 {
                let u = Tensor::full(&dev, &[n], i as f32, DType::F32).unwrap();
                uploads.push((i, u.add(&t).unwrap()));
            }
        }
        // More than the 64 MiB of staging a batch may hold.
        let big: Vec<f32> = (0..(17usize << 20)).map(|i| (i % 1009) as f32).collect();
        let b = Tensor::from_slice(&dev, &big, &[big.len()]).unwrap();
        let b2 = b.add_scalar(0.5).unwrap();
        assert!(
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|&v| v == steps as f32)
        );
        for (i, u) in &uploads {
            let want = (*i + *i + 1) as f32;
            assert!(
                u.to_vec::<f32>().unwrap().iter().all(|&v| v == want),
                "submit thread {}: the sum at step {i}",
                !off
            );
        }
        let got = b2.to_vec::<f32>().unwrap();
        assert!(got.iter().zip(&big).all(|(g, x)| *g == x + 0.5));
        let s = dev.dispatch_stats();
        assert!(s.submits >= 3, "{} submits", s.submits);
        assert!(!s.encode_time.is_zero());
    }
}

#[test]
fn read_with_wrong_dtype_is_an_error() {
    let dev = device();
    let t = Tensor::zeros(&dev, &[4], DType::F16).unwrap();
    assert!(matches!(t.to_vec::<f32>(), Err(Error::DType { .. })));
    assert!(matches!(
        Tensor::from_slice(&dev, &[1.0f32, 2.0], &[3]),
        Err(Error::Shape { .. })
    ));
}

/// Device and Tensor cross threads: a worker uploads while this thread computes.
#[test]
fn upload_from_another_thread() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<wgrad::Device>();
    assert_send_sync::<Tensor>();
    let dev = device();
    let d2 = dev.clone();
    let worker = std::thread::spawn(move || {
        (0..8)
            .map(|i| Tensor::full(&d2, &[256], i as f32, DType::F32).unwrap())
            .collect::<Vec<_>>()
    });
    let mine = dev.randn(&[256], DType::F32).unwrap().exp().unwrap();
    let theirs = worker.join().unwrap();
    for (i, t) in theirs.iter().enumerate() {
        assert!(
            t.add(&mine)
                .unwrap()
                .sub(&mine)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|&v| (v - i as f32).abs() < 1e-5)
        );
    }
}

#[test]
fn stats_trace_and_empty_cache() {
    let dev = device_with(|o| {
        o.trace = true;
        o.no_cache = false;
    });
    dev.begin_scope("work");
    let a = Tensor::zeros(&dev, &[1000], DType::F32).unwrap();
    let b = Tensor::zeros(&dev, &[5 << 20], DType::F16).unwrap(); // large pool
    drop(a);
    let peak = dev.end_scope();
    assert!(peak >= 4000 + (10 << 20));
    let s = dev.memory_stats();
    assert_eq!(s.live_blocks, 1);
    assert_eq!(s.allocated, 10 << 20);
    assert!(s.active >= s.allocated && s.reserved >= s.active);
    assert_eq!((s.small_pages, s.large_pages), (1, 1));
    drop(b);
    dev.empty_cache();
    let s = dev.memory_stats();
    assert_eq!(s.reserved, 0);
    assert_eq!(s.device_frees, 2);
    let json = dev.memory_trace_json();
    for kind in [
        "alloc",
        "free",
        "page_alloc",
        "page_free",
        "scope_begin",
        "scope_end",
    ] {
        assert!(
            json.contains(&format!("\"kind\":\"{kind}\"")),
            "{kind} missing from {json}"
        );
    }
    assert!(json.contains("\"scope\":\"work\""));
    let report = dev.memory_report().to_string();
    assert!(
        report.contains("reserved") && report.contains("hits"),
        "{report}"
    );
}

/// A release threshold keeps at most that many bytes of empty pages: the largest go back to
/// the driver as they empty, the cache still serves what it kept, and tensors alive on the
/// device are untouched; lowering it later trims at once, `None` keeps everything.
#[test]
fn release_threshold_bounds_the_idle_cache() {
    let dev = device_with(|o| {
        o.no_cache = false;
        o.release_threshold = Some(wgrad::MemoryLimit::Bytes(20 << 20));
    });
    assert_eq!(dev.memory_stats().release_threshold, 20 << 20);
    let keep = Tensor::full(&dev, &[1000], 7.0, DType::F32).unwrap();
    // Three large tensors of 12, 16 and 24 MiB, each in a page of its own size.
    let big: Vec<Tensor> = [3usize << 20, 4 << 20, 6 << 20]
        .iter()
        .map(|&n| Tensor::full(&dev, &[n], 1.0, DType::F32).unwrap())
        .collect();
    let before = dev.memory_stats();
    assert!(before.reserved >= 52 << 20, "{before:?}");
    drop(big);
    // 52 MiB emptied, 20 may stay: the 24 and 16 MiB pages go, the 12 MiB page stays.
    let s = dev.memory_stats();
    assert_eq!(s.free_pages, 12 << 20, "{s:?}");
    assert_eq!(s.device_frees, 2, "{s:?}");
    assert_eq!(s.reserved, before.reserved - (40 << 20), "{s:?}");
    // What was kept is reused: no new page for a tensor that fits in it.
    let allocs = s.device_allocs;
    let again = Tensor::full(&dev, &[3 << 20], 2.0, DType::F32).unwrap();
    assert_eq!(dev.memory_stats().device_allocs, allocs);
    drop(again);
    // Lowering the threshold to zero trims now; the live tensor is intact.
    dev.set_release_threshold(Some(0));
    let s = dev.memory_stats();
    assert_eq!(s.free_pages, 0, "{s:?}");
    assert_eq!(keep.to_vec::<f32>().unwrap(), vec![7.0; 1000]);
    // Without a threshold, emptied pages stay.
    dev.set_release_threshold(None);
    let t = Tensor::full(&dev, &[4 << 20], 1.0, DType::F32).unwrap();
    drop(t);
    assert!(dev.memory_stats().free_pages >= 16 << 20);
}

/// WGRAD_NO_CACHE semantics: no reuse, every page returned on free.
#[test]
fn no_cache_mode() {
    let dev = device_with(|o| o.no_cache = true);
    let a = Tensor::full(&dev, &[100], 1.0, DType::F32).unwrap();
    let loc = a.storage_location();
    let b = a.add_scalar(1.0).unwrap();
    drop(a);
    let c = Tensor::full(&dev, &[100], 5.0, DType::F32).unwrap();
    assert_ne!(c.storage_location().0, loc.0);
    assert_eq!(b.to_vec::<f32>().unwrap()[0], 2.0);
    let s = dev.memory_stats();
    assert_eq!(s.cache_hits, 0);
    assert!(s.device_frees >= 1);
}

#[test]
fn poison_fills_new_tensors_with_nan() {
    let dev = device_with(|o| o.poison = true);
    for dt in [DType::F32, DType::F16] {
        let t = Tensor::zeros(&dev, &[5], dt).unwrap();
        drop(t);
        // A fresh tensor whose kernel writes nothing: exp of an empty... use a layout op on a
        // 0-element source to get an untouched block through the public API.
        let raw = wgrad::testing::poison_probe(&dev, &[7], dt).unwrap();
        assert!(
            raw.to_f32_vec().unwrap().iter().all(|v| v.is_nan()),
            "{dt}: {:?}",
            raw.to_f32_vec().unwrap()
        );
    }
}

/// Devices opened, used and dropped from several threads at once, with read-backs (blocking
/// and async) in flight: creation and teardown are serialised, and every read-back completes
/// (the memory binary once hung here with 8 test threads).
#[test]
fn devices_opened_used_and_dropped_from_many_threads() {
    let threads: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..4 {
                    let dev = device();
                    let n = 1000 + 17 * t + round;
                    let x = Tensor::full(&dev, &[n], t as f32, DType::F32).unwrap();
                    let y = x.add_scalar(1.0).unwrap().mul_scalar(2.0).unwrap();
                    let fut = y.to_vec_async::<f32>().unwrap();
                    let z = y.sum_all().unwrap().to_scalar().unwrap();
                    let v = futures::executor::block_on(fut).unwrap();
                    assert!(v.iter().all(|&e| e == 2.0 * (t as f32 + 1.0)));
                    assert_eq!(z, 2.0 * (t as f32 + 1.0) * n as f32);
                    // Drop with work still queued on every other round.
                    if round % 2 == 1 {
                        let _pending = y.exp().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A product padded for the fast kernels (ops::matmul `Padding`) needs memory for its copies:
/// where the budget leaves room for the product but not for them, it runs unpadded on the
/// general kernels and gives the same answer, and nothing live is lost. The room left is
/// reckoned for a CPU adapter's unpadded product; on a GPU the same product also splits K
/// (occupancy), whose partial products need room of their own, so the test runs on CPU
/// adapters (CI's lavapipe) only.
#[test]
fn padding_short_of_memory_runs_unpadded() {
    use wgrad::kernels::matmul::{Config, forced};
    use wgrad::ops::matmul::pad_everywhere;
    let dev = device_with(|o| o.memory_limit = Some(wgrad::MemoryLimit::Bytes(24 << 20)));
    if !dev.info().is_cpu() {
        return;
    }
    let mut rng = Rng::new(40);
    // A [1024 x 1023] (4 MiB) x B [1023 x 256] (1 MiB) into [1024 x 256] (1 MiB); padded,
    // A alone would take 4 MiB more.
    let (m, k, n) = (1024, 1023, 256);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let ta = common::tensor(&dev, &a, &[m, k], DType::F32);
    let tb = common::tensor(&dev, &b, &[k, n], DType::F32);
    // Fill the budget: blocks of 4 MiB, then 1 MiB, then 256 KiB while they fit.
    let mut fill: Vec<Tensor> = Vec::new();
    for bytes in [4 << 20, 1 << 20, 256 << 10] {
        while let Ok(t) = Tensor::full(&dev, &[bytes / 4], 1.0, DType::F32) {
            fill.push(t);
            assert!(fill.len() < 200, "the budget was never enforced");
        }
    }
    // Room for the result (one 1 MiB block and what the 256 KiB ones held, under 2 MiB), not
    // for a 4 MiB padded copy of A.
    let one = fill
        .iter()
        .position(|t| t.numel() == (1 << 20) / 4)
        .expect("a 1 MiB block in the budget");
    fill.remove(one);
    fill.retain(|t| t.numel() != (256 << 10) / 4);
    let want = wgrad::reference::matmul(
        &common::rounded(&a, DType::F32),
        &common::rounded(&b, DType::F32),
        None,
        m,
        n,
        k,
        false,
        false,
        None,
    );
    let ooms = dev.memory_stats().ooms;
    let got = pad_everywhere(|| forced(Config::Reg, || ta.matmul(&tb)))
        .unwrap()
        .expect("the product runs unpadded when its copies do not fit");
    assert!(
        dev.memory_stats().ooms > ooms,
        "the padded copies fitted: {:?}",
        dev.memory_stats()
    );
    let got = got.to_f32_vec().unwrap();
    // The general kernels' f32 sums over K = 1023 (tolerance as kernels.rs `matmul_case`).
    let (atol, rtol) = common::tol(DType::F32);
    let t = (atol * (k as f64).sqrt(), rtol);
    common::assert_close_tol(&got, &want, t, "unpadded product under the budget");
    for t in &fill {
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&x| x == 1.0));
    }
}
