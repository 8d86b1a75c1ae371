//! Data parallelism across processes on MPI (feature `mpi`). Run under `mpirun -np 2` (CI
//! does); without mpirun the process is a group of one and the checks still hold. Each
//! process trains on its shard of the batch; every process also trains a copy of the model on
//! the whole batch alone, the reference: the processes' mean loss must follow it, and their
//! parameters must stay bit-identical across processes.

use wgrad::nn::{Activation, Linear, Module, Sequential};
use wgrad::optim::{Optimizer, Sgd};
use wgrad::parallel::MpiGroup;
use wgrad::{DType, Device, Tensor};

fn mlp(dev: &Device) -> wgrad::Result<Sequential> {
    Ok(Sequential::new()
        .add("l1", Linear::new(dev, 6, 16, true, DType::F32)?)
        .add("act", Activation::Tanh)
        .add("l2", Linear::new(dev, 16, 3, true, DType::F32)?))
}

/// Deterministic values in [-1, 1), the same in every process.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn main() {
    let group = MpiGroup::init().expect("MPI");
    let (rank, size) = (group.rank(), group.size());
    let dev = Device::new().expect("a wgpu adapter");
    // Different initial weights per process: broadcast_params must make them equal.
    dev.manual_seed(100 + rank as u64);
    let model = mlp(&dev).expect("model");
    group.broadcast_params(&model.params()).expect("broadcast");
    assert!(
        group.params_identical(&model.params()).expect("checksum"),
        "rank {rank}: weights differ after the broadcast"
    );
    let reference = mlp(&dev).expect("model");
    for ((_, a), (_, b)) in model.params().iter().zip(reference.params()) {
        b.copy_from_slice(&a.to_vec::<f32>().expect("read"))
            .expect("copy");
    }
    // SGD, whose step scales with the gradient (Adam's would hide a sum taken for a mean).
    let mut opt = Sgd::new(model.params(), 0.2, 0.9, 0.0, false).expect("sgd");
    let mut opt_ref = Sgd::new(reference.params(), 0.2, 0.9, 0.0, false).expect("sgd");
    let rows = 4 * size;
    let share = rows / size;
    for step in 0..5 {
        let x = values(rows * 6, 2 * step + 1);
        let y = values(rows * 3, 2 * step + 2);
        let xs = Tensor::from_slice(
            &dev,
            &x[rank * share * 6..(rank + 1) * share * 6],
            &[share, 6],
        )
        .expect("x");
        let ys = Tensor::from_slice(
            &dev,
            &y[rank * share * 3..(rank + 1) * share * 3],
            &[share, 3],
        )
        .expect("y");
        let loss = model
            .forward(&xs)
            .expect("forward")
            .mse_loss(&ys)
            .expect("loss");
        group.backward(&loss, &model.params()).expect("backward");
        opt.step().expect("step");
        opt.zero_grad();
        let mean = group.mean(loss.to_scalar().expect("loss"));

        let xa = Tensor::from_slice(&dev, &x, &[rows, 6]).expect("x");
        let ya = Tensor::from_slice(&dev, &y, &[rows, 3]).expect("y");
        let l = reference
            .forward(&xa)
            .expect("forward")
            .mse_loss(&ya)
            .expect("loss");
        let whole = l.to_scalar().expect("loss");
        l.backward().expect("backward");
        opt_ref.step().expect("step");
        opt_ref.zero_grad();
        assert!(
            (mean - whole).abs() <= 1e-5 * (1.0 + whole.abs()),
            "rank {rank} step {step}: mean loss over {size} processes {mean}, one process on the whole batch {whole}"
        );
    }
    assert!(
        group.params_identical(&model.params()).expect("checksum"),
        "rank {rank}: parameters diverged"
    );
    for ((name, a), (_, b)) in model.params().iter().zip(reference.params()) {
        let (a, b) = (
            a.to_vec::<f32>().expect("read"),
            b.to_vec::<f32>().expect("read"),
        );
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-5 + 1e-4 * q.abs(),
                "rank {rank}: {name}[{i}] {p} vs one process {q}"
            );
        }
    }
    println!(
        "mpi: rank {rank} of {size}: 5 steps, parameters identical across processes and equal to one process on the whole batch"
    );
}
