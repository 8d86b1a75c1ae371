//! The public API as a user meets it: the handles a user holds get the gradients, checked
//! indices, the activation type, the re-exported `half`.

mod common;

use common::{device, device_with, tensor};
use wgrad::nn::{Linear, Module};
use wgrad::ops::MatmulOpts;
use wgrad::{Activation, DType, Error, Tensor};

/// `variable()` and `Linear::from_tensors` mark the caller's tensor itself: its own handle
/// sees `.grad()`.
#[test]
fn the_callers_handle_gets_the_gradient() {
    let dev = device();
    let w = Tensor::ones(&dev, &[2, 3], DType::F32).unwrap();
    let b = Tensor::zeros(&dev, &[2], DType::F32).unwrap();
    let lin = Linear::from_tensors(w.clone(), Some(b.clone())).unwrap();
    let x = tensor(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32);
    lin.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        w.grad()
            .expect("w's own handle has the gradient")
            .to_vec::<f32>()
            .unwrap(),
        vec![5.0, 7.0, 9.0, 5.0, 7.0, 9.0]
    );
    assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    assert!(w.is_variable() && w.requires_grad());
    // A computed tensor is not a leaf: variable() gives a new leaf, and says so.
    let y = w.mul_scalar(2.0).unwrap();
    let v = y.variable();
    assert!(v.is_variable() && !y.is_variable());
}

/// Out-of-range indices are NaN by default and a clear error on a checked device, naming the
/// op and the index; the device stays usable.
#[test]
fn checked_mode_names_bad_indices() {
    let dev = device_with(|o| o.checked = true);
    assert!(dev.is_checked());
    let table = dev.randn(&[4, 3], DType::F32).unwrap();
    let idx = Tensor::from_slice(&dev, &[0u32, 7, 1], &[3]).unwrap();
    let e = table.embedding(&idx).unwrap_err().to_string();
    assert!(
        e.contains("embedding") && e.contains("index 7") && e.contains("position 1"),
        "{e}"
    );
    let logits = dev.randn(&[2, 5], DType::F32).unwrap();
    let labels = Tensor::from_slice(&dev, &[4u32, 5], &[2]).unwrap();
    let e = logits.cross_entropy(&labels).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Invalid {
                op: "cross_entropy",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("index 5"), "{e}");
    // Valid indices pass, and the device still works.
    let ok = Tensor::from_slice(&dev, &[3u32, 0], &[2]).unwrap();
    assert_eq!(table.embedding(&ok).unwrap().shape(), &[2, 3]);
    // Unchecked: NaN, no error.
    let dev = device_with(|o| o.checked = false);
    let table = dev.randn(&[4, 3], DType::F32).unwrap();
    let idx = Tensor::from_slice(&dev, &[9u32], &[1]).unwrap();
    let y = table.embedding(&idx).unwrap().to_vec::<f32>().unwrap();
    assert!(y.iter().all(|v| v.is_nan()));
}

/// One activation type for layers and fused epilogues; `half` comes with wgrad.
#[test]
fn one_activation_type_and_half() {
    let dev = device();
    let a = tensor(&dev, &[-1.0, 2.0], &[1, 2], DType::F32);
    let w = tensor(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2], DType::F32);
    for act in Activation::ALL {
        let fused = a
            .matmul_with(
                &w,
                MatmulOpts {
                    act: Some(act),
                    ..Default::default()
                },
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let layer = act
            .forward(&a.matmul(&w).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (x, y) in fused.iter().zip(&layer) {
            assert!((x - y).abs() < 1e-6, "{act:?}: {fused:?} vs {layer:?}");
        }
    }
    let h: Vec<wgrad::half::f16> = [1.5f32, -2.0]
        .iter()
        .map(|&v| wgrad::half::f16::from_f32(v))
        .collect();
    let t = Tensor::from_slice(&dev, &h, &[2]).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_f32_vec().unwrap(), vec![1.5, -2.0]);
}

/// Every example answers `--help` with its options and exit status 0, and refuses an unknown
/// option with status 2 instead of a panic. `cargo test` builds the examples beside this
/// test's directory (target/<profile>/examples).
#[test]
fn examples_answer_help_and_refuse_unknown_options() {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .join("examples");
    // Examples with required features are built only when those features are on.
    let featured: &[&str] = if cfg!(feature = "tokenizers") {
        &["generate"]
    } else {
        &[]
    };
    for &name in [
        "bench",
        "load_rate",
        "loader_bench",
        "make_records",
        "memory_bench",
        "memory_timeline",
        "pipeline",
        "profile",
        "train_gpt",
        "train_mnist",
        "transfer_bench",
    ]
    .iter()
    .chain(featured)
    {
        let bin = dir.join(name);
        let out = std::process::Command::new(&bin)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (a full `cargo test` or `cargo build --examples` builds it)",
                    bin.display()
                )
            });
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("Usage:"),
            "{name} --help: {text}"
        );
        let bad = std::process::Command::new(&bin)
            .arg("--no-such-option")
            .output()
            .unwrap();
        assert_eq!(bad.status.code(), Some(2), "{name} with an unknown option");
    }
}
