//! Host side of `shaders/matmul.wgsl` and `shaders/matmul_coop.wgsl`.

use super::{Arg, Kernel, Launch, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

/// A fused activation applied after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// None.
    None = 0,
    /// max(x, 0).
    Relu = 1,
    /// GELU (erf form).
    Gelu = 2,
}

/// One batched product `c[b] = act(op(a)[b] x op(b)[b] + bias)`.
pub(crate) struct Gemm<'a> {
    pub a: &'a Block,
    pub b: &'a Block,
    pub c: &'a Block,
    pub bias: Option<&'a Block>,
    /// Dtype of a, b, bias and c.
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// A is stored K x M (per batch).
    pub trans_a: bool,
    /// B is stored N x K.
    pub trans_b: bool,
    /// Element offset between consecutive A matrices (0 broadcasts one matrix).
    pub a_bs: usize,
    pub b_bs: usize,
    /// A's matrix index is `batch_index % a_mod`.
    pub a_mod: usize,
    pub b_mod: usize,
    pub act: Act,
    /// Element offsets of the first A, B and C matrices in their blocks.
    pub offsets: (usize, usize, usize),
}

/// Which kernel and tile configuration a product runs with (reported by the bench).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// Tensor-core kernel loading operands straight from memory (aligned shapes).
    CoopDirect,
    /// Tensor-core kernel staging operands in workgroup memory (any shape), 128 x 128 tiles.
    Coop,
    /// Tiled kernel: (BM, BN, BK, TM, TN).
    Tiled(u32, u32, u32, u32, u32),
}

/// The configuration `matmul` picks for these sizes on `dev`.
pub fn choose(dev: &Device, dtype: DType, m: usize, n: usize, k: usize) -> Config {
    let c = dev.caps();
    let coop_ok = dtype == DType::F16
        && c.coop_matrix_16
        && c.f16
        && c.subgroups
        && c.subgroup_min == 32
        && c.subgroup_max == 32;
    if coop_ok
        && m.is_multiple_of(16)
        && n.is_multiple_of(16)
        && k.is_multiple_of(16)
        && m > 0
        && n > 0
        && k > 0
        && m.min(n) >= 64
    {
        return Config::CoopDirect;
    }
    if coop_ok && m >= 64 && n >= 64 && k >= 32 {
        return Config::Coop;
    }
    // Measured on an H200 (Vulkan): 64 x 64 tiles with 4 x 4 outputs per thread ran a
    // 4096-cube product at 3-4x the rate of 128 x 128 tiles with 8 x 8 per thread, whose 64
    // accumulators spill. The large tile stays for validation and experiments.
    if m >= 48 && n >= 48 {
        Config::Tiled(64, 64, 16, 4, 4)
    } else {
        Config::Tiled(32, 32, 16, 2, 2)
    }
}

pub(crate) fn matmul(dev: &Device, g: &Gemm<'_>) -> Result<()> {
    u32_len(
        "matmul",
        g.offsets.2 + g.batch.max(1) * g.m.max(1) * g.n.max(1),
    )?;
    u32_len("matmul", g.offsets.0 + g.a_bs * g.a_mod.max(1) + g.m * g.k)?;
    u32_len("matmul", g.offsets.1 + g.b_bs * g.b_mod.max(1) + g.n * g.k)?;
    if g.batch > dev.caps().max_groups_per_dim as usize {
        return Err(Error::LimitExceeded {
            what: "matmul batch".into(),
            requested: g.batch as u64,
            limit_name: "max_compute_workgroups_per_dimension",
            limit: dev.caps().max_groups_per_dim as u64,
        });
    }
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(());
    }
    // Strides of op(A)'s (m, k) and op(B)'s (k, n), and which axis is contiguous.
    let (sam, sak, a_kfast) = if g.trans_a { (1, g.m, 0) } else { (g.k, 1, 1) };
    let (sbk, sbn, b_nfast) = if g.trans_b { (1, g.k, 0) } else { (g.n, 1, 1) };
    let params = [
        g.m as u32,
        g.n as u32,
        g.k as u32,
        g.batch as u32,
        sam as u32,
        sak as u32,
        sbk as u32,
        sbn as u32,
        g.a_bs as u32,
        g.b_bs as u32,
        g.a_mod.max(1) as u32,
        g.b_mod.max(1) as u32,
        a_kfast,
        b_nfast,
        g.act as u32,
        g.bias.is_some() as u32,
        g.offsets.0 as u32,
        g.offsets.1 as u32,
        g.offsets.2 as u32,
        0,
    ];
    let bias = g.bias.unwrap_or(g.c);
    let args = [
        Arg::read("a", g.a, g.dtype),
        Arg::read("b", g.b, g.dtype),
        Arg::read("bias", bias, g.dtype),
        Arg::write("c", g.c, g.dtype),
    ];
    // The direct kernel loads whole 16 x 16 tiles without bounds checks: every operand offset
    // must also sit on an 8-element boundary (16 bytes), which cooperative loads assume.
    let aligned = [g.offsets.0, g.offsets.1, g.a_bs, g.b_bs]
        .iter()
        .all(|v| v % 8 == 0);
    let mut config = choose(dev, g.dtype, g.m, g.n, g.k);
    if config == Config::CoopDirect && !aligned {
        config = Config::Coop;
    }
    match config {
        Config::CoopDirect => launch(
            dev,
            &Launch {
                kernel: Kernel::MatmulCoop,
                entry: "direct",
                wg: 256,
                consts: &[
                    ("SAG", if g.trans_a { g.m } else { g.k } as u32),
                    ("SBG", if g.trans_b { g.k } else { g.n } as u32),
                    ("TA", g.trans_a as u32),
                    ("TB", g.trans_b as u32),
                ],
                params: &params,
                args: &args,
                groups: [
                    g.n.div_ceil(128) as u32,
                    g.m.div_ceil(128) as u32,
                    g.batch as u32,
                ],
            },
        ),
        Config::Coop => launch(
            dev,
            &Launch {
                kernel: Kernel::MatmulCoop,
                entry: "main",
                wg: 256,
                consts: &[],
                params: &params,
                args: &args,
                groups: [
                    g.n.div_ceil(128) as u32,
                    g.m.div_ceil(128) as u32,
                    g.batch as u32,
                ],
            },
        ),
        Config::Tiled(bm, bn, bk, tm, tn) => launch(
            dev,
            &Launch {
                kernel: Kernel::Matmul,
                entry: "main",
                wg: (bm / tm) * (bn / tn),
                consts: &[("BM", bm), ("BN", bn), ("BK", bk), ("TM", tm), ("TN", tn)],
                params: &params,
                args: &args,
                groups: [
                    g.n.div_ceil(bn as usize) as u32,
                    g.m.div_ceil(bm as usize) as u32,
                    g.batch as u32,
                ],
            },
        ),
    }
}
