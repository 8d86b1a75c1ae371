//! Host side of `shaders/optim.wgsl`.

use super::{Kernel, Launch, arg, grid_1d, launch, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

const WG: u32 = 256;

crate::params! {
    /// `struct Params` of optim.wgsl.
    pub struct OptimParams {
        n: u32,
        lr: f32,
        gmul: f32,
        wd: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        c1: f32,
        c2: f32,
        has_master: u32,
        decoupled: u32,
        nesterov: u32,
    }
}

/// A parameter and the state its update touches.
pub(crate) struct Slot<'a> {
    /// The parameter (f32 or f16).
    pub p: &'a Block,
    pub p_dtype: DType,
    /// Its gradient (same dtype as the parameter).
    pub g: &'a Block,
    /// f32 master copy, when the parameter is stored in f16.
    pub master: Option<&'a Block>,
    pub n: usize,
}

/// Hyper-parameters of one step.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    Sgd {
        momentum: f32,
        nesterov: bool,
    },
    Adam {
        beta1: f32,
        beta2: f32,
        eps: f32,
        step: u64,
        decoupled: bool,
    },
}

/// One fused update of `slot` with learning rate `lr`, weight decay `wd`, and the gradient
/// multiplied by `gmul`. `state` holds the momentum buffer (SGD) or (m, v) (Adam), f32.
pub(crate) fn step(
    dev: &Device,
    slot: &Slot<'_>,
    rule: Rule,
    lr: f32,
    wd: f32,
    gmul: f32,
    state: &[&Block],
) -> Result<()> {
    let master = slot.master.unwrap_or(state[0]);
    let base = OptimParams {
        n: u32_len("optimizer step", slot.n)?,
        lr,
        gmul,
        wd,
        has_master: slot.master.is_some() as u32,
        ..Default::default()
    };
    match rule {
        Rule::Sgd { momentum, nesterov } => launch_flat(
            dev,
            Kernel::Optim,
            "sgd",
            WG,
            OptimParams {
                beta1: momentum,
                nesterov: nesterov as u32,
                ..base
            },
            &[
                arg(slot.g, slot.p_dtype),
                arg(slot.p, slot.p_dtype),
                arg(master, DType::F32),
                arg(state[0], DType::F32),
            ],
            slot.n,
        ),
        Rule::Adam {
            beta1,
            beta2,
            eps,
            step,
            decoupled,
        } => {
            let t = step.max(1) as i32;
            let c1 = 1.0 / (1.0 - beta1.powi(t));
            let c2 = 1.0 / (1.0 - beta2.powi(t));
            launch_flat(
                dev,
                Kernel::Optim,
                "adam",
                WG,
                OptimParams {
                    beta1,
                    beta2,
                    eps,
                    c1,
                    c2,
                    decoupled: decoupled as u32,
                    ..base
                },
                &[
                    arg(slot.g, slot.p_dtype),
                    arg(slot.p, slot.p_dtype),
                    arg(master, DType::F32),
                    arg(state[0], DType::F32),
                    arg(state[1], DType::F32),
                ],
                slot.n,
            )
        }
    }
}

/// Number of f32 partials `sumsq` writes for `n` elements.
pub(crate) fn sumsq_parts(n: usize) -> usize {
    n.div_ceil(WG as usize * 8).max(1)
}

/// Partial f32 sums of squares of `x` into `partial` (sumsq_parts(n) values).
pub(crate) fn sumsq(
    dev: &Device,
    x: &Block,
    dtype: DType,
    n: usize,
    partial: &Block,
) -> Result<()> {
    let parts = sumsq_parts(n);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Optim,
            entry: "sumsq",
            wg: WG,
            consts: &[],
            params: OptimParams {
                n: u32_len("sum of squares", n)?,
                ..Default::default()
            },
            args: &[arg(x, dtype), arg(partial, DType::F32)],
            groups: grid_1d(parts * WG as usize, WG),
        },
    )
}
