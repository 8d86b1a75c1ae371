//! Every file reader against damaged files: random truncations and random byte edits of a
//! good file. A reader returns an error, or (where the format has no integrity check of its
//! own, as a safetensors file's data bytes) the damaged values; it never panics, hangs,
//! loses the device, or allocates more host memory than the file could justify. Where a load
//! fails, nothing it was loading into has changed. The GGUF reader has its own such tests in
//! tests/gguf.rs.

mod common;

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use wgrad::data::{CharText, Dataset, MmapDataset, mnist, write_records};
use wgrad::nn::{Linear, Module};
use wgrad::optim::{Adam, GradScaler, Optimizer};
use wgrad::train::{Progress, load_checkpoint, save_checkpoint};
use wgrad::{DType, Device, Error, Tensor};

/// The largest single host allocation since the last `reset`, across all threads.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

/// Runs `f` and returns its result with the largest host allocation it made.
fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.store(0, Ordering::Relaxed);
    let out = f();
    (out, LARGEST.load(Ordering::Relaxed))
}

/// Host memory a reader may use for one file besides the file's own size: the device's
/// command buffers and the parsed header's maps. A claim read from a damaged header (a count
/// of 2^40) must never turn into an allocation.
const SLACK: usize = 1 << 20;

fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(common::device)
}

/// The checkpoint tests' own device, used only under `trained_once`'s lock, so that no other
/// test draws from its random state while a test compares it.
fn checkpoint_dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(common::device)
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("wgrad-damaged-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A damaged copy of `good`: cut at `cut` (a fraction of its length) when `truncate`, else
/// with each `(position fraction, xor)` edit applied (a zero xor becomes 0xff).
fn damage(good: &[u8], truncate: bool, cut: f64, edits: &[(f64, u8)]) -> Vec<u8> {
    if truncate {
        return good[..((good.len() as f64 * cut) as usize).min(good.len() - 1)].to_vec();
    }
    let mut b = good.to_vec();
    for &(at, x) in edits {
        let i = ((b.len() as f64 * at) as usize).min(b.len() - 1);
        b[i] ^= if x == 0 { 0xff } else { x };
    }
    b
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, bytes).expect("write the damaged file");
    p
}

fn values(named: &[(String, Tensor)]) -> Vec<Vec<f32>> {
    named
        .iter()
        .map(|(_, t)| t.to_f32_vec().expect("read back"))
        .collect()
}

/// A small model, its optimizer after one step (so it has state), a scaler, and its
/// checkpoint's bytes.
struct Trained {
    model: Linear,
    opt: Adam,
    scaler: GradScaler,
    checkpoint: Vec<u8>,
}

fn trained() -> Trained {
    let dev = checkpoint_dev();
    dev.manual_seed(11);
    let model = Linear::new(dev, 6, 5, true, DType::F16).expect("linear");
    let mut opt = Adam::new(model.params(), 1e-2).expect("adam");
    let mut scaler = GradScaler::new();
    let x = dev.randn(&[4, 6], DType::F16).expect("x");
    let loss = model
        .forward(&x)
        .and_then(|y| y.to_dtype(DType::F32))
        .and_then(|y| y.sum_all())
        .expect("loss");
    scaler
        .scale_loss(&loss)
        .and_then(|l| l.backward())
        .expect("backward");
    scaler.step(&mut opt, Some(1.0)).expect("step");
    opt.zero_grad();
    let path = dir().join("good-checkpoint.safetensors");
    let progress = Progress {
        step: 1,
        data_position: 1234,
        notes: Default::default(),
    };
    save_checkpoint(&path, &model.params(), &opt, Some(&scaler), &progress).expect("save");
    let checkpoint = std::fs::read(&path).expect("read");
    Trained {
        model,
        opt,
        scaler,
        checkpoint,
    }
}

fn trained_once() -> &'static std::sync::Mutex<Trained> {
    static T: OnceLock<std::sync::Mutex<Trained>> = OnceLock::new();
    T.get_or_init(|| std::sync::Mutex::new(trained()))
}

/// The trained run's checkpoint bytes, undamaged.
fn good_checkpoint() -> Vec<u8> {
    trained_once()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .checkpoint
        .clone()
}

/// Everything a checkpoint load could change.
fn run_state(t: &Trained) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, u64, f32, u64) {
    (
        values(&t.model.params()),
        values(&t.opt.state()),
        t.opt.steps(),
        t.scaler.scale(),
        checkpoint_dev().seed_state(),
    )
}

/// Loads `bytes` as a checkpoint into the trained run: it must be refused with a format
/// error naming the file, leaving every part of the run as it was.
fn refused_checkpoint(bytes: &[u8], name: &str) -> String {
    let mut guard = trained_once().lock().unwrap_or_else(|e| e.into_inner());
    let t = &mut *guard;
    let before = run_state(t);
    let p = write(name, bytes);
    let (res, largest) =
        largest_during(|| load_checkpoint(&p, &t.model.params(), &mut t.opt, Some(&mut t.scaler)));
    let e = res.expect_err("a damaged checkpoint must be refused");
    let msg = e.to_string();
    assert!(matches!(e, Error::Format { .. }), "{msg}");
    assert!(
        msg.contains(&p.display().to_string()),
        "names the file: {msg}"
    );
    assert!(
        largest <= bytes.len() + SLACK,
        "{largest} bytes allocated for a {}-byte file",
        bytes.len()
    );
    assert_eq!(
        run_state(t),
        before,
        "a refused load changed the run ({msg})"
    );
    msg
}

#[test]
fn a_checkpoint_loads_back_intact() {
    let mut guard = trained_once().lock().unwrap_or_else(|e| e.into_inner());
    let t = &mut *guard;
    let p = write("intact.safetensors", &t.checkpoint);
    let before = run_state(t);
    let progress =
        load_checkpoint(&p, &t.model.params(), &mut t.opt, Some(&mut t.scaler)).expect("load");
    assert_eq!((progress.step, progress.data_position), (1, 1234));
    assert_eq!(run_state(t), before);
}

/// The header's metadata is covered: a one-digit edit of any number in it is refused.
#[test]
fn edited_metadata_is_refused() {
    let good = good_checkpoint();
    let header_len = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let header = String::from_utf8(good[8..8 + header_len].to_vec()).expect("utf-8 header");
    for key in [
        "step",
        "optimizer_steps",
        "seed_state",
        "data_position",
        "scaler",
    ] {
        let needle = format!("\"{key}\":\"");
        let at = 8 + header.find(&needle).expect(key) + needle.len();
        let mut edited = good.clone();
        // The value's first digit, changed to another digit.
        edited[at] = if edited[at] == b'1' { b'2' } else { b'1' };
        let msg = refused_checkpoint(&edited, &format!("edited-{key}.safetensors"));
        assert!(msg.contains("checksum"), "{key}: {msg}");
    }
}

/// Two sign flips in one f16 tensor (bytes 7 and 15 of its data) are refused: the checksum
/// is a real hash, in which such changes do not cancel.
#[test]
fn two_sign_flips_are_refused() {
    let good = good_checkpoint();
    let header_len = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let st = safetensors::SafeTensors::deserialize(&good).expect("parses");
    let w = st.tensor("model.weight").expect("model.weight");
    let base = w.data().as_ptr() as usize - good.as_ptr() as usize;
    assert!(base >= 8 + header_len);
    let mut edited = good.clone();
    edited[base + 7] ^= 0x80;
    edited[base + 15] ^= 0x80;
    let msg = refused_checkpoint(&edited, "sign-flips.safetensors");
    assert!(msg.contains("checksum"), "{msg}");
}

/// A checkpoint of the earlier format, whose checksum covered only the tensors, is refused
/// with a message that says why.
#[test]
fn an_old_format_checkpoint_is_refused_with_the_reason() {
    let good = good_checkpoint();
    let mut old = good.clone();
    let at = good
        .windows(13)
        .position(|w| w == b"wgrad-train-2")
        .expect("the format in the header");
    old[at + 12] = b'1';
    let msg = refused_checkpoint(&old, "old-format.safetensors");
    assert!(msg.contains("cannot be verified"), "{msg}");
}

/// A header that claims a huge size fails fast, naming what it claims.
#[test]
fn a_huge_header_length_fails_fast() {
    let good = good_checkpoint();
    let mut b = good.clone();
    b[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let msg = refused_checkpoint(&b, "huge-header.safetensors");
    assert!(msg.to_lowercase().contains("header"), "{msg}");
    let p = write("huge-header-weights.safetensors", &b);
    let (res, largest) = largest_during(|| wgrad::nn::load(dev(), &p));
    let msg = res.expect_err("refused").to_string();
    assert!(msg.to_lowercase().contains("header"), "{msg}");
    assert!(largest <= b.len() + SLACK);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any truncation or edit of a checkpoint is refused, and nothing changes.
    #[test]
    fn damaged_checkpoints(truncate in any::<bool>(), cut in 0.0f64..1.0,
                           edits in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..4)) {
        let good = good_checkpoint();
        let bad = damage(&good, truncate, cut, &edits);
        refused_checkpoint(&bad, "prop-checkpoint.safetensors");
    }

    /// Damaged safetensors weights: an error, or the damaged values (the format checks no
    /// data bytes); `load_into` either writes every parameter or none.
    #[test]
    fn damaged_safetensors(truncate in any::<bool>(), cut in 0.0f64..1.0,
                           edits in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..4)) {
        let dev = dev();
        let model = Linear::new(dev, 7, 3, true, DType::F32).expect("linear");
        let p = dir().join("weights.safetensors");
        wgrad::nn::save(&p, &model.params()).expect("save");
        let good = std::fs::read(&p).expect("read");
        let bad = damage(&good, truncate, cut, &edits);
        let p = write("prop-weights.safetensors", &bad);

        let (res, largest) = largest_during(|| wgrad::nn::load(dev, &p));
        prop_assert!(largest <= bad.len() + SLACK, "load allocated {}", largest);
        if let Ok(named) = res {
            let bytes: usize = named.iter().map(|(_, t)| t.numel() * t.dtype().size()).sum();
            prop_assert!(bytes <= bad.len());
        }
        let (res, _) = largest_during(|| wgrad::nn::load_as(dev, &p, DType::F16));
        drop(res);

        let target = Linear::new(dev, 7, 3, true, DType::F16).expect("linear");
        let before = values(&target.params());
        for converting in [false, true] {
            let res = if converting {
                wgrad::nn::load_into_converting(&target, &p)
            } else {
                wgrad::nn::load_into(&target, &p)
            };
            if let Err(e) = res {
                prop_assert!(matches!(e, Error::Format { .. } | Error::Io(_)), "{}", e);
                prop_assert_eq!(&values(&target.params()), &before);
            }
        }
    }

    /// Damaged IDX files, raw and gzip'd: an error, never a panic.
    #[test]
    fn damaged_idx(truncate in any::<bool>(), cut in 0.0f64..1.0, gz in any::<bool>(),
                   edits in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..4)) {
        let (images, labels) = idx_files(gz);
        for (good, is_images) in [(images, true), (labels, false)] {
            let bad = damage(&good, truncate, cut, &edits);
            let p = write(if is_images { "prop.idx3" } else { "prop.idx1" }, &bad);
            let (res, largest) = largest_during(|| {
                if is_images {
                    mnist::read_images(&p).map(|(px, n, r, c)| {
                        assert_eq!(px.len(), n * r * c);
                    })
                } else {
                    mnist::read_labels(&p).map(drop)
                }
            });
            // A gzip'd file inflates to its IDX size: at most the good file's.
            prop_assert!(largest <= 4 * idx_raw_len(is_images) + SLACK, "{}", largest);
            if let Err(e) = res {
                prop_assert!(matches!(e, Error::Format { .. } | Error::Io(_)), "{}", e);
            }
        }
    }

    /// Damaged record files: an error at open, or records that read.
    #[test]
    fn damaged_records(truncate in any::<bool>(), cut in 0.0f64..1.0,
                       edits in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..4)) {
        let p = dir().join("good.rec");
        let data: Vec<u8> = (0..5 * 12).map(|i| (i * 7) as u8).collect();
        write_records(&p, 12, &data, &[0, 1, 2, 3, 4]).expect("write");
        let good = std::fs::read(&p).expect("read");
        let bad = damage(&good, truncate, cut, &edits);
        let p = write("prop.rec", &bad);
        let (res, largest) = largest_during(|| {
            let ds = MmapDataset::open(&p, &[3, 4])?;
            let (mut x, mut y) = (vec![0f32; 12], vec![0u32; 1]);
            for i in 0..ds.len() {
                ds.get(i, &mut x, &mut y)?;
            }
            Ok::<_, Error>(ds.len())
        });
        prop_assert!(largest <= bad.len() + SLACK);
        match res {
            Ok(n) => prop_assert!(n <= 5),
            Err(e) => prop_assert!(matches!(e, Error::Format { .. } | Error::Io(_)), "{}", e),
        }
    }

    /// Damaged text: an error (not UTF-8, too short) or a dataset of its characters.
    #[test]
    fn damaged_text(truncate in any::<bool>(), cut in 0.0f64..1.0,
                    edits in prop::collection::vec((0.0f64..1.0, any::<u8>()), 1..4)) {
        let good = "First Citizen:\nBefore we proceed any further, hear me speak. \u{e9}\u{4e2d}\n"
            .repeat(4)
            .into_bytes();
        let bad = damage(&good, truncate, cut, &edits);
        let p = write("prop.txt", &bad);
        match CharText::from_file(&p, 8, 1) {
            Ok(t) => prop_assert!(t.vocab_size() <= bad.len()),
            Err(e) => prop_assert!(matches!(e, Error::Format { .. } | Error::Io(_)), "{}", e),
        }
    }
}

fn idx_raw_len(images: bool) -> usize {
    if images { 16 + 6 * 5 * 4 } else { 8 + 6 }
}

/// Six 5 x 4 images and their labels as IDX files, gzip'd when `gz`.
fn idx_files(gz: bool) -> (Vec<u8>, Vec<u8>) {
    let mut images = Vec::new();
    for w in [2051u32, 6, 5, 4] {
        images.extend_from_slice(&w.to_be_bytes());
    }
    images.extend((0..6 * 5 * 4).map(|i| (i * 3) as u8));
    let mut labels = Vec::new();
    for w in [2049u32, 6] {
        labels.extend_from_slice(&w.to_be_bytes());
    }
    labels.extend([0u8, 1, 2, 3, 4, 5]);
    if !gz {
        return (images, labels);
    }
    let zip = |b: &[u8]| {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).expect("gzip");
        e.finish().expect("gzip")
    };
    (zip(&images), zip(&labels))
}
