//! The data loader, record files, MNIST reading and text windows.

mod common;

use common::device;
use std::collections::HashSet;
use wgrad::Error;
use wgrad::data::{
    CharText, DataLoader, Dataset, InMemory, LoaderOptions, MmapDataset, write_records,
};

fn numbers(n: usize) -> InMemory<f32> {
    // Sample i has features [i, -i] and label i, so a batch says which samples it holds.
    let x: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
    InMemory::new(x, (0..n as u32).collect(), &[2]).unwrap()
}

fn opts(batch: usize, drop_last: bool, workers: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        shuffle: true,
        seed: 42,
        drop_last,
        workers,
        prefetch: 2,
    }
}

#[test]
fn shuffle_is_deterministic_and_epochs_differ() {
    let dev = device();
    let a = DataLoader::new(&dev, numbers(100), opts(7, false, 0)).unwrap();
    let b = DataLoader::new(&dev, numbers(100), opts(7, false, 0)).unwrap();
    assert_eq!(a.order(3), b.order(3), "same seed and epoch, same order");
    assert_ne!(a.order(0), a.order(1), "epochs reshuffle");
    let c = DataLoader::new(
        &dev,
        numbers(100),
        LoaderOptions {
            seed: 43,
            ..opts(7, false, 0)
        },
    )
    .unwrap();
    assert_ne!(a.order(0), c.order(0), "another seed, another order");
}

#[test]
fn every_sample_once_per_epoch_in_the_planned_order() {
    let dev = device();
    for workers in [0, 1, 3] {
        let loader = DataLoader::new(&dev, numbers(103), opts(10, false, workers)).unwrap();
        let order = loader.order(5);
        let mut seen = Vec::new();
        for b in loader.epoch(5) {
            let b = b.unwrap();
            let x = b.x.to_vec::<f32>().unwrap();
            let y = b.y.to_vec::<u32>().unwrap();
            assert_eq!(b.x.shape()[1..], [2]);
            for (k, &label) in y.iter().enumerate() {
                assert_eq!(x[2 * k], label as f32, "features travel with their label");
                assert_eq!(x[2 * k + 1], -(label as f32));
            }
            seen.extend(y.iter().map(|&v| v as usize));
        }
        assert_eq!(
            seen, order,
            "workers={workers}: batches arrive in plan order"
        );
        assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 103);
    }
}

#[test]
fn last_partial_batch_follows_drop_last() {
    let dev = device();
    let keep = DataLoader::new(&dev, numbers(25), opts(10, false, 2)).unwrap();
    let sizes: Vec<usize> = keep.epoch(0).map(|b| b.unwrap().indices.len()).collect();
    assert_eq!(sizes, vec![10, 10, 5]);
    assert_eq!(keep.batches_per_epoch(), 3);
    let dropping = DataLoader::new(&dev, numbers(25), opts(10, true, 2)).unwrap();
    let sizes: Vec<usize> = dropping
        .epoch(0)
        .map(|b| b.unwrap().indices.len())
        .collect();
    assert_eq!(sizes, vec![10, 10]);
    assert_eq!(dropping.batches_per_epoch(), 2);
    assert!(DataLoader::new(&dev, numbers(5), opts(0, false, 0)).is_err());
    // An epoch dropped half-way stops its workers (no hang).
    let mut e = keep.epoch(1);
    let _ = e.next();
    drop(e);
}

#[test]
fn mmap_records_read_back_exactly() {
    let dev = device();
    let dir = std::env::temp_dir().join(format!("wgrad-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.bin");
    let n = 300; // more than a batch
    let feats = 12;
    let data: Vec<u8> = (0..n * feats).map(|i| (i * 7 % 256) as u8).collect();
    let labels: Vec<u32> = (0..n as u32).map(|i| i * 3).collect();
    write_records(&path, feats, &data, &labels).unwrap();
    let ds = MmapDataset::open(&path, &[3, 4]).unwrap();
    assert_eq!(ds.len(), n);
    let loader = DataLoader::new(
        &dev,
        ds,
        LoaderOptions {
            batch_size: 64,
            shuffle: false,
            ..opts(64, false, 2)
        },
    )
    .unwrap();
    let mut at = 0;
    for b in loader.epoch(0) {
        let b = b.unwrap();
        let x = b.x.to_vec::<f32>().unwrap();
        let y = b.y.to_vec::<u32>().unwrap();
        for (k, &l) in y.iter().enumerate() {
            assert_eq!(l, labels[at + k]);
            for j in 0..feats {
                assert_eq!(x[k * feats + j], data[(at + k) * feats + j] as f32 / 255.0);
            }
        }
        at += y.len();
    }
    assert_eq!(at, n);

    // Corrupt files are errors naming the file, not panics.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let e = MmapDataset::open(&cut, &[3, 4])
        .err()
        .expect("truncated file");
    assert!(
        matches!(e, Error::Format { .. })
            && e.to_string().contains("cut.bin")
            && e.to_string().contains("whole number"),
        "{e}"
    );
    let mut wrong = bytes.clone();
    wrong[16] = wrong[16].wrapping_add(1); // record count
    let bad = dir.join("count.bin");
    std::fs::write(&bad, &wrong).unwrap();
    assert!(
        MmapDataset::open(&bad, &[3, 4])
            .err()
            .expect("bad count")
            .to_string()
            .contains("header says")
    );
    let mut magic = bytes.clone();
    magic[0] = b'X';
    std::fs::write(&bad, &magic).unwrap();
    assert!(
        MmapDataset::open(&bad, &[3, 4])
            .err()
            .expect("bad magic")
            .to_string()
            .contains("magic")
    );
    assert!(
        MmapDataset::open(&path, &[5]).is_err(),
        "shape that does not match the feature count"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mnist_idx_files() {
    let root = common::repo_root().join("data/mnist");
    let ds = wgrad::data::mnist::load(&root, "t10k").unwrap();
    assert_eq!(ds.len(), 10_000);
    assert_eq!(ds.x_shape(), vec![1, 28, 28]);
    let mut x = vec![0f32; 784];
    let mut y = [0u32];
    let first: Vec<u32> = (0..10)
        .map(|i| {
            ds.get(i, &mut x, &mut y).unwrap();
            y[0]
        })
        .collect();
    assert_eq!(
        first,
        vec![7, 2, 1, 0, 4, 1, 4, 9, 5, 9],
        "the published first labels"
    );
    assert!(x.iter().all(|&p| (0.0..=1.0).contains(&p)));
    let dir = std::env::temp_dir().join(format!("wgrad-idx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("bad-images-idx3-ubyte"),
        [0u8, 0, 8, 3, 0, 0, 0, 1],
    )
    .unwrap();
    std::fs::write(
        dir.join("bad-labels-idx1-ubyte"),
        [0u8, 0, 8, 1, 0, 0, 0, 1, 5],
    )
    .unwrap();
    assert!(matches!(
        wgrad::data::mnist::load(&dir, "bad"),
        Err(Error::Format { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn char_text_windows() {
    let text = "hello world, hello wgrad";
    let ds = CharText::from_text(text, 5, 1).unwrap();
    assert_eq!(ds.vocab_size(), text.chars().collect::<HashSet<_>>().len());
    assert_eq!(ds.decode(&ds.encode("hello")), "hello");
    let (mut x, mut y) = ([0u32; 5], [0u32; 5]);
    for i in 0..ds.len() {
        ds.get(i, &mut x, &mut y).unwrap();
        let (xs, ys) = (ds.decode(&x), ds.decode(&y));
        assert!(text.contains(&xs) && text.contains(&ys), "{xs:?} {ys:?}");
        assert_eq!(&xs[1..], &ys[..4], "labels are the next characters");
    }
    let shakespeare = common::repo_root().join("data/tinyshakespeare/input.txt");
    let big = CharText::from_file(shakespeare, 64, 0).unwrap();
    assert_eq!(big.vocab_size(), 65);
    assert!(CharText::from_text("ab", 5, 0).is_err());
}

/// The profiler on MNIST training (the CNN of the examples, shipped data): every dispatch is
/// timed, per-kernel and per-scope sums agree with the total, and the Chrome trace parses as
/// trace-event JSON with the kernels, the scopes (balanced) and the memory counters on one
/// clock.
#[test]
fn profiler_trace_of_mnist_training_is_valid_trace_event_json() {
    #[path = "../examples/common/mnist_cnn.rs"]
    mod mnist_cnn;
    use wgrad::nn::Module;
    use wgrad::optim::{Adam, Optimizer};
    let dev = device();
    let root = common::repo_root().join("data/mnist");
    let train = wgrad::data::mnist::load(&root, "t10k")
        .unwrap()
        .subset(0..64)
        .unwrap();
    let net = mnist_cnn::cnn(&dev, wgrad::DType::F32).unwrap();
    let mut opt = Adam::new(net.params(), 1e-3).unwrap();
    let loader = DataLoader::new(&dev, train, opts(16, true, 0)).unwrap();
    dev.set_memory_trace(true);
    dev.clear_memory_trace();
    dev.start_profiling().unwrap();
    let mut steps = 0;
    for b in loader.epoch(0) {
        let b = b.unwrap();
        dev.begin_scope("forward");
        let loss = net.forward(&b.x).unwrap().cross_entropy(&b.y).unwrap();
        dev.end_scope();
        dev.begin_scope("backward");
        loss.backward().unwrap();
        dev.end_scope();
        dev.begin_scope("optimizer");
        opt.step().unwrap();
        opt.zero_grad();
        dev.end_scope();
        steps += 1;
    }
    let profile = dev.stop_profiling().unwrap();
    assert_eq!(steps, 4);
    assert!(
        profile.events.len() > 4 * 10,
        "{} dispatches",
        profile.events.len()
    );
    let total = profile.total().as_secs_f64();
    let by_kernel: f64 = profile
        .by_kernel()
        .iter()
        .map(|s| s.total.as_secs_f64())
        .sum();
    let by_scope = profile.by_scope();
    assert!((by_kernel - total).abs() <= 1e-9 + 1e-9 * total);
    let scopes: HashSet<&str> = by_scope.iter().map(|s| s.name.as_str()).collect();
    for s in ["forward", "backward", "optimizer"] {
        assert!(scopes.contains(s), "scope {s} missing: {scopes:?}");
    }
    assert!(
        profile
            .by_kernel()
            .iter()
            .any(|s| s.name.starts_with("Conv/"))
    );

    let json: serde_json::Value =
        serde_json::from_str(&profile.chrome_trace(&dev.memory_events())).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("a traceEvents array");
    let (mut kernels, mut begins, mut ends, mut counters) = (0, 0, 0, 0);
    let mut last_ts = f64::MIN;
    for e in events {
        let ph = e["ph"].as_str().expect("every event has a phase");
        let ts = e["ts"].as_f64().expect("every event has a time");
        assert!(ts >= 0.0, "{e}");
        match ph {
            "X" => {
                kernels += 1;
                assert!(e["name"].as_str().is_some_and(|n| n.contains('/')), "{e}");
                assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
                // Dispatches come in submission order.
                assert!(ts >= last_ts - 1.0, "{e} before {last_ts}");
                last_ts = ts;
            }
            "B" => begins += 1,
            "E" => ends += 1,
            "C" => {
                counters += 1;
                assert!(
                    e["args"]["allocated"].as_u64().is_some()
                        && e["args"]["reserved"].as_u64().is_some(),
                    "{e}"
                );
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert_eq!(kernels, profile.events.len());
    assert_eq!(
        (begins, ends),
        (12, 12),
        "three scopes a step, each opened and closed"
    );
    assert!(counters > 0, "memory counters on the timeline");
}
