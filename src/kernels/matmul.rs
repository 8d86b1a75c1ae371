//! Host side of `shaders/matmul.wgsl` and `shaders/matmul_coop.wgsl`.

//!
//! Loop budget: a product's K is cut into splits of at most [`Config::kchunk`] (what one
//! invocation of that kernel covers within the loop budget); with more than one split each
//! split writes f32 partial products and `splitk` sums them and applies the epilogue. Long
//! contractions (a weight gradient over many rows) also gain parallelism this way.

use super::conv::Geom;
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

/// Workgroups of a product kernel that run at once on a large GPU: two per core of the
/// largest current parts (132 SMs), where `reg`'s and `wide`'s registers hold
/// each core to two.
const SLOTS: usize = 264;

/// The K range per split: the loop budget's `kchunk`, or less on a GPU where splitting K
/// shortens the product by filling the GPU's slots better. Splits write f32 partial products
/// that the `splitk` pass sums, as for long contractions.
///
/// The count of splits is the one with the least estimated time, in waves of `SLOTS`
/// workgroups times each workgroup's K range: a wave that is partly idle costs as much as a
/// full one. Weight gradients have few tiles and long K ([1152 x 16384] x [16384 x 384] is 27
/// tiles of 128 x 128): 9 splits fill one wave, where 10 (the fewest reaching `SLOTS`) ran 6
/// workgroups in a second. A split must save 5% to be taken, since its partials cost memory
/// traffic the estimate leaves out. Products with many tiles split only on `reg` (up to 4):
/// the GPT's 16384 x 384 outputs are 384 tiles, 1.45 waves; in two splits, 2.9, whose fuller
/// waves save more than the partials cost (docs/performance.md, matmul). (On tensor cores
/// such splits lose: their partials are large, and a fused bias and activation move to the
/// `splitk` pass.)
fn occupancy_kchunk(dev: &Device, config: Config, g: &Gemm<'_>, kchunk: usize) -> usize {
    if dev.info().is_cpu() {
        return kchunk;
    }
    let (tm, tn) = out_tile(dev, config, g.m, g.n);
    let tiles = g.m.div_ceil(tm) * g.n.div_ceil(tn) * g.batch;
    // `wide`'s tiles of eight subgroups run one a core.
    let slots = if config.wide() && config.wg() > 128 {
        SLOTS / 2
    } else {
        SLOTS
    };
    split_chunk(tiles, g.k, kchunk, config == Config::Reg, slots)
}

/// A workgroup's output tile: [`Config::tile`], except where M fits in 64 rows, which
/// `wide` and `reg` cover with tiles of 64 rows (a 128-row tile would multiply as many zero
/// rows as real ones): 64 x 128 for `wide`; for `reg` 64 x 256 (matmul.wgsl: the same 8 x 8
/// outputs a thread as at 128 x 128) where its 20 KiB of workgroup memory fit and the tiles
/// pad N by at most an eighth, else 64 x 128. Wider tiles pay where N is long and fits them
/// (a convolution's thousands of positions) and lose where they pad it more (a 3 x 3
/// weight gradient's 576 taps take a third more in 256-wide tiles) (docs/performance.md,
/// convolution).
fn out_tile(dev: &Device, config: Config, m: usize, n: usize) -> (usize, usize) {
    let wide_n = n.next_multiple_of(256) - n <= n / 8;
    match config {
        Config::CoopWide if m <= 64 => (64, 128),
        Config::Reg if m <= 64 => {
            if wide_n && dev.caps().workgroup_storage >= REG64_STORAGE {
                (64, 256)
            } else {
                (64, 128)
            }
        }
        _ => config.tile(),
    }
}

/// Whether `CoopWideTall`'s 256 x 128 tiles pay for an M x N product with many tiles: where
/// they fill at least three waves (they run one a core, `SLOTS / 2` at once): fewer, larger
/// tiles load each operand fewer times, but over fewer waves a last partial wave of large
/// tiles leaves more cores idle than that saves (docs/performance.md, matmul).
fn tall_pays(m: usize, n: usize) -> bool {
    m > 128 && m.div_ceil(256) * n.div_ceil(128) >= 3 * SLOTS / 2
}

/// Where 256 x 128 tiles pay, whether 128 x 256 ones serve better: for A B (op(A) contiguous
/// along K, op(B) along N) with N a multiple of 256 and waves filled as well: a k-fast
/// operand costs more to load than an m-fast one whatever its row pitch, and 128 x 256
/// tiles load half as many rows of A a step as 256 x 128 ones. x W^T, both operands k-fast,
/// loads as many k-fast rows either way and keeps 256 x 128 (docs/performance.md, matmul).
fn flat_pays(m: usize, n: usize, ta: bool, tb: bool) -> bool {
    !ta && !tb
        && n.is_multiple_of(256)
        && eight_fill(m, n, Config::CoopWideFlat) >= eight_fill(m, n, Config::CoopWideTall)
}

/// The eight-subgroup tiling for a weight gradient's few tiles split along a long K (A^T B
/// with op(A) contiguous along M and op(B) along N, K >= 8192, under half a wave of tiles):
/// the one that pads M and N least, by at most an eighth of its area, and on a tie 256 x 128
/// before 128 x 256 before 128 x 192 (whose subgroups multiply 64 x 48, not 64 x 64, per
/// fragment loaded). In this layout both operands load in K steps of 48 or 64, and a large
/// tile that fits the product beats 128 x 128 ones by a wide margin, which padding beyond an
/// eighth gives back. The GPT's gradients: fc2's 384 x 1536 x 16384 would waste a quarter of
/// 256-row tiles and takes 128 x 256; the qkv layer's 1152 x 384 x 16384 (a tenth of 256-row
/// tiles padded) and the attention projection's 384 x 384 x 16384 (a quarter padded either
/// way at 256 wide) take 128 x 192, which pads neither (docs/performance.md, matmul).
fn split_tiling(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Option<Config> {
    if !(ta && !tb && k >= 8192) {
        return None;
    }
    [
        Config::CoopWideTall,
        Config::CoopWideFlat,
        Config::CoopWideMid,
    ]
    .into_iter()
    .filter_map(|c| {
        let (tm, tn) = c.tile();
        let tiles = m.div_ceil(tm) * n.div_ceil(tn);
        let area = tiles * tm * tn;
        (tiles < SLOTS / 2 && (area - m * n) * 8 <= area).then_some((area, c))
    })
    .min_by_key(|&(area, _)| area)
    .map(|(_, c)| c)
}

/// How full `tiles` workgroups keep the waves of `slots` run at once: 1 where they fill
/// their last wave.
fn fill(tiles: usize, slots: usize) -> f64 {
    tiles as f64 / (tiles.div_ceil(slots).max(1) * slots) as f64
}

/// [`fill`] for an M x N product in an eight-subgroup `tiling`'s tiles, which run one a core.
fn eight_fill(m: usize, n: usize, tiling: Config) -> f64 {
    let (tm, tn) = tiling.tile();
    fill(m.div_ceil(tm) * n.div_ceil(tn), SLOTS / 2)
}

/// Whether `CoopWideMid`'s 128 x 192 tiles pay. N must be a multiple of 192. Where 256 x 128
/// tiles pay ([`tall_pays`]), 128 x 192 ones must fill their waves at least as well where an
/// operand is k-fast (`kfast`: A B, x W^T), else better by more than their 64 x 48 subgroup
/// blocks lose to 64 x 64 ones (the 0.94). Elsewhere they must fill them clearly better (by
/// 0.15) than 128 x 128 tiles (two a core), of which there must be a wave or more.
///
/// The GPT's 16384 x 384 outputs make 1.45 waves of 128 x 128 tiles and 1.94 of 128 x 192;
/// its 16384 x 1152 ones 4.4 waves of 256 x 128 and 5.8 of 128 x 192: the fuller waves
/// outweigh the smaller subgroup blocks, and where the fill is equal (16384 x 1536 x 384) a
/// k-fast operand's products still gain from 128 x 192, while A^T B, whose loads cost least,
/// keeps 256 x 128 (docs/performance.md, matmul).
fn mid_pays(m: usize, n: usize, kfast: bool) -> bool {
    let mid = eight_fill(m, n, Config::CoopWideMid);
    let square = m.div_ceil(128) * n.div_ceil(128);
    n.is_multiple_of(192)
        && if tall_pays(m, n) {
            let tall = eight_fill(m, n, Config::CoopWideTall);
            if kfast {
                mid + 0.01 >= tall
            } else {
                0.94 * mid > tall
            }
        } else {
            square >= SLOTS && mid >= fill(square, SLOTS) + 0.15
        }
}

/// `reg`'s workgroup memory at RM = 64: slices of 16 x 64 and 16 x 256 f32.
const REG64_STORAGE: u32 = 16 * (64 + 256) * 4;

/// `occupancy_kchunk` for a product of `tiles` workgroup tiles and `k`.
fn split_chunk(tiles: usize, k: usize, kchunk: usize, reg: bool, slots: usize) -> usize {
    let (most, min_k) = match () {
        _ if tiles == 0 || k == 0 => return kchunk,
        _ if tiles < slots => (2 * slots.div_ceil(tiles), if reg { 256 } else { 512 }),
        _ if reg && tiles < 4 * slots => (4, 256),
        _ => return kchunk,
    };
    let cost = |chunk: usize| (tiles * k.div_ceil(chunk)).div_ceil(slots) * chunk;
    // Unsplit, a workgroup covers all of K (or the loop budget's part of it).
    let mut best = (kchunk, cost(kchunk.min(k)));
    for s in 2..=most {
        // A multiple of 64 keeps every kernel's K step and 16-element alignment whole.
        let chunk = k.div_ceil(s).next_multiple_of(64).min(kchunk);
        if chunk < min_k {
            break;
        }
        let c = cost(chunk);
        if (c as f64) < 0.95 * best.1 as f64 {
            best = (chunk, c);
        }
    }
    best.0
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
pub(crate) struct Gathers {
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
    fn staged_tc(self) -> bool {
        matches!(self, Config::CoopTiled | Config::CoopDirect) || self.wide()
    }

    /// Whether this is one of `wide`'s tilings (matmul_wide.wgsl).
    fn wide(self) -> bool {
        matches!(
            self,
            Config::CoopWide | Config::CoopWideTall | Config::CoopWideFlat | Config::CoopWideMid
        )
    }

    fn wg(self) -> u32 {
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

    fn tile(self) -> (usize, usize) {
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

/// Whether products of `dtype` can run on `dev`'s tensor cores (16x16x16 cooperative
/// matrices over subgroups of exactly 32).
fn tensor_cores(dev: &Device, dtype: DType) -> bool {
    let c = dev.caps();
    dtype == DType::F16
        && c.coop_matrix_16
        && c.f16
        && c.subgroups
        && c.subgroup_min == 32
        && c.subgroup_max == 32
}

/// Whether `dev` has f16 tensor cores, which the split f32 products of
/// `MatmulPrecision::High` run on.
pub(crate) fn f16_tensor_cores(dev: &Device) -> bool {
    tensor_cores(dev, DType::F16)
}

/// The configuration `matmul` picks for these sizes on `dev`.
pub fn choose(dev: &Device, dtype: DType, m: usize, n: usize, k: usize) -> Config {
    let coop_ok = tensor_cores(dev, dtype);
    // `plan` moves products whose operand layouts allow it to the faster tensor-core kernels.
    if coop_ok && m >= 64 && n >= 64 && k >= 16 {
        return Config::Coop;
    }
    // CPU adapters (lavapipe) run workgroup barriers as coroutine switches: the register-tile
    // kernels without workgroup memory ran MNIST's products 4x (scalar) to 12x (4-wide
    // loads) faster than the tiled kernel there.
    if dev.info().is_cpu() {
        return Config::Simt(4, 4);
    }
    // 128 x 128 tiles with 8 x 8 outputs per thread where they are mostly full. (64
    // accumulators in an indexed array spill to local memory; `reg` keeps them in named
    // registers.)
    if m >= 96 && n >= 96 {
        return Config::Reg;
    }
    if m >= 48 && n >= 48 {
        Config::Tiled(64, 64, 16, 4, 4)
    } else {
        Config::Tiled(32, 32, 16, 2, 2)
    }
}

/// Register-tile extent along one axis of the K-vectorised CPU kernel: the largest of
/// `options` (outputs per thread, `per` threads covering one each) whose tiles waste at most
/// an eighth of their threads on `dim`, else the one that wastes least. Larger tiles load
/// less per multiply-add; on lavapipe MNIST's 16 x 9 weight gradient ran 1.9x faster with
/// 2 x 2 than with a 4 x 4 tile (90% of its threads idle).
fn fit(dim: usize, options: &[u32], per: usize) -> u32 {
    let waste = |t: u32| {
        let tile = t as usize * per;
        (dim.div_ceil(tile) * tile - dim) as f64 / (dim.div_ceil(tile) * tile) as f64
    };
    options
        .iter()
        .copied()
        .find(|&t| waste(t) <= 0.125)
        .or_else(|| {
            options
                .iter()
                .copied()
                .min_by(|&a, &b| waste(a).total_cmp(&waste(b)))
        })
        .unwrap_or(1)
}

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

/// The kernel and tiles a product of these sizes and operand layouts runs with on `dev`:
/// `choose` by size, then what the layouts allow (16-byte or 4-element runs).
pub fn plan(dev: &Device, dtype: DType, (m, n, k): (usize, usize, usize), o: &Operands) -> Config {
    let (sam, sak) = o.a_strides;
    let (sbk, sbn) = o.b_strides;
    // op(A) is "transposed" when its columns (k) are the strided axis; likewise op(B).
    let (ta, tb) = (sak != 1, sbn != 1);
    let coop_ok = tensor_cores(dev, dtype);
    let forced = FORCED.with(|c| c.get());
    let mut config = match forced {
        Some(f) if f.staged_tc() && !coop_ok => choose(dev, dtype, m, n, k),
        Some(f) => f,
        None => choose(dev, dtype, m, n, k),
    };
    // Kernels that move runs of 4 elements along each operand's contiguous axis need that
    // axis's extent, the row pitches and every offset to be multiples of 4 (a run is then
    // wholly inside or outside the matrix, and 16-byte aligned for f32). (A row pitch of 0,
    // a broadcast view, goes to the general kernels.)
    let lda = if ta { sak } else { sam };
    let ldb = if tb { sbn } else { sbk };
    let a_run = if ta { m } else { k };
    let b_run = if tb { k } else { n };
    let runs = [
        o.offsets.0,
        o.offsets.1,
        o.batch_strides.0,
        o.batch_strides.1,
        lda,
        ldb,
        a_run,
        b_run,
    ];
    let runs_of_4 = lda > 0 && ldb > 0 && runs.iter().all(|v| v % 4 == 0);
    if config == Config::Reg && !runs_of_4 {
        config = Config::Tiled(64, 64, 16, 4, 4);
    }
    // `direct`'s loads need 16-byte aligned rows and whole 16 x 16 tiles; `main` takes runs
    // of 4 and 48 KiB of workgroup memory.
    let tiled_ok = coop_ok && dev.caps().workgroup_storage >= 49152 && runs_of_4;
    let runs_of_8 = tiled_ok && runs.iter().all(|v| v % 8 == 0);
    let direct_ok = runs_of_8 && [m, n, k].iter().all(|v| v % 16 == 0);
    // `wide` takes runs of 8 and the adapter's passing on wgrad's SPIR-V.
    let wide_ok = runs_of_8 && wide_runs(dev, dtype);
    if config.wide() && !wide_ok {
        config = Config::CoopTiled;
    }
    if (config == Config::CoopTiled && !tiled_ok) || (config == Config::CoopDirect && !direct_ok) {
        config = Config::Coop;
    }
    if config == Config::Coop && tiled_ok {
        // `wide` wherever it runs: it is well ahead of `main` and `direct` in every layout.
        // Without it, `direct` where B is contiguous along N, where it beats `main`, and
        // `main` where B is contiguous along K, where `direct` loses (docs/performance.md,
        // matmul).
        let split = split_tiling(m, n, k, ta, tb).filter(|_| wide_ok && forced.is_none());
        config = if let Some(c) = split {
            c
        } else if wide_ok && forced.is_none() && mid_pays(m, n, !ta || tb) {
            Config::CoopWideMid
        } else if wide_ok && forced.is_none() && tall_pays(m, n) {
            if flat_pays(m, n, ta, tb) {
                Config::CoopWideFlat
            } else {
                Config::CoopWideTall
            }
        } else if wide_ok {
            Config::CoopWide
        } else if !tb && direct_ok {
            Config::CoopDirect
        } else {
            Config::CoopTiled
        };
    }
    if matches!(config, Config::Simt(..)) {
        // 4-element loads need 4-aligned element offsets along the loaded axis.
        let four = |v: &[usize]| v.iter().all(|x| x % 4 == 0);
        if sbn == 1 && four(&[sbk, o.offsets.1, o.batch_strides.1]) {
            // Rows per invocation: the smallest of 2, 4, 8 that covers M in one tile. Two
            // column groups even where a quarter of the tile idles: on lavapipe MNIST's
            // 32 x 196 product ran 1.3x faster with 2 groups of 4 columns than with 1.
            let tm = if m <= 16 {
                2
            } else if m <= 32 {
                4
            } else {
                8
            };
            config = Config::SimtN4(tm, if n >= 64 { 2 } else { 1 });
        } else if sak == 1
            && sbk == 1
            && four(&[
                k,
                sam,
                sbn,
                o.offsets.0,
                o.batch_strides.0,
                o.offsets.1,
                o.batch_strides.1,
            ])
        {
            config = Config::SimtK4(fit(m, &[4, 2, 1], 8), fit(n, &[4, 2, 1], 8));
        }
    }
    config
}

/// Whether a product would run a faster kernel on dense copies of its operands padded to
/// `padded` sizes (op(A) = A^T where `ta`, op(B) = B^T where `tb`) than on its operands `o`
/// as they are (a vocabulary of 65, a view with an odd pitch): the multiple of elements that
/// kernel needs (8 for `wide`, 4 for `reg`), or None.
pub(crate) fn padding_gain(
    dev: &Device,
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    o: &Operands,
    (mq, nq, kq): (usize, usize, usize),
    (ta, tb): (bool, bool),
) -> Option<usize> {
    let dense = Operands::dense(mq, nq, kq, ta, tb);
    let ideal = plan(dev, dtype, (mq, nq, kq), &dense);
    let q = match ideal {
        c if c.wide() => 8,
        Config::Reg => 4,
        _ => return None,
    };
    // `wide`'s tilings are one kernel's.
    let family = |c: Config| if c.wide() { Config::CoopWide } else { c };
    (family(plan(dev, dtype, (m, n, k), o)) != family(ideal)).then_some(q)
}

/// The kernel that gathers implicit convolutions (see [`Gather`]) on `dev` for `dtype`, or
/// None where none does: `wide` where the adapter runs it, else `reg` where it is the GPU
/// kernel (no tensor cores for the dtype, not a CPU adapter); tests force either.
fn gather_kernel(dev: &Device, dtype: DType) -> Option<Config> {
    let wide = wide_runs(dev, dtype);
    match FORCED.with(|c| c.get()) {
        Some(Config::Reg) => Some(Config::Reg),
        Some(Config::CoopWide) if wide => Some(Config::CoopWide),
        Some(_) => None,
        None if wide => Some(Config::CoopWide),
        None if !dev.info().is_cpu() && !tensor_cores(dev, dtype) => Some(Config::Reg),
        None => None,
    }
}

/// How implicit convolutions gather on `dev` for `dtype`, or None where no kernel does:
/// `wide` channels-last images in runs of 8 channels (16 bytes of f16), `reg` channels-last
/// ones in runs of 4 and planar ones. The caller checks the layout's rules.
pub(crate) fn gathers(dev: &Device, dtype: DType) -> Option<Gathers> {
    Some(match gather_kernel(dev, dtype)? {
        Config::Reg => Gathers {
            run: 4,
            planar: true,
        },
        _ => Gathers {
            run: 8,
            planar: false,
        },
    })
}

/// Whether `wide` runs on `dev` for `dtype` (given operands in runs of 8).
fn wide_runs(dev: &Device, dtype: DType) -> bool {
    tensor_cores(dev, dtype) && dev.caps().workgroup_storage >= 49152 && dev.caps().spirv
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
        let config = match (im.layout, gather_kernel(dev, g.dtype)) {
            (ImageLayout::ChannelsLast, Some(Config::CoopWide)) => Config::CoopWide,
            _ => Config::Reg,
        };
        return run(dev, g, config);
    }
    let planned = plan(dev, g.dtype, (g.m, g.n, g.k), &operands);
    let flops = 2.0 * (g.m * g.n * g.k * g.batch) as f64;
    let tuner = &super::state(dev)?.tuner;
    if FORCED.with(|c| c.get()).is_some() || !autotune::wanted(dev, tuner, flops) {
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
    let (sam, sak) = g.a_strides;
    let (sbk, sbn) = g.b_strides;
    let (ta, tb) = (sak != 1, sbn != 1);
    let lda = if ta { sak } else { sam };
    let ldb = if tb { sbn } else { sbk };
    let kchunk = occupancy_kchunk(dev, config, g, config.kchunk());
    let splits = g.k.div_ceil(kchunk).max(1);
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
        raw: (splits > 1) as u32,
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
    let part = if splits > 1 {
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
    let (tm, tn) = out_tile(dev, config, g.m, g.n);
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
    let fuse = if splits > 1 {
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
                && super::coop_layout::quad_rows(dev)?;
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

#[cfg(test)]
mod tests {
    use super::split_chunk;

    fn splits(tiles: usize, k: usize, reg: bool) -> usize {
        k.div_ceil(split_chunk(tiles, k, usize::MAX, reg, super::SLOTS))
    }

    #[test]
    fn tile_shapes_for_the_gpt_products() {
        use super::{Config, flat_pays, mid_pays, split_tiling, tall_pays};
        // Products with K = 384 and many tiles: 256 x 128, unless 128 x 192 ones fill their
        // waves clearly better (5.8 waves against 4.4), or as well where an operand is
        // k-fast (A B, x W^T).
        for kfast in [false, true] {
            assert!(tall_pays(16384, 1152) && mid_pays(16384, 1152, kfast));
            assert!(tall_pays(4096, 4096) && !mid_pays(4096, 4096, kfast));
            // 16384 x 384 outputs: 1.45 waves of 128 x 128 tiles, 1.94 of 128 x 192.
            assert!(!tall_pays(16384, 384));
            assert!(mid_pays(16384, 384, kfast));
            // Whole waves of either, or N not a multiple of 192: 128 x 128 stays.
            assert!(!mid_pays(16384, 768, kfast));
            assert!(!mid_pays(16384, 256, kfast));
            assert!(!mid_pays(256, 384, kfast));
        }
        // Waves as full either way: 128 x 192 where an operand is k-fast.
        assert!(tall_pays(16384, 1536) && !mid_pays(16384, 1536, false));
        assert!(mid_pays(16384, 1536, true));
        // 128 x 192 waves filled less (4096 x 4224: 0.89 against 1): 256 x 128.
        assert!(tall_pays(4096, 4224) && !mid_pays(4096, 4224, true));
        // A B's large products: 128 x 256 where N is a multiple of 256; not other layouts.
        assert!(flat_pays(4096, 4096, false, false) && flat_pays(8192, 8192, false, false));
        assert!(!flat_pays(4096, 4096, false, true) && !flat_pays(4096, 4096, true, false));
        assert!(!flat_pays(4096, 4224, false, false));
        // Weight gradients split along K = 16384: the tiles that pad least.
        let split = |m, n| split_tiling(m, n, 16384, true, false);
        assert_eq!(split(1536, 384), Some(Config::CoopWideTall));
        assert_eq!(split(1152, 384), Some(Config::CoopWideMid));
        assert_eq!(split(384, 1536), Some(Config::CoopWideFlat));
        assert_eq!(split(384, 384), Some(Config::CoopWideMid));
        assert_eq!(split(1152, 256), Some(Config::CoopWideFlat));
        // Other layouts, shorter K, many tiles or more padding: none of them.
        assert_eq!(split_tiling(1152, 384, 16384, false, false), None);
        assert_eq!(split_tiling(1152, 384, 4096, true, false), None);
        assert_eq!(split(8192, 8192), None);
        assert_eq!(split(100, 100), None);
    }

    #[test]
    fn splits_fill_whole_waves() {
        // The GPT's weight gradients: 27 and 36 tiles of K = 16384 fill one wave in 9 and 7
        // splits; the fewest splits reaching 264 workgroups (10 and 8) spill into a second.
        assert_eq!(splits(27, 16384, false), 9);
        assert_eq!(splits(36, 16384, false), 7);
        assert_eq!(splits(36, 16384, true), 7);
        // 256 x 128 tiles run one a core: 15 of them (1152 x 384) fill 132 cores in 8
        // splits, where counted as two a core they would take 16 (two waves).
        assert_eq!(
            16384usize.div_ceil(split_chunk(15, 16384, usize::MAX, false, 132)),
            8
        );
        // A 64-channel convolution's weight gradient (160 tiles, K = 3136 positions): 480
        // workgroups in two waves, where two splits (320) left the second mostly idle.
        assert_eq!(splits(160, 3136, true), 3);
        // `reg`'s 16384 x 384 outputs (384 tiles): two splits for K = 1152 and 1536, none
        // for K = 384, whose halves would be too short.
        assert_eq!(splits(384, 1536, true), 2);
        assert_eq!(splits(384, 1152, true), 2);
        assert_eq!(splits(384, 384, true), 1);
        // Many tiles, or tensor cores with at least a wave of them: no split.
        assert_eq!(splits(384, 1536, false), 1);
        assert_eq!(splits(1152, 384, true), 1);
        assert_eq!(splits(4096, 65536, true), 1);
        // A split never goes below the shortest worth its partials.
        assert_eq!(splits(3, 16384, false), 32);
        assert_eq!(splits(1, 600, false), 1);
        // A split that only adds a wave is not taken: 200 tiles of K = 2048 run one wave of
        // 2048 or two of 1024.
        assert_eq!(splits(200, 2048, false), 1);
        // Nothing to split.
        assert_eq!(splits(0, 100, true), 1);
        assert_eq!(split_chunk(5, 0, 7, true, super::SLOTS), 7);
    }

    #[test]
    fn splits_respect_the_loop_budget() {
        // kchunk below K: at least K / kchunk splits whatever the waves say.
        assert_eq!(
            16384usize.div_ceil(split_chunk(2000, 16384, 4096, false, super::SLOTS)),
            4
        );
        assert!(split_chunk(27, 16384, 1024, false, super::SLOTS) <= 1024);
    }
}
