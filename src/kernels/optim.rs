//! Host side of `shaders/optim.wgsl`.

use super::{
    Arg, Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, launch_flat, over_budget, u32_len,
};
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
        out_off: u32,
        max_norm: f32,
        growth: f32,
        backoff: f32,
        interval: u32,
        n1: u32,
        n2: u32,
        n3: u32,
        w1: u32,
        w2: u32,
        w3: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

crate::codes! {
    /// The slots of a step's control block (f32 on the device, shader constants `CTL_*`):
    /// what `decide` wrote for the last step and the loss scaler's state.
    pub enum Ctl: "CTL" {
        /// The loss scale the next step's loss is multiplied by.
        Scale = "SCALE",
        /// Clean steps since the scale last changed.
        Clean = "CLEAN",
        /// Steps skipped so far.
        Skipped = "SKIPPED",
        /// The last step's gradient norm, unscaled, before clipping.
        Norm = "NORM",
        /// The last step's gradient multiplier (1/scale times the clip), 0 when skipped.
        Mul = "MUL",
        /// 1 when the last step updated the parameters, 0 when it was skipped.
        Stepped = "STEPPED",
        /// The last step's clip coefficient (1 when not clipped).
        Clip = "CLIP",
    }
}

/// Slots in a control block.
pub(crate) const CTL_LEN: usize = Ctl::ALL.len();

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
/// multiplied by `gmul` and by the control block's multiplier (`ctl`, [`CTL_LEN`] f32; no
/// update where it says the step was skipped). `state` holds the momentum buffer (SGD) or
/// (m, v) (Adam), f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step(
    dev: &Device,
    slot: &Slot<'_>,
    rule: Rule,
    lr: f32,
    wd: f32,
    gmul: f32,
    state: &[&Block],
    ctl: &Block,
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
                arg(ctl, DType::F32),
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
                    arg(ctl, DType::F32),
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

/// Tensors one `sumsq` dispatch reads.
pub(crate) const SUMSQ_GROUP: usize = 4;

/// Partial f32 sums of squares of up to [`SUMSQ_GROUP`] tensors `xs` (block, dtype, elements)
/// into `partial`, from element `at` on: sumsq_parts(n) values per tensor, in order.
pub(crate) fn sumsq(
    dev: &Device,
    xs: &[(&Block, DType, usize)],
    partial: &Block,
    at: usize,
) -> Result<()> {
    let Some(&first) = xs.first() else {
        return Ok(());
    };
    if xs.len() > SUMSQ_GROUP {
        return Err(crate::error::Error::Internal(format!(
            "sumsq of {} tensors",
            xs.len()
        )));
    }
    // Workgroup starts and element counts; missing tensors are the first one again, empty.
    let mut n = [0u32; SUMSQ_GROUP];
    let mut w = [0u32; SUMSQ_GROUP + 1];
    for (i, &(_, _, len)) in xs.iter().enumerate() {
        n[i] = u32_len("sum of squares", len)?;
        w[i + 1] = w[i] + sumsq_parts(len) as u32;
    }
    for i in xs.len()..SUMSQ_GROUP {
        w[i + 1] = w[i];
    }
    let parts = w[SUMSQ_GROUP] as usize;
    let args: Vec<Arg<'_>> = (0..SUMSQ_GROUP)
        .map(|i| {
            let (b, d, _) = xs.get(i).copied().unwrap_or(first);
            arg(b, d)
        })
        .chain([arg(partial, DType::F32)])
        .collect();
    launch(
        dev,
        &Launch {
            kernel: Kernel::Optim,
            entry: "sumsq",
            wg: WG,
            consts: &[],
            params: OptimParams {
                n: n[0],
                n1: n[1],
                n2: n[2],
                n3: n[3],
                w1: w[1],
                w2: w[2],
                w3: w[3],
                out_off: u32_len("sum of squares", at + parts)? - parts as u32,
                ..Default::default()
            },
            args: &args,
            groups: grid_1d(parts * WG as usize, WG),
        },
    )
}

/// How `decide` turns the gradients' sum of squares into a step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decision {
    /// Multiplied into the gradients besides 1/scale (1/accumulation steps, say).
    pub gmul: f32,
    /// Clip the unscaled global norm to this (0: no clipping).
    pub max_norm: f32,
    pub growth: f32,
    pub backoff: f32,
    pub interval: u32,
}

/// Sums the `n` partial sums of squares in `partial` and writes the step's decision into the
/// control block `ctl` (see optim.wgsl `decide`).
pub(crate) fn decide(
    dev: &Device,
    partial: &Block,
    n: usize,
    ctl: &Block,
    d: Decision,
) -> Result<()> {
    // One workgroup strides over the partials: keep its loop inside the budget (with the
    // block reduction's few iterations).
    let limit = (LOOP_BUDGET - 64) * WG as usize;
    if n > limit {
        return Err(over_budget(
            format!("gradient norm over {n} partial sums"),
            n,
            limit,
        ));
    }
    launch(
        dev,
        &Launch {
            kernel: Kernel::Optim,
            entry: "decide",
            wg: WG,
            consts: &[],
            params: OptimParams {
                n: n as u32,
                gmul: d.gmul,
                max_norm: d.max_norm,
                growth: d.growth,
                backoff: d.backoff,
                interval: d.interval,
                ..Default::default()
            },
            args: &[arg(partial, DType::F32), arg(ctl, DType::F32)],
            groups: [1, 1, 1],
        },
    )
}
