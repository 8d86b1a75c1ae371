//! Host side of `shaders/optim.wgsl`.

use super::{Arg, Kernel, Launch, f, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

const WG: u32 = 256;

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
    let n32 = u32_len("optimizer step", slot.n)?;
    let master = slot.master.unwrap_or(state[0]);
    let has_master = slot.master.is_some() as u32;
    match rule {
        Rule::Sgd { momentum, nesterov } => launch(
            dev,
            &Launch {
                kernel: Kernel::Optim,
                entry: "sgd",
                wg: WG,
                consts: &[],
                params: &[
                    n32,
                    f(lr),
                    f(gmul),
                    f(wd),
                    f(momentum),
                    f(nesterov as u32 as f32),
                    0,
                    0,
                    0,
                    has_master,
                ],
                args: &[
                    Arg::read("g", slot.g, slot.p_dtype),
                    Arg::write("w", slot.p, slot.p_dtype),
                    Arg::write("master", master, DType::F32),
                    Arg::write("buf", state[0], DType::F32),
                ],
                groups: grid_1d(slot.n, WG),
            },
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
            launch(
                dev,
                &Launch {
                    kernel: Kernel::Optim,
                    entry: "adam",
                    wg: WG,
                    consts: &[],
                    params: &[
                        n32,
                        f(lr),
                        f(gmul),
                        f(wd),
                        f(beta1),
                        f(beta2),
                        f(eps),
                        f(c1),
                        f(c2),
                        has_master | (decoupled as u32) << 1,
                    ],
                    args: &[
                        Arg::read("g", slot.g, slot.p_dtype),
                        Arg::write("w", slot.p, slot.p_dtype),
                        Arg::write("master", master, DType::F32),
                        Arg::write("m", state[0], DType::F32),
                        Arg::write("v", state[1], DType::F32),
                    ],
                    groups: grid_1d(slot.n, WG),
                },
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
    let n32 = u32_len("sum of squares", n)?;
    let parts = sumsq_parts(n);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Optim,
            entry: "sumsq",
            wg: WG,
            consts: &[],
            params: &[n32, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            args: &[
                Arg::read("x", x, dtype),
                Arg::write("partial", partial, DType::F32),
            ],
            groups: grid_1d(parts * WG as usize, WG),
        },
    )
}
