//! Host side of `shaders/matmul.wgsl` and `shaders/matmul_coop.wgsl`.

//!
//! Loop budget: a product's K is cut into splits of at most [`Config::kchunk`] (what one
//! invocation of that kernel covers within the loop budget); with more than one split each
//! split writes f32 partial products and `splitk` sums them and applies the epilogue. Long
//! contractions (a weight gradient over many rows) also gain parallelism this way.
//!
//! Which kernel, tiling and split a product takes is decided in `kernels::matmul_plan`, from
//! the product and the device's [`DeviceProfile`](crate::device::DeviceProfile) alone; this
//! file launches what it plans (and lets the autotuner measure the alternatives).

use super::conv::Geom;
use super::matmul_plan::{self as mp, Problem};
use super::{Consts, Kernel, LOOP_BUDGET, Launch, arg, autotune, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;
use smallvec::smallvec;

crate::codes! {
    /// A fused activation applied after the bias (shader constants `ACT_*`).
    pub enum Act: "ACT" {
        /// None.
        None = "NONE",
        /// max(x, 0).
        Relu = "RELU",
        /// GELU (erf form).
        Gelu = "GELU",
    }
}

crate::params! {
    /// `struct MatmulParams` of common.wgsl (matmul.wgsl and matmul_coop.wgsl).
    pub struct MatmulParams {
        m: u32,
        n: u32,
        k: u32,
        batch: u32,
        sam: u32,
        sak: u32,
        sbk: u32,
        sbn: u32,
        a_bs: u32,
        b_bs: u32,
        a_mod: u32,
        b_mod: u32,
        a_kfast: u32,
        b_nfast: u32,
        act: u32,
        has_bias: u32,
        a_off: u32,
        b_off: u32,
        c_off: u32,
        kchunk: u32,
        splits: u32,
        raw: u32,
        bias_rows: u32,
        bias_bs: u32,
        im_h: u32,
        im_w: u32,
        im_kk: u32,
        im_kw: u32,
        im_sh: u32,
        im_sw: u32,
        im_ph: i32,
        im_pw: i32,
        im_dh: i32,
        im_dw: i32,
        im_wo: u32,
        sum_off: u32,
    }
}

/// One batched product `c[b] = act(op(a)[b] x op(b)[b] + bias)`.
pub(crate) struct Gemm<'a> {
    pub a: &'a Block,
    pub b: &'a Block,
    pub c: &'a Block,
    pub bias: Option<&'a Block>,
    /// Dtype of a, b and bias.
    pub dtype: DType,
    /// Dtype of c: `dtype`, or f32 from f16 operands (the split products of
    /// `MatmulPrecision::High`, which keep the raw f32 sums).
    pub c_dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// Element strides of op(A)'s rows (m) and columns (k); one of them must be 1.
    pub a_strides: (usize, usize),
    /// Element strides of op(B)'s rows (k) and columns (n); one of them must be 1.
    pub b_strides: (usize, usize),
    /// Element offset between consecutive A matrices (0 broadcasts one matrix).
    pub a_bs: usize,
    pub b_bs: usize,
    /// A's matrix index is `batch_index % a_mod`.
    pub a_mod: usize,
    pub b_mod: usize,
    pub act: Act,
    /// Element offsets of the first A, B and C matrices in their blocks.
    pub offsets: (usize, usize, usize),
    /// Bias per output row (a convolution's channels) instead of per column; batch element
    /// b's bias starts at (b % a_mod) * bias_bs.
    pub bias_rows: bool,
    pub bias_bs: usize,
    /// An implicit convolution: op(B) is gathered from images with this window instead of
    /// read from a column matrix (see [`Gather`]).
    pub gather: Option<Gather>,
    /// Where the kernel can (see [`matmul`]'s result), also the sums of op(A)'s rows,
    /// Σ_k op(A)[m, k], into this block from this element offset in `c_dtype`: a bias's
    /// gradient beside its weight's.
    pub row_sums: Option<(&'a Block, usize)>,
}

/// An implicit convolution's image operand: op(B)[k, n] is what output position n's window
/// reads at column-matrix row k, zero in the padding. A batch element's image starts at
/// B's offset + (b % b_mod) * b_bs. Which kernel gathers decides the layout (`gathers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// The convolution's window over the images (its batch is the product's).
    pub geom: Geom,
    /// Each window read mirrored (tap (ki, kj) as (KH - 1 - ki, KW - 1 - kj)): an input
    /// gradient as a convolution with the weight flipped.
    pub mirrored: bool,
    /// The layout, as `gathers` chose it.
    pub layout: ImageLayout,
}

/// How the kernel that gathers an implicit convolution wants the images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageLayout {
    /// NCHW, K ordered (channel, tap), op(B) contiguous along N (the positions): `reg`,
    /// which needs A's offset, batch stride, pitch and contiguous extent multiples of 4.
    Planar,
    /// NHWC, with the column matrix's rows ordered (tap, channel), one group: `wide` on
    /// tensor cores, which needs the channels, A's pitch and offsets multiples of 8 and
    /// op(A) contiguous along K, or `reg`, which needs them multiples of 4 (the channel run
    /// of `gathers`). op(B) is the column matrix (contiguous along K: a forward product)
    /// or its transpose (contiguous along N: a weight gradient).
    ChannelsLast,
}

/// How implicit convolutions gather on a device for a dtype (`gathers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gathers {
    /// Channels in one load of a channels-last image: the channel count (and a weight
    /// gradient's output positions) must be a multiple.
    pub run: usize,
    /// Whether planar images gather too (`reg`), for what channels last cannot take.
    pub planar: bool,
}

/// Which kernel and tile configuration a product runs with (reported by the bench).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// Tensor-core kernel with double-buffered workgroup tiles, for f16 operands whose
    /// contiguous extents, pitches and offsets are multiples of 4 (matmul_tc.wgsl `main`).
    CoopTiled,
    /// `CoopTiled` with 16-byte runs (matmul_wide.wgsl, compiled by wgrad:
    /// `kernels::spirv`): contiguous extents, pitches and offsets multiples of 8, and an
    /// adapter that takes wgrad's SPIR-V (`Caps::spirv`).
    CoopWide,
    /// `CoopWide` with 256 x 128 tiles: 8 subgroups of 64 x 64 outputs, K steps of 48 (32
    /// where B is contiguous along K, x W^T) within 48 KiB of workgroup memory
    /// (matmul_wide.wgsl, RM = 256). A workgroup loads a quarter less per product than two
    /// 128 x 128 ones, which is what `wide` waits on at large sizes; [`plan`] takes it where
    /// such tiles fill at least three waves of the GPU.
    CoopWideTall,
    /// `CoopWide` with 128 x 256 tiles, 8 subgroups of 64 x 64 outputs (matmul_wide.wgsl, RM =
    /// 128 with 256 invocations), the K steps of `CoopWideTall`: for weight gradients with
    /// few rows and many columns, split along a long K ([`plan`]).
    CoopWideFlat,
    /// `CoopWide` with 128 x 192 tiles, 8 subgroups of 64 x 48 outputs (matmul_wide.wgsl, RM =
    /// 128, RN = 192), K steps of 64 in every layout: for outputs whose 128 x 128 or 256 x 128
    /// tiles fill the GPU's waves poorly, such as the GPT's 384 wide ones, and weight
    /// gradients they pad least ([`plan`]).
    CoopWideMid,
    /// Tensor-core kernel loading fragments straight from the buffers, 64 x 64 per subgroup
    /// (matmul_tc.wgsl `direct`): M, N, K multiples of 16, B contiguous along N.
    CoopDirect,
    /// Tensor-core kernel for any f16 shape (matmul_coop.wgsl), 128 x 128 tiles.
    Coop,
    /// Tiled kernel: (BM, BN, BK, TM, TN).
    Tiled(u32, u32, u32, u32, u32),
    /// 128 x 128 tiles, 8 x 8 outputs per thread in vec4 registers (matmul.wgsl `reg`), for
    /// operands whose offsets, pitches and contiguous extents are multiples of 4.
    Reg,
    /// Register tiles with no workgroup memory, for CPU adapters: (TM, TN) per invocation.
    Simt(u32, u32),
    /// Simt with 4-column loads of B (B contiguous along N): (TM rows, TN4 groups of 4
    /// columns) per invocation.
    SimtN4(u32, u32),
    /// Simt with 4-element loads along K of both operands (A and B contiguous along K):
    /// (TM, TN) outputs per invocation.
    SimtK4(u32, u32),
}

impl Config {
    /// The longest K range one invocation covers within the loop budget (see the shaders'
    /// loop counts), a multiple of the kernel's K step.
    pub fn kchunk(self) -> usize {
        // Counted loop iterations per K step, and the step; 100 iterations are kept for the
        // epilogue, 256 for the tensor-core kernels' (up to 25 a strip in matmul_tc.wgsl,
        // whose `main` writes 8 strips, and up to 102 a half in matmul_wide.wgsl, where N is
        // not a multiple of 4 and outputs are stored one by one).
        let reserve = if self.staged_tc() { 256 } else { 100 };
        let (per_step, step) = match self {
            Config::CoopTiled => (1, 32),
            Config::CoopWide => (1, 64),
            Config::CoopWideTall | Config::CoopWideFlat => (1, 32),
            Config::CoopWideMid => (1, 64),
            Config::CoopDirect => (1, 16),
            Config::Coop => (35, 32),
            // The simt kernels' only counted loop is K's: their constant TM x TN loops are
            // unrolled (tests/limits.rs checks it on lavapipe, where a count of one per
            // unrolled iteration would exceed the cap); 2 per step keeps a margin.
            Config::Simt(..) | Config::SimtN4(..) => (2, 1),
            Config::SimtK4(..) => (2, 4),
            Config::Tiled(bm, bn, bk, tm, tn) => {
                let wg = (bm / tm) * (bn / tn);
                ((bm * bk / wg + 1) + (bn * bk / wg + 1) + bk + 2, bk)
            }
            // The k loop of RBK = 16 and its exit; the block loads' edge loops (4 each, in
            // the rare blocks across an edge) counted too.
            Config::Reg => (REG_BK + 2 + 8, REG_BK),
        };
        ((LOOP_BUDGET - reserve) / per_step as usize) * step as usize
    }

    /// Whether this is a tensor-core kernel that takes operand layouts and alignments
    /// (`main`, `direct` and `wide`'s tilings; not `Coop`, which takes any f16 shape).
    pub(crate) fn staged_tc(self) -> bool {
        matches!(self, Config::CoopTiled | Config::CoopDirect) || self.wide()
    }

    /// Whether this is one of `wide`'s tilings (matmul_wide.wgsl).
    pub(crate) fn wide(self) -> bool {
        matches!(
            self,
            Config::CoopWide | Config::CoopWideTall | Config::CoopWideFlat | Config::CoopWideMid
        )
    }

    pub(crate) fn wg(self) -> u32 {
        match self {
            Config::Simt(..) | Config::SimtN4(..) | Config::SimtK4(..) => 64,
            Config::CoopTiled | Config::CoopWide | Config::CoopDirect => 128,
            Config::Coop
            | Config::Reg
            | Config::CoopWideTall
            | Config::CoopWideFlat
            | Config::CoopWideMid => 256,
            Config::Tiled(bm, bn, _, tm, tn) => (bm / tm) * (bn / tn),
        }
    }

    pub(crate) fn tile(self) -> (usize, usize) {
        match self {
            Config::Simt(tm, tn) => (8 * tm as usize, 8 * tn as usize),
            Config::SimtN4(tm, tn4) => (8 * tm as usize, 32 * tn4 as usize),
            Config::SimtK4(tm, tn) => (8 * tm as usize, 8 * tn as usize),
            Config::CoopTiled
            | Config::CoopWide
            | Config::CoopDirect
            | Config::Coop
            | Config::Reg => (128, 128),
            Config::CoopWideTall => (256, 128),
            Config::CoopWideFlat => (128, 256),
            Config::CoopWideMid => (128, 192),
            Config::Tiled(bm, bn, ..) => (bm as usize, bn as usize),
        }
    }
}

/// The K step of `reg` (RBK in matmul.wgsl).
const REG_BK: u32 = 16;

/// Where a product's operands sit (element strides and offsets), as `plan` needs them.
#[derive(Clone, Copy, Debug)]
pub struct Operands {
    /// Strides of op(A)'s rows (m) and columns (k).
    pub a_strides: (usize, usize),
    /// Strides of op(B)'s rows (k) and columns (n).
    pub b_strides: (usize, usize),
    /// Offsets of the first A and B matrices.
    pub offsets: (usize, usize),
    /// Offsets between consecutive A and B matrices of a batch.
    pub batch_strides: (usize, usize),
}

impl Operands {
    /// Dense row-major operands at offset 0 (one matrix each), op(A) = A^T when `ta`.
    pub fn dense(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Operands {
        Operands {
            a_strides: if ta { (1, m) } else { (k, 1) },
            b_strides: if tb { (1, k) } else { (n, 1) },
            offsets: (0, 0),
            batch_strides: (0, 0),
        }
    }
}

thread_local! {
    /// A configuration `plan` returns instead of choosing (see [`forced`]).
    static FORCED: std::cell::Cell<Option<Config>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every product on this thread planned as if the size rules had chosen
/// `config` (tests run each kernel on adapters where the rules would not pick it: the GPU
/// kernels on lavapipe, benchmarks the tensor-core kernels side by side); the layout rules
/// still apply (`Reg` needs runs of 4, `Simt` takes its 4-wide forms where it can, the
/// tensor-core kernels their alignments). `CoopTiled`, `CoopWide`, `CoopWideTall`,
/// `CoopWideFlat`, `CoopWideMid` and `CoopDirect` apply only
/// where the adapter and dtype have tensor cores (elsewhere the usual choice stands); `Coop`
/// and the CPU kernels' other forms are an error.
#[doc(hidden)]
pub fn forced<R>(config: Config, f: impl FnOnce() -> R) -> Result<R> {
    if !(matches!(config, Config::Tiled(..) | Config::Reg | Config::Simt(..)) || config.staged_tc())
    {
        return Err(Error::invalid(
            "matmul::forced",
            format!("{config:?} does not take every shape"),
        ));
    }
    let before = FORCED.with(|c| c.replace(Some(config)));
    let r = f();
    FORCED.with(|c| c.set(before));
    Ok(r)
}

/// The configuration [`forced`] set on this thread, if any.
pub(crate) fn forced_config() -> Option<Config> {
    FORCED.with(|c| c.get())
}

/// The kernel and tiles a product of these sizes and operand layouts runs with on `dev`
/// ([`matmul_plan::config`](super::matmul_plan::config) for its profile, under [`forced`]).
pub fn plan(dev: &Device, dtype: DType, (m, n, k): (usize, usize, usize), o: &Operands) -> Config {
    let p = Problem {
        dtype,
        m,
        n,
        k,
        batch: 1,
        operands: *o,
    };
    mp::config(&p, dev.hardware(), forced_config())
}

/// How implicit convolutions gather on `dev` for `dtype`
/// ([`matmul_plan::gathers`](super::matmul_plan::gathers)).
pub(crate) fn gathers(dev: &Device, dtype: DType) -> Option<Gathers> {
    mp::gathers(dev.hardware(), dtype, forced_config())
}

/// Runs the product; true where it also wrote `row_sums` (else the caller sums them).
pub(crate) fn matmul(dev: &Device, g: &Gemm<'_>) -> Result<bool> {
    u32_len(
        "matmul",
        g.offsets.2 + g.batch.max(1) * g.m.max(1) * g.n.max(1),
    )?;
    let extent =
        |off: usize, bs: usize, md: usize, (r, c): (usize, usize), (sr, sc): (usize, usize)| {
            off + bs * md.max(1) + r * sr + c * sc
        };
    u32_len(
        "matmul",
        extent(g.offsets.0, g.a_bs, g.a_mod, (g.m, g.k), g.a_strides),
    )?;
    u32_len(
        "matmul",
        match &g.gather {
            // The images: the window reads inside each, padding is not stored.
            Some(_) => g.offsets.1 + g.b_bs * g.b_mod.max(1),
            None => extent(g.offsets.1, g.b_bs, g.b_mod, (g.k, g.n), g.b_strides),
        },
    )?;
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(false);
    }
    super::cores::ensure(dev)?;
    if (g.a_strides.0 != 1 && g.a_strides.1 != 1) || (g.b_strides.0 != 1 && g.b_strides.1 != 1) {
        return Err(Error::Internal(format!(
            "matmul operand strides {:?} and {:?}: one axis of each must be contiguous",
            g.a_strides, g.b_strides
        )));
    }
    let operands = Operands {
        a_strides: g.a_strides,
        b_strides: g.b_strides,
        offsets: (g.offsets.0, g.offsets.1),
        batch_strides: (g.a_bs, g.b_bs),
    };
    if let Some(im) = &g.gather {
        let config = match (
            im.layout,
            mp::gather_kernel(dev.hardware(), g.dtype, forced_config()),
        ) {
            (ImageLayout::ChannelsLast, Some(Config::CoopWide)) => Config::CoopWide,
            _ => Config::Reg,
        };
        return run(dev, g, config);
    }
    let planned = plan(dev, g.dtype, (g.m, g.n, g.k), &operands);
    let flops = 2.0 * (g.m * g.n * g.k * g.batch) as f64;
    let tuner = &super::state(dev)?.tuner;
    if forced_config().is_some() || !autotune::wanted(dev, tuner, flops) {
        return run(dev, g, planned);
    }
    let variants = variants(dev, g.dtype, (g.m, g.n, g.k), &operands, planned);
    if variants.len() < 2 {
        return run(dev, g, planned);
    }
    let key = tune_key(
        g.dtype,
        (g.m, g.n, g.k, g.batch),
        (g.a_strides.1 != 1, g.b_strides.1 != 1),
        g.bias.is_some(),
        g.act,
    );
    let named: Vec<(Config, String)> = variants.iter().map(|&c| (c, format!("{c:?}"))).collect();
    let (config, ran) =
        autotune::choose(dev, tuner, &key, &named, &mut |c| run(dev, g, c).map(drop))?;
    if ran {
        Ok(sums_row_fused(config, g))
    } else {
        run(dev, g, config)
    }
}

/// The shape class a measured choice is kept under.
fn tune_key(
    dtype: DType,
    (m, n, k, batch): (usize, usize, usize, usize),
    (ta, tb): (bool, bool),
    bias: bool,
    act: Act,
) -> String {
    format!(
        "matmul {dtype:?} {m}x{n}x{k} batch {batch} t{}{} bias {} act {}",
        ta as u8, tb as u8, bias as u8, act as u32
    )
}

/// The kernel a single product (no bias, no activation) of these operands runs with on
/// `dev`: [`plan`]'s choice, or the one measured for this shape if the tuner has measured it
/// (or read it from its cache file) already.
pub fn chosen(
    dev: &Device,
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    o: &Operands,
) -> Config {
    let planned = plan(dev, dtype, (m, n, k), o);
    let Ok(state) = super::state(dev) else {
        return planned;
    };
    let key = tune_key(
        dtype,
        (m, n, k, 1),
        (o.a_strides.1 != 1, o.b_strides.1 != 1),
        false,
        Act::None,
    );
    let Some(name) = autotune::lookup(&state.tuner, &key) else {
        return planned;
    };
    variants(dev, dtype, (m, n, k), o, planned)
        .into_iter()
        .find(|c| format!("{c:?}") == name)
        .unwrap_or(planned)
}

/// The kernels that take this product's operands as well as `planned` (the size rules'
/// choice, listed first): the two tensor-core kernels, or the f32 register-tile and 64 x 64
/// tiled kernels (and on CPU adapters, which only `WGRAD_AUTOTUNE=all` measures, those two
/// beside the CPU kernel).
fn variants(
    dev: &Device,
    dtype: DType,
    mnk: (usize, usize, usize),
    o: &Operands,
    planned: Config,
) -> Vec<Config> {
    let tiled = Config::Tiled(64, 64, 16, 4, 4);
    let family: &[Config] = match planned {
        // `wide` is well ahead of `main` and `direct` on every shape measured, so trying them
        // would only cost compiles and never change a choice. They compete where `wide` does
        // not run.
        c if c.wide() => &[
            Config::CoopWide,
            Config::CoopWideTall,
            Config::CoopWideFlat,
            Config::CoopWideMid,
        ],
        Config::CoopTiled | Config::CoopDirect => &[Config::CoopTiled, Config::CoopDirect],
        Config::Reg => &[Config::Reg, tiled],
        c if c == tiled => &[Config::Reg, tiled],
        Config::Simt(..) | Config::SimtN4(..) | Config::SimtK4(..) => &[Config::Reg, tiled],
        _ => &[],
    };
    let mut out = vec![planned];
    for &c in family {
        // What `plan` makes of this kernel for these operands: itself when they suit it.
        let got = forced(c, || plan(dev, dtype, mnk, o)).unwrap_or(planned);
        if got == c && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Whether `config` writes `g.row_sums` with the product: `wide` where op(A) is contiguous
/// along M (RSUM), for one matrix without bias, not gathered.
fn sums_row_fused(config: Config, g: &Gemm<'_>) -> bool {
    g.row_sums.is_some()
        && config.wide()
        && g.a_strides.1 != 1
        && g.a_strides.0 == 1
        && g.batch == 1
        && g.bias.is_none()
        && g.gather.is_none()
}

/// Runs the product with `config`; true where it wrote the row sums.
fn run(dev: &Device, g: &Gemm<'_>, config: Config) -> Result<bool> {
    run_on(dev, g, config, dev.hardware())
}

/// [`run`], its tiles and splits of K planned for `hw` instead of the device's profile (the
/// core count's measurement plans as without a count, so that K is never split).
pub(crate) fn run_on(
    dev: &Device,
    g: &Gemm<'_>,
    config: Config,
    hw: &crate::device::DeviceProfile,
) -> Result<bool> {
    let (sam, sak) = g.a_strides;
    let (sbk, sbn) = g.b_strides;
    let (ta, tb) = (sak != 1, sbn != 1);
    let lda = if ta { sak } else { sam };
    let ldb = if tb { sbn } else { sbk };
    let problem = Problem {
        dtype: g.dtype,
        m: g.m,
        n: g.n,
        k: g.k,
        batch: g.batch,
        operands: Operands {
            a_strides: g.a_strides,
            b_strides: g.b_strides,
            offsets: (g.offsets.0, g.offsets.1),
            batch_strides: (g.a_bs, g.b_bs),
        },
    };
    let mp::Plan {
        tile: (tm, tn),
        kchunk,
        splits,
        ..
    } = mp::launch(&problem, hw, config);
    let via_partials = splits > 1;
    let max_z = dev.caps().max_groups_per_dim as usize;
    if g.batch * splits > max_z {
        return Err(Error::LimitExceeded {
            what: format!("matmul batch {} x {splits} splits of K", g.batch),
            requested: (g.batch * splits) as u64,
            limit_name: "max_compute_workgroups_per_dimension",
            limit: max_z as u64,
        });
    }
    // Strides of op(A)'s (m, k) and op(B)'s (k, n), and which axis is contiguous.
    let (a_kfast, b_nfast) = ((sak == 1) as u32, (sbn == 1) as u32);
    let params = MatmulParams {
        m: g.m as u32,
        n: g.n as u32,
        k: g.k as u32,
        batch: g.batch as u32,
        sam: sam as u32,
        sak: sak as u32,
        sbk: sbk as u32,
        sbn: sbn as u32,
        a_bs: g.a_bs as u32,
        b_bs: g.b_bs as u32,
        a_mod: g.a_mod.max(1) as u32,
        b_mod: g.b_mod.max(1) as u32,
        a_kfast,
        b_nfast,
        act: g.act as u32,
        has_bias: g.bias.is_some() as u32,
        a_off: g.offsets.0 as u32,
        b_off: g.offsets.1 as u32,
        c_off: g.offsets.2 as u32,
        kchunk: kchunk as u32,
        splits: splits as u32,
        raw: via_partials as u32,
        bias_rows: g.bias_rows as u32,
        bias_bs: g.bias_bs as u32,
        ..Default::default()
    };
    let params = match &g.gather {
        Some(gather) => {
            let ok = match gather.layout {
                ImageLayout::Planar => config == Config::Reg,
                ImageLayout::ChannelsLast => {
                    (config == Config::CoopWide && !ta) || config == Config::Reg
                }
            };
            if !ok {
                return Err(Error::Internal(format!(
                    "an implicit convolution's product planned for {config:?}, which does not gather {:?} images",
                    gather.layout
                )));
            }
            let im = &gather.geom;
            let (_, wo) = im.out().unwrap_or((0, 0));
            // Where tap (0, 0) reads at output position (0, 0), and the step between taps;
            // a mirrored window starts at its last tap and steps back.
            let (dh, dw) = (im.dil.0 as i32, im.dil.1 as i32);
            let (mut ph, mut pw) = (-(im.pad.0 as i32), -(im.pad.1 as i32));
            let (dh, dw) = if gather.mirrored {
                ph += dh * (im.kh as i32 - 1);
                pw += dw * (im.kw as i32 - 1);
                (-dh, -dw)
            } else {
                (dh, dw)
            };
            MatmulParams {
                im_h: im.h as u32,
                im_w: im.w as u32,
                im_kk: (im.kh * im.kw) as u32,
                im_kw: im.kw as u32,
                im_sh: im.stride.0 as u32,
                im_sw: im.stride.1 as u32,
                im_ph: ph,
                im_pw: pw,
                im_dh: dh,
                im_dw: dw,
                im_wo: wo as u32,
                ..params
            }
        }
        None => params,
    };
    let rsum = sums_row_fused(config, g);
    let part = if via_partials {
        Some(dev.alloc((splits * g.batch * g.m * g.n * 4) as u64)?)
    } else {
        None
    };
    // The row sums go out through the bias binding (RSUM has no bias); a split's are f32
    // partials in a buffer of their own, which the `splitk` launch sums beside C's.
    let sums_part = match (rsum, splits > 1) {
        (true, true) => Some(dev.alloc((splits * g.m * 4) as u64)?),
        _ => None,
    };
    let (bias, bias_dtype, sum_off) = match (&sums_part, g.row_sums) {
        (Some(b), _) => (b, DType::F32, 0),
        (None, Some((b, off))) if rsum => (b, g.c_dtype, off),
        _ => (g.bias.unwrap_or(g.c), g.dtype, 0),
    };
    let params = MatmulParams {
        sum_off: sum_off as u32,
        ..params
    };
    let (out, out_dtype, p) = match &part {
        Some(b) => (b, DType::F32, MatmulParams { c_off: 0, ..params }),
        None => (g.c, g.c_dtype, params),
    };
    // `wide`'s and `reg`'s RM.
    let reg_rows = tm;
    let groups = [
        g.n.div_ceil(tn) as u32,
        g.m.div_ceil(tm) as u32,
        (g.batch * splits) as u32,
    ];
    let args = [
        arg(g.a, g.dtype),
        arg(g.b, g.dtype),
        arg(bias, bias_dtype),
        arg(out, out_dtype),
    ];
    // The CPU kernels compile the epilogue away when there is nothing to apply; the
    // tensor-core kernels take the whole choice as a constant (common.wgsl `matmul_fused`).
    let epi = (g.bias.is_some() || g.act != Act::None) as u32;
    let fuse = if via_partials {
        0
    } else {
        g.bias.is_some() as u32 + 2 * g.act as u32
    };
    let (kernel, entry, consts): (Kernel, &'static str, Consts) = match config {
        Config::CoopTiled => (
            Kernel::MatmulTc,
            "main",
            smallvec![("TA", ta as u32), ("TB", tb as u32), ("FUSE", fuse)],
        ),
        // (`out_tile` gives the tall tiles RM = 256; only `CoopWide` gathers.)
        Config::CoopWide | Config::CoopWideTall | Config::CoopWideFlat | Config::CoopWideMid => {
            // The epilogue from registers where the driver's layout is known (matmul_wide.wgsl
            // REGS) and outputs go 4 to a store; not for 64-row tiles, whose staged epilogue
            // is a single round and beats registers on the f16 convolutions.
            let regs = reg_rows >= 128
                && p.n % 4 == 0
                && p.c_off % 4 == 0
                && super::coop_layout::quad_rows_for(dev, g.dtype)?;
            (
                Kernel::MatmulWide,
                "main",
                smallvec![
                    ("TA", ta as u32),
                    ("TB", tb as u32),
                    ("FUSE", fuse),
                    ("GATHER", g.gather.is_some() as u32),
                    ("RM", reg_rows as u32),
                    ("RN", tn as u32),
                    ("RSUM", rsum as u32),
                    ("REGS", regs as u32),
                ],
            )
        }
        Config::CoopDirect => (
            Kernel::MatmulTc,
            "direct",
            smallvec![
                ("SAG", lda as u32),
                ("SBG", ldb as u32),
                ("TA", ta as u32),
                ("TB", tb as u32),
                ("FUSE", fuse),
            ],
        ),
        Config::Coop => (Kernel::MatmulCoop, "main", smallvec![]),
        Config::Simt(tm, tn) => (
            Kernel::Matmul,
            "simt",
            smallvec![("TM", tm), ("TN", tn), ("EPI", epi)],
        ),
        Config::SimtN4(tm, tn4) => (
            Kernel::Matmul,
            "simt_n4",
            smallvec![("TM", tm), ("TN4", tn4), ("EPI", epi)],
        ),
        Config::SimtK4(tm, tn) => (
            Kernel::Matmul,
            "simt_k4",
            smallvec![("TM", tm), ("TN", tn), ("EPI", epi)],
        ),
        Config::Tiled(bm, bn, bk, tm, tn) => (
            Kernel::Matmul,
            "main",
            smallvec![("BM", bm), ("BN", bn), ("BK", bk), ("TM", tm), ("TN", tn)],
        ),
        Config::Reg => (
            Kernel::Matmul,
            "reg",
            smallvec![
                ("FUSE", fuse),
                (
                    "GATHER",
                    match g.gather.map(|im| im.layout) {
                        None => 0,
                        Some(ImageLayout::Planar) => 1,
                        Some(ImageLayout::ChannelsLast) => 2,
                    }
                ),
                ("RM", reg_rows as u32),
                ("RN", tn as u32),
            ],
        ),
    };
    launch(
        dev,
        &Launch {
            kernel,
            entry,
            wg: config.wg(),
            consts: &consts,
            params: p,
            args: &args,
            groups,
        },
    )?;
    // A split's partials summed into C with the epilogue, and where the product summed
    // op(A)'s rows (RSUM), those sums' partials into their tensor by the same launch.
    if let Some(part) = &part {
        let (rpart, sums, sum_off, rs) = match (&sums_part, g.row_sums) {
            (Some(rp), Some((sums, off))) => (rp, sums, off, 1),
            // Bound, never read or written.
            _ => (part, g.c, 0, 0),
        };
        launch(
            dev,
            &Launch {
                kernel: Kernel::Matmul,
                entry: "splitk",
                wg: 256,
                consts: &[("RS", rs)],
                params: MatmulParams {
                    raw: 0,
                    sum_off: u32_len("matmul row sums", sum_off)?,
                    ..params
                },
                args: &[
                    arg(part, DType::F32),
                    arg(g.bias.unwrap_or(g.c), g.dtype),
                    arg(g.c, g.c_dtype),
                    arg(rpart, DType::F32),
                    arg(sums, g.c_dtype),
                ],
                groups: grid_1d(g.batch * g.m * g.n + rs as usize * g.m, 256),
            },
        )?;
    }
    Ok(rsum)
}
