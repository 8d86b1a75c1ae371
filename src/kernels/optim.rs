//! Host side of `shaders/optim.wgsl`.

use super::{Arg, Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, over_budget, u32_len};
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
        wtot: u32,
        _pad0: u32,
        _pad1: u32,
        ns: [[u32; 4]; 4],
        ws: [[u32; 4]; 4],
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
    /// The momentum buffer (SGD) or (m, v) (Adam), f32. Where a rule keeps less state, the
    /// rest are blocks the kernel binds and never touches.
    pub state: [&'a Block; 2],
    pub n: usize,
}

impl Slot<'_> {
    /// The master binding: the master copy, or (never touched) the first state block.
    fn master_or_dummy(&self) -> &Block {
        self.master.unwrap_or(self.state[0])
    }
}

/// Parameters one grouped update (`sgd4`, `adam4`) or `sumsq` dispatch takes.
pub(crate) const GROUP: usize = 4;
/// Tensors `sumsq16` takes.
const GROUP16: usize = 16;

/// Parameters one update dispatch takes on `dev`: [`GROUP`] where the adapter binds `adam4`'s
/// 21 storage buffers (every desktop driver; WebGPU only promises 8), else 1.
pub(crate) fn group_len(dev: &Device) -> usize {
    if dev.caps().max_storage_buffers as usize > 5 * GROUP {
        GROUP
    } else {
        1
    }
}

/// Tensors one `sumsq` dispatch takes on `dev`: 16 where the adapter binds 17 storage
/// buffers, else 4.
pub(crate) fn sumsq_group(dev: &Device) -> usize {
    if dev.caps().max_storage_buffers as usize > GROUP16 {
        GROUP16
    } else {
        GROUP
    }
}

/// Where a group's tensors of `lens` elements start in a dispatch that gives each workgroup
/// `per_wg` elements of one tensor, as `group_slot` in optim.wgsl reads them: (element
/// counts, first workgroup of each tensor, and the total), tensors past `lens` empty.
type GroupLayout = ([[u32; 4]; 4], [[u32; 4]; 4], u32);

fn group_layout(op: &'static str, lens: &[usize], per_wg: usize) -> Result<GroupLayout> {
    if lens.len() > GROUP16 {
        return Err(crate::error::Error::Internal(format!(
            "{op} of {} tensors",
            lens.len()
        )));
    }
    let (mut n, mut w) = ([[0u32; 4]; 4], [[0u32; 4]; 4]);
    let mut total = 0usize;
    for k in 0..GROUP16 {
        w[k / 4][k % 4] = u32_len(op, total)?;
        if let Some(&len) = lens.get(k) {
            n[k / 4][k % 4] = u32_len(op, len)?;
            total += len.div_ceil(per_wg);
        }
    }
    Ok((n, w, u32_len(op, total)?))
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

/// One fused update of the parameters `slots` (at most [`group_len`]) with learning rate `lr`,
/// weight decay `wd`, and the gradient multiplied by `gmul` and by the control block's
/// multiplier (`ctl`, [`CTL_LEN`] f32; no update where it says the step was skipped).
pub(crate) fn step(
    dev: &Device,
    slots: &[Slot<'_>],
    rule: Rule,
    lr: f32,
    wd: f32,
    gmul: f32,
    ctl: &Block,
) -> Result<()> {
    let Some(first) = slots.first() else {
        return Ok(());
    };
    if slots.len() > GROUP {
        return Err(crate::error::Error::Internal(format!(
            "optimizer step of {} parameters in one launch",
            slots.len()
        )));
    }
    let lens: Vec<usize> = slots.iter().map(|s| s.n).collect();
    let (ns, ws, wtot) = group_layout("optimizer step", &lens, WG as usize)?;
    let has_master = slots
        .iter()
        .enumerate()
        .map(|(k, s)| (s.master.is_some() as u32) << k)
        .sum();
    let base = OptimParams {
        n: ns[0][0],
        ns,
        ws,
        wtot,
        lr,
        gmul,
        wd,
        has_master,
        ..Default::default()
    };
    let (entry, params, per_slot) = match rule {
        Rule::Sgd { momentum, nesterov } => (
            ["sgd", "sgd4"],
            OptimParams {
                beta1: momentum,
                nesterov: nesterov as u32,
                ..base
            },
            4,
        ),
        Rule::Adam {
            beta1,
            beta2,
            eps,
            step,
            decoupled,
        } => {
            let t = step.max(1) as i32;
            (
                ["adam", "adam4"],
                OptimParams {
                    beta1,
                    beta2,
                    eps,
                    c1: 1.0 / (1.0 - beta1.powi(t)),
                    c2: 1.0 / (1.0 - beta2.powi(t)),
                    decoupled: decoupled as u32,
                    ..base
                },
                5,
            )
        }
    };
    // One tensor takes the one-tensor entry; a group binds four, the missing ones as the
    // first again (with no elements).
    let bound = if slots.len() == 1 { 1 } else { GROUP };
    let mut args: Vec<Arg<'_>> = Vec::with_capacity(bound * per_slot + 1);
    for k in 0..bound {
        let s = slots.get(k).unwrap_or(first);
        let all = [
            arg(s.g, s.p_dtype),
            arg(s.p, s.p_dtype),
            arg(s.master_or_dummy(), DType::F32),
            arg(s.state[0], DType::F32),
            arg(s.state[1], DType::F32),
        ];
        // SGD binds one state block.
        args.extend(all.into_iter().take(per_slot));
    }
    args.push(arg(ctl, DType::F32));
    launch(
        dev,
        &Launch {
            kernel: Kernel::Optim,
            entry: entry[(bound > 1) as usize],
            wg: WG,
            consts: &[],
            params,
            args: &args,
            groups: grid_1d(wtot as usize * WG as usize, WG),
        },
    )
}

/// Number of f32 partials `sumsq` writes for `n` elements.
pub(crate) fn sumsq_parts(n: usize) -> usize {
    n.div_ceil(WG as usize * 8).max(1)
}

/// Partial f32 sums of squares of up to [`sumsq_group`] tensors `xs` (block, dtype,
/// elements) into `partial`, from element `at` on: sumsq_parts(n) values per tensor, in order.
pub(crate) fn sumsq(
    dev: &Device,
    xs: &[(&Block, DType, usize)],
    partial: &Block,
    at: usize,
) -> Result<()> {
    let Some(&first) = xs.first() else {
        return Ok(());
    };
    let op = "sum of squares";
    let lens: Vec<usize> = xs.iter().map(|x| x.2).collect();
    let (ns, ws, parts) = group_layout(op, &lens, WG as usize * 8)?;
    let (entry, bound) = if xs.len() > GROUP {
        ("sumsq16", GROUP16)
    } else {
        ("sumsq", GROUP)
    };
    // Missing tensors are the first one again, empty.
    let args: Vec<Arg<'_>> = (0..bound)
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
            entry,
            wg: WG,
            consts: &[],
            params: OptimParams {
                ns,
                ws,
                wtot: parts,
                out_off: u32_len(op, at + parts as usize)? - parts,
                ..Default::default()
            },
            args: &args,
            groups: grid_1d(parts as usize * WG as usize, WG),
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
