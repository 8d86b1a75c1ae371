//! Host side of `shaders/attention.wgsl`.

use super::{Arg, Kernel, Launch, f, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 128;
/// Largest head dimension supported.
pub const MAX_HEAD_DIM: usize = 256;

/// Problem sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub bh: usize,
    pub sq: usize,
    pub skv: usize,
    pub d: usize,
    pub scale: f32,
    pub causal: bool,
}

impl Dims {
    fn params(&self) -> [u32; 8] {
        [
            self.bh as u32,
            self.sq as u32,
            self.skv as u32,
            self.d as u32,
            f(self.scale),
            self.causal as u32,
            f(f32::NEG_INFINITY),
            0,
        ]
    }
}

/// (DMAX, forward BR, BC, backward BR, BC), sized so each kernel's workgroup memory stays
/// under 32 KiB (the smallest limit among the adapters wgrad targets).
fn config(d: usize) -> Result<(u32, u32, u32, u32, u32)> {
    Ok(match d {
        0..=32 => (32, 32, 32, 16, 32),
        33..=64 => (64, 32, 32, 16, 32),
        65..=128 => (128, 16, 16, 8, 16),
        129..=MAX_HEAD_DIM => (256, 8, 8, 4, 8),
        _ => {
            return Err(Error::LimitExceeded {
                what: "attention head dimension".into(),
                requested: d as u64,
                limit_name: "wgrad attention MAX_HEAD_DIM",
                limit: MAX_HEAD_DIM as u64,
            });
        }
    })
}

fn check(dev: &Device, a: &Dims) -> Result<()> {
    u32_len("attention", a.bh * a.sq.max(a.skv) * a.d)?;
    if a.bh > dev.caps().max_groups_per_dim as usize {
        return Err(Error::LimitExceeded {
            what: "attention batch x heads".into(),
            requested: a.bh as u64,
            limit_name: "max_compute_workgroups_per_dimension",
            limit: dev.caps().max_groups_per_dim as u64,
        });
    }
    Ok(())
}

/// Whether the forward pass runs on cooperative matrices (see attention_coop.wgsl).
pub fn uses_tensor_cores(dev: &Device, dtype: DType, sq: usize, skv: usize, d: usize) -> bool {
    let c = dev.caps();
    dtype == DType::F16
        && c.coop_matrix_16
        && c.f16
        && c.subgroups
        && c.subgroup_min == 32
        && c.subgroup_max == 32
        && (d == 64 || d == 128)
        && sq.is_multiple_of(16)
        && skv.is_multiple_of(16)
        && sq >= 16
}

/// o = attention(q, k, v), lse (f32 [bh, sq]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    dev: &Device,
    a: &Dims,
    q: &Block,
    k: &Block,
    v: &Block,
    o: &Block,
    lse: &Block,
    dtype: DType,
) -> Result<()> {
    check(dev, a)?;
    let args = [
        Arg::read("q", q, dtype),
        Arg::read("k", k, dtype),
        Arg::read("v", v, dtype),
        Arg::write("o", o, dtype),
        Arg::write("lse", lse, DType::F32),
    ];
    if uses_tensor_cores(dev, dtype, a.sq, a.skv, a.d) {
        return launch(
            dev,
            &Launch {
                kernel: Kernel::AttentionCoop,
                entry: "fwd",
                wg: 128,
                consts: &[("DMAX", a.d as u32)],
                params: &a.params(),
                args: &args,
                groups: [a.sq.div_ceil(64) as u32, a.bh as u32, 1],
            },
        );
    }
    let (dmax, br, bc, _, _) = config(a.d)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Attention,
            entry: "fwd",
            wg: WG,
            consts: &[("BR", br), ("BC", bc), ("DMAX", dmax)],
            params: &a.params(),
            args: &args,
            groups: [a.sq.div_ceil(br as usize) as u32, a.bh as u32, 1],
        },
    )
}

/// The saved tensors and gradients of one attention backward pass.
pub(crate) struct Grads<'a> {
    pub q: &'a Block,
    pub k: &'a Block,
    pub v: &'a Block,
    pub o: &'a Block,
    pub lse: &'a Block,
    pub dout: &'a Block,
    /// f32 scratch [bh, sq].
    pub delta: &'a Block,
    pub dq: &'a Block,
    pub dk: &'a Block,
    pub dv: &'a Block,
}

pub(crate) fn backward(dev: &Device, a: &Dims, g: &Grads<'_>, dtype: DType) -> Result<()> {
    check(dev, a)?;
    let (dmax, _, _, br, bc) = config(a.d)?;
    let consts = [("BR", br), ("BC", bc), ("DMAX", dmax)];
    let params = a.params();
    launch(
        dev,
        &Launch {
            kernel: Kernel::Attention,
            entry: "bwd_delta",
            wg: 256,
            consts: &consts,
            params: &params,
            args: &[
                Arg::read("o", g.o, dtype),
                Arg::read("dout", g.dout, dtype),
                Arg::write("delta", g.delta, DType::F32),
            ],
            groups: grid_1d(a.bh * a.sq, 256),
        },
    )?;
    fn common<'a>(
        g: &Grads<'a>,
        dtype: DType,
        extra: Arg<'a>,
        extra2: Option<Arg<'a>>,
    ) -> Vec<Arg<'a>> {
        let mut v = vec![
            Arg::read("q", g.q, dtype),
            Arg::read("k", g.k, dtype),
            Arg::read("v", g.v, dtype),
            Arg::read("dout", g.dout, dtype),
            Arg::read("lse", g.lse, DType::F32),
            Arg::read("delta", g.delta, DType::F32),
            extra,
        ];
        v.extend(extra2);
        v
    }
    launch(
        dev,
        &Launch {
            kernel: Kernel::Attention,
            entry: "bwd_kv",
            wg: WG,
            consts: &consts,
            params: &params,
            args: &common(
                g,
                dtype,
                Arg::write("dk", g.dk, dtype),
                Some(Arg::write("dv", g.dv, dtype)),
            ),
            groups: [a.skv.div_ceil(bc as usize) as u32, a.bh as u32, 1],
        },
    )?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Attention,
            entry: "bwd_q",
            wg: WG,
            consts: &consts,
            params: &params,
            args: &common(g, dtype, Arg::write("dq", g.dq, dtype), None),
            groups: [a.sq.div_ceil(br as usize) as u32, a.bh as u32, 1],
        },
    )
}
