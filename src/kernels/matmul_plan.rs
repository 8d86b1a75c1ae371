//! Matmul planning: which kernel, tiling, split of K, padding and precision split a product
//! runs with, as pure functions of the product ([`Problem`]) and the hardware
//! ([`DeviceProfile`]): [`plan`] for the kernel and its launch, [`padding_gain`] and
//! [`padding_pays`] for products on padded copies, [`f32_as_three_f16`] for
//! `MatmulPrecision::High`, [`gathers`] for implicit convolutions. Nothing here reads a
//! device; `kernels::matmul` and `ops::matmul` ask these functions with the device's
//! profile, and the unit tests below plan for GPUs this machine does not have.
//!
//! The rules that fill waves of workgroups need the core count; where the profile has none
//! (no report from the driver, no `WGRAD_CORES`, and no step in `kernels::cores`' timing, or
//! before a device's first product settles it) they stand aside: no split of K
//! for occupancy and the plain 128 x 128 `wide` tiles. The constants below were measured on
//! an H100 and an H200 (docs/performance.md, matmul): they are ratios of work, not facts of
//! one GPU.

use super::matmul::{Config, Gathers, Operands};
use crate::device::{DeviceProfile, MatmulPrecision};
use crate::dtype::DType;

/// Workgroups of 128 invocations (`reg`, `wide`'s 128 x 128 tiles, the staged tensor-core
/// kernels) a core holds at once: their registers hold it to two.
const SMALL_PER_CORE: usize = 2;

/// `wide`'s eight-subgroup tilings (256 invocations) run one a core.
pub(crate) const EIGHT_PER_CORE: usize = 1;

/// Workgroups of `config` a core runs at once.
fn per_core(config: Config) -> usize {
    if config.wide() && config.wg() > 128 {
        EIGHT_PER_CORE
    } else {
        SMALL_PER_CORE
    }
}

/// Workgroup memory the staged tensor-core kernels (`main`, `wide`) need, bytes.
const TENSOR_CORE_STORAGE: u32 = 49152;

/// A product to plan: `op(A)` [m, k] times `op(B)` [k, n], `batch` times, operands where
/// [`Operands`] says.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    /// The operands' dtype.
    pub dtype: DType,
    /// Rows of the result.
    pub m: usize,
    /// Columns of the result.
    pub n: usize,
    /// The contraction.
    pub k: usize,
    /// Products in the batch.
    pub batch: usize,
    /// Strides and offsets of the operands.
    pub operands: Operands,
}

impl Problem {
    /// One product of dense row-major operands, op(A) = A^T where `ta`, op(B) = B^T where
    /// `tb`.
    pub fn dense(
        dtype: DType,
        (m, n, k): (usize, usize, usize),
        (ta, tb): (bool, bool),
    ) -> Problem {
        Problem {
            dtype,
            m,
            n,
            k,
            batch: 1,
            operands: Operands::dense(m, n, k, ta, tb),
        }
    }
}

/// How a product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kernel and its tiling.
    pub config: Config,
    /// A workgroup's output tile, rows x columns.
    pub tile: (usize, usize),
    /// The K range a workgroup covers.
    pub kchunk: usize,
    /// Workgroups along K (each writes f32 partial sums where there are several).
    pub splits: usize,
}

/// The kernel ([`config`]) and its launch ([`launch`]) for `p`.
///
/// ```
/// use wgrad::device::DeviceProfile;
/// use wgrad::kernels::matmul::Config;
/// use wgrad::kernels::matmul_plan::{Problem, plan};
/// use wgrad::DType;
///
/// let lavapipe = DeviceProfile {
///     cpu: true, cores: None, subgroups: Some((4, 64)), f16: true, coop_f16_16: false,
///     coop_bf16_16: false, spirv: true, workgroup_storage: 32768,
/// };
/// let p = plan(&Problem::dense(DType::F32, (64, 64, 64), (false, false)), &lavapipe, None);
/// assert!(matches!(p.config, Config::SimtN4(..)));
/// assert_eq!(p.splits, 1);
/// ```
pub fn plan(p: &Problem, hw: &DeviceProfile, forced: Option<Config>) -> Plan {
    launch(p, hw, config(p, hw, forced))
}

/// The tile and split of K `config` runs `p` with (the loop budget's K range, cut further
/// where splits fill the cores' waves better).
pub fn launch(p: &Problem, hw: &DeviceProfile, config: Config) -> Plan {
    let kchunk = kchunk_filling_waves(hw, config, p, config.kchunk());
    Plan {
        config,
        tile: out_tile(hw, config, p.m, p.n),
        kchunk,
        splits: p.k.div_ceil(kchunk).max(1),
    }
}

/// Whether the padded product's work outweighs the `copied` elements for the kernel that
/// needs runs of `q` ([`padding_gain`]), in multiply-adds an element copied: at least 32 for
/// `wide` (q = 8), which runs several times faster than the general kernels, so a copy pays
/// early, and 512 for `reg`, which gains 2x at best: an f32 product at 375 multiply-adds a
/// copied element ran slower padded, one at about 700 twice as fast (docs/performance.md,
/// matmul).
pub fn padding_pays(
    (m, n, kq): (usize, usize, usize),
    batch: usize,
    q: usize,
    copied: usize,
) -> bool {
    let macs = m.saturating_mul(n).saturating_mul(kq);
    let ratio = if q == 8 { 32 } else { 512 };
    batch > 0 && macs >= ratio * copied
}

/// The multiply-adds from which a split f32 product pays for its extra passes (the operands'
/// scales and parts, the final scaling): below about 2^32 those passes cost more than the
/// tensor cores save against `reg`, above it the split wins by a growing margin
/// (docs/performance.md, matmul).
const MIN_SPLIT_MACS: usize = 1 << 32;

/// Whether an f32 product runs as three f16 products: `MatmulPrecision::High` on hardware
/// with f16 tensor cores, for products big enough that the extra passes cost less than they
/// save.
pub fn f32_as_three_f16(p: &Problem, precision: MatmulPrecision, hw: &DeviceProfile) -> bool {
    let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
    precision == MatmulPrecision::High
        && hw.tensor_cores(DType::F16)
        && m >= 64
        && n >= 64
        && k >= 64
        && m.saturating_mul(n).saturating_mul(k).saturating_mul(batch) >= MIN_SPLIT_MACS
}

/// The K range per split: the loop budget's `kchunk`, or less on a GPU where splitting K
/// shortens the product by filling the GPU's slots better. Splits write f32 partial products
/// that the `splitk` pass sums, as for long contractions.
///
/// The count of splits is the one with the least estimated time, in waves of the slots' workgroups
/// times each workgroup's K range: a wave that is partly idle costs as much as a full one. Weight
/// gradients have few tiles and long K ([1152 x 16384] x [16384 x 384] is 27 tiles of 128 x 128): 9
/// splits fill one wave, where 10 (the fewest reaching an H100's 264 slots) ran 6 workgroups in a
/// second. A split must save 5% to be taken, since its partials cost memory traffic the estimate
/// leaves out. Products with many tiles split only on `reg` (up to 4): the GPT's 16384 x 384
/// outputs are 384 tiles, 1.45 waves; in two splits, 2.9, whose fuller waves save more than the
/// partials cost (docs/performance.md, matmul). (On tensor cores such splits lose: their partials
/// are large, and a fused bias and activation move to the `splitk` pass.)
///
/// Without the core count (and on CPU adapters) K splits only where the loop budget cuts it.
fn kchunk_filling_waves(hw: &DeviceProfile, config: Config, p: &Problem, kchunk: usize) -> usize {
    let Some(slots) = hw.slots(per_core(config)).filter(|_| !hw.cpu) else {
        return kchunk;
    };
    let (tm, tn) = out_tile(hw, config, p.m, p.n);
    let tiles = p.m.div_ceil(tm) * p.n.div_ceil(tn) * p.batch;
    split_chunk(tiles, p.k, kchunk, config == Config::Reg, slots)
}

/// A workgroup's output tile: [`Config::tile`], except where M fits in 64 rows, which
/// `wide` and `reg` cover with tiles of 64 rows (a 128-row tile would multiply as many zero
/// rows as real ones): 64 x 128 for `wide`; for `reg` 64 x 256 (matmul.wgsl: the same 8 x 8
/// outputs a thread as at 128 x 128) where its 20 KiB of workgroup memory fit and the tiles
/// pad N by at most an eighth, else 64 x 128. Wider tiles pay where N is long and fits them
/// (a convolution's thousands of positions) and lose where they pad it more (a 3 x 3
/// weight gradient's 576 taps take a third more in 256-wide tiles) (docs/performance.md,
/// convolution).
pub(crate) fn out_tile(hw: &DeviceProfile, config: Config, m: usize, n: usize) -> (usize, usize) {
    let wide_n = n.next_multiple_of(256) - n <= n / 8;
    match config {
        Config::CoopWide if m <= 64 => (64, 128),
        Config::Reg if m <= 64 => {
            if wide_n && hw.workgroup_storage >= REG64_STORAGE {
                (64, 256)
            } else {
                (64, 128)
            }
        }
        _ => config.tile(),
    }
}

/// Whether `CoopWideTall`'s 256 x 128 tiles pay for an M x N product with many tiles: where
/// they fill at least three waves (they run one a core): fewer, larger
/// tiles load each operand fewer times, but over fewer waves a last partial wave of large
/// tiles leaves more cores idle than that saves (docs/performance.md, matmul).
fn tall_tiles_fill_three_waves(m: usize, n: usize, cores: usize) -> bool {
    m > 128 && m.div_ceil(256) * n.div_ceil(128) >= 3 * cores
}

/// Where 256 x 128 tiles pay, whether 128 x 256 ones serve better: for A B (op(A) contiguous
/// along K, op(B) along N) with N a multiple of 256 and waves filled as well: a k-fast
/// operand costs more to load than an m-fast one whatever its row pitch, and 128 x 256
/// tiles load half as many rows of A a step as 256 x 128 ones. x W^T, both operands k-fast,
/// loads as many k-fast rows either way and keeps 256 x 128 (docs/performance.md, matmul).
fn flat_tiles_load_less(m: usize, n: usize, (ta, tb): (bool, bool), cores: usize) -> bool {
    !ta && !tb
        && n.is_multiple_of(256)
        && eight_fill(m, n, Config::CoopWideFlat, cores)
            >= eight_fill(m, n, Config::CoopWideTall, cores)
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
fn long_k_tiling(
    (m, n, k): (usize, usize, usize),
    (ta, tb): (bool, bool),
    cores: usize,
) -> Option<Config> {
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
        (tiles < cores && (area - m * n) * 8 <= area).then_some((area, c))
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
fn eight_fill(m: usize, n: usize, tiling: Config, cores: usize) -> f64 {
    let (tm, tn) = tiling.tile();
    fill(m.div_ceil(tm) * n.div_ceil(tn), cores)
}

/// Whether `CoopWideMid`'s 128 x 192 tiles pay. N must be a multiple of 192. Where 256 x 128 tiles
/// pay ([`tall_tiles_fill_three_waves`]), 128 x 192 ones must fill their waves at least as well
/// where an operand is k-fast (`kfast`: A B, x W^T), else better by more than their 64 x 48
/// subgroup blocks lose to 64 x 64 ones (the 0.94). Elsewhere they must fill them clearly better
/// (by 0.15) than 128 x 128 tiles (two a core), of which there must be a wave or more.
///
/// The GPT's 16384 x 384 outputs make 1.45 waves of 128 x 128 tiles and 1.94 of 128 x 192;
/// its 16384 x 1152 ones 4.4 waves of 256 x 128 and 5.8 of 128 x 192: the fuller waves
/// outweigh the smaller subgroup blocks, and where the fill is equal (16384 x 1536 x 384) a
/// k-fast operand's products still gain from 128 x 192, while A^T B, whose loads cost least,
/// keeps 256 x 128 (docs/performance.md, matmul).
fn mid_tiles_fill_better(m: usize, n: usize, kfast: bool, cores: usize) -> bool {
    let mid = eight_fill(m, n, Config::CoopWideMid, cores);
    let square = m.div_ceil(128) * n.div_ceil(128);
    let slots = SMALL_PER_CORE * cores;
    n.is_multiple_of(192)
        && if tall_tiles_fill_three_waves(m, n, cores) {
            let tall = eight_fill(m, n, Config::CoopWideTall, cores);
            if kfast {
                mid + 0.01 >= tall
            } else {
                0.94 * mid > tall
            }
        } else {
            square >= slots && mid >= fill(square, slots) + 0.15
        }
}

/// `reg`'s workgroup memory at RM = 64: slices of 16 x 64 and 16 x 256 f32.
const REG64_STORAGE: u32 = 16 * (64 + 256) * 4;

/// [`kchunk_filling_waves`] for a product of `tiles` workgroup tiles and `k`, `slots` of which
/// run at once.
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

/// The kernel for these sizes before the operands' layouts are looked at.
fn choose(hw: &DeviceProfile, dtype: DType, m: usize, n: usize, k: usize) -> Config {
    let coop_ok = hw.tensor_cores(dtype);
    // `plan` moves products whose operand layouts allow it to the faster tensor-core kernels.
    if coop_ok && m >= 64 && n >= 64 && k >= 16 {
        return Config::Coop;
    }
    general(hw, m, n)
}

/// The kernel for an M x N product without tensor cores.
fn general(hw: &DeviceProfile, m: usize, n: usize) -> Config {
    // CPU adapters (lavapipe) run workgroup barriers as coroutine switches: the register-tile
    // kernels without workgroup memory ran MNIST's products 4x (scalar) to 12x (4-wide
    // loads) faster than the tiled kernel there.
    if hw.cpu {
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

/// The kernel and tiling a product runs with: `choose` by size, then what the operands'
/// layouts allow (16-byte or 4-element runs), then the tiling that fills the cores' waves.
/// `forced` stands for the size rules' choice (see `kernels::matmul::forced`).
pub fn config(p: &Problem, hw: &DeviceProfile, forced: Option<Config>) -> Config {
    let (dtype, m, n, k, o) = (p.dtype, p.m, p.n, p.k, &p.operands);
    let (sam, sak) = o.a_strides;
    let (sbk, sbn) = o.b_strides;
    // op(A) is "transposed" when its columns (k) are the strided axis; likewise op(B).
    let (ta, tb) = (sak != 1, sbn != 1);
    let coop_ok = hw.tensor_cores(dtype);
    let mut config = match forced {
        Some(f) if f.staged_tc() && !coop_ok => choose(hw, dtype, m, n, k),
        Some(f) => f,
        None => choose(hw, dtype, m, n, k),
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
    let tiled_ok = coop_ok && hw.workgroup_storage >= TENSOR_CORE_STORAGE && runs_of_4;
    let runs_of_8 = tiled_ok && runs.iter().all(|v| v % 8 == 0);
    let direct_ok = runs_of_8 && [m, n, k].iter().all(|v| v % 16 == 0);
    // `wide` takes runs of 8 and the adapter's passing on wgrad's SPIR-V.
    let wide_ok = runs_of_8 && wide_runs(hw, dtype);
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
        // The tilings chosen by how they fill the cores' waves need the core count.
        let cores = hw.cores.filter(|_| wide_ok && forced.is_none());
        let split = cores.and_then(|c| long_k_tiling((m, n, k), (ta, tb), c));
        config = if let Some(c) = split {
            c
        } else if cores.is_some_and(|c| mid_tiles_fill_better(m, n, !ta || tb, c)) {
            Config::CoopWideMid
        } else if let Some(c) = cores.filter(|&c| tall_tiles_fill_three_waves(m, n, c)) {
            if flat_tiles_load_less(m, n, (ta, tb), c) {
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
    // Only `wide` (wgrad's SPIR-V) multiplies bf16 matrices: the other tensor-core kernels
    // are WGSL, which has no bf16 type.
    if dtype != DType::F16 && !config.wide() && (config.staged_tc() || config == Config::Coop) {
        config = general(hw, m, n);
        if config == Config::Reg && !runs_of_4 {
            config = Config::Tiled(64, 64, 16, 4, 4);
        }
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
pub fn padding_gain(
    p: &Problem,
    hw: &DeviceProfile,
    forced: Option<Config>,
    (mq, nq, kq): (usize, usize, usize),
    (ta, tb): (bool, bool),
) -> Option<usize> {
    let padded = Problem::dense(p.dtype, (mq, nq, kq), (ta, tb));
    let ideal = config(&padded, hw, forced);
    let q = match ideal {
        c if c.wide() => 8,
        Config::Reg => 4,
        _ => return None,
    };
    // `wide`'s tilings are one kernel's.
    let family = |c: Config| if c.wide() { Config::CoopWide } else { c };
    (family(config(p, hw, forced)) != family(ideal)).then_some(q)
}

/// The kernel that gathers implicit convolutions (see [`Gather`](super::matmul::Gather)) for
/// `dtype`, or None where none does: `wide` where the adapter runs it, else `reg` where it is the
/// GPU kernel (no tensor cores for the dtype, not a CPU adapter); tests force either.
pub fn gather_kernel(hw: &DeviceProfile, dtype: DType, forced: Option<Config>) -> Option<Config> {
    let wide = wide_runs(hw, dtype);
    match forced {
        Some(Config::Reg) => Some(Config::Reg),
        Some(Config::CoopWide) if wide => Some(Config::CoopWide),
        Some(_) => None,
        None if wide => Some(Config::CoopWide),
        None if !hw.cpu && !hw.tensor_cores(dtype) => Some(Config::Reg),
        None => None,
    }
}

/// How implicit convolutions gather for `dtype`, or None where no kernel does:
/// `wide` channels-last images in runs of 8 channels (16 bytes of f16), `reg` channels-last
/// ones in runs of 4 and planar ones. The caller checks the layout's rules.
pub fn gathers(hw: &DeviceProfile, dtype: DType, forced: Option<Config>) -> Option<Gathers> {
    Some(match gather_kernel(hw, dtype, forced)? {
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

/// Whether `wide` runs for `dtype` (given operands in runs of 8).
pub(crate) fn wide_runs(hw: &DeviceProfile, dtype: DType) -> bool {
    hw.tensor_cores(dtype) && hw.workgroup_storage >= TENSOR_CORE_STORAGE && hw.spirv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::Config;

    /// Workgroups of 128 invocations an H100 or H200 (132 SMs) runs at once.
    const H100_SLOTS: usize = 264;

    fn splits(tiles: usize, k: usize, reg: bool) -> usize {
        k.div_ceil(split_chunk(tiles, k, usize::MAX, reg, H100_SLOTS))
    }

    #[test]
    fn tile_shapes_for_the_gpt_products() {
        // An H100's or H200's 132 SMs.
        let tall = |m, n| tall_tiles_fill_three_waves(m, n, 132);
        let mid = |m, n, kfast| mid_tiles_fill_better(m, n, kfast, 132);
        let flat = |m, n, ta, tb| flat_tiles_load_less(m, n, (ta, tb), 132);
        let long_k = |m, n, k, ta, tb| long_k_tiling((m, n, k), (ta, tb), 132);
        // Products with K = 384 and many tiles: 256 x 128, unless 128 x 192 ones fill their
        // waves clearly better (5.8 waves against 4.4), or as well where an operand is
        // k-fast (A B, x W^T).
        for kfast in [false, true] {
            assert!(tall(16384, 1152) && mid(16384, 1152, kfast));
            assert!(tall(4096, 4096) && !mid(4096, 4096, kfast));
            // 16384 x 384 outputs: 1.45 waves of 128 x 128 tiles, 1.94 of 128 x 192.
            assert!(!tall(16384, 384));
            assert!(mid(16384, 384, kfast));
            // Whole waves of either, or N not a multiple of 192: 128 x 128 stays.
            assert!(!mid(16384, 768, kfast));
            assert!(!mid(16384, 256, kfast));
            assert!(!mid(256, 384, kfast));
        }
        // Waves as full either way: 128 x 192 where an operand is k-fast.
        assert!(tall(16384, 1536) && !mid(16384, 1536, false));
        assert!(mid(16384, 1536, true));
        // 128 x 192 waves filled less (4096 x 4224: 0.89 against 1): 256 x 128.
        assert!(tall(4096, 4224) && !mid(4096, 4224, true));
        // A B's large products: 128 x 256 where N is a multiple of 256; not other layouts.
        assert!(flat(4096, 4096, false, false) && flat(8192, 8192, false, false));
        assert!(!flat(4096, 4096, false, true) && !flat(4096, 4096, true, false));
        assert!(!flat(4096, 4224, false, false));
        // Weight gradients split along K = 16384: the tiles that pad least.
        let split = |m, n| long_k(m, n, 16384, true, false);
        assert_eq!(split(1536, 384), Some(Config::CoopWideTall));
        assert_eq!(split(1152, 384), Some(Config::CoopWideMid));
        assert_eq!(split(384, 1536), Some(Config::CoopWideFlat));
        assert_eq!(split(384, 384), Some(Config::CoopWideMid));
        assert_eq!(split(1152, 256), Some(Config::CoopWideFlat));
        // Other layouts, shorter K, many tiles or more padding: none of them.
        assert_eq!(long_k(1152, 384, 16384, false, false), None);
        assert_eq!(long_k(1152, 384, 4096, true, false), None);
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
        assert_eq!(split_chunk(5, 0, 7, true, H100_SLOTS), 7);
    }

    #[test]
    fn splits_respect_the_loop_budget() {
        // kchunk below K: at least K / kchunk splits whatever the waves say.
        assert_eq!(
            16384usize.div_ceil(split_chunk(2000, 16384, 4096, false, H100_SLOTS)),
            4
        );
        assert!(split_chunk(27, 16384, 1024, false, H100_SLOTS) <= 1024);
    }

    /// Profiles of five kinds of adapter, as their drivers report them through Vulkan (or
    /// Metal, for the Apple-like one).
    fn profiles() -> [(&'static str, DeviceProfile); 5] {
        let gpu = |cores, subgroups, coop, spirv| DeviceProfile {
            cpu: false,
            cores,
            subgroups: Some(subgroups),
            f16: true,
            coop_f16_16: coop,
            coop_bf16_16: coop,
            spirv,
            workgroup_storage: 49152,
        };
        [
            ("H100", gpu(Some(132), (32, 32), true, true)),
            ("RTX 4090-like", gpu(Some(128), (32, 32), true, true)),
            // RDNA3 reports cooperative matrices, but over subgroups of 32 to 64: wgrad's
            // tensor-core kernels are written for subgroups of exactly 32.
            ("RDNA3-like", gpu(Some(48), (32, 64), true, true)),
            (
                "Apple-like",
                DeviceProfile {
                    workgroup_storage: 32768,
                    ..gpu(None, (32, 32), false, false)
                },
            ),
            (
                "lavapipe",
                DeviceProfile {
                    cpu: true,
                    cores: None,
                    subgroups: Some((4, 64)),
                    f16: true,
                    coop_f16_16: false,
                    coop_bf16_16: false,
                    spirv: true,
                    workgroup_storage: 32768,
                },
            ),
        ]
    }

    fn planned(
        hw: &DeviceProfile,
        dtype: DType,
        mnk: (usize, usize, usize),
        t: (bool, bool),
    ) -> Plan {
        plan(&Problem::dense(dtype, mnk, t), hw, None)
    }

    /// The GPT's products (16384 rows, widths 384, 1152 and 1536) and a square one, on each
    /// profile: the tensor-core tilings where the cores and subgroups allow, sized to the
    /// core count; `reg` and the tiled kernel on GPUs without them; the CPU kernels on
    /// lavapipe; no split of K for occupancy where the core count is unknown.
    #[test]
    fn plans_on_five_device_profiles() {
        use Config::*;
        let [h100, rtx, rdna, apple, lavapipe] = profiles().map(|(_, p)| p);
        let f16 = DType::F16;
        let (nn, tn, nt) = ((false, false), (true, false), (false, true));
        // H100: the GPT's rules as measured.
        for (mnk, layout, want) in [
            ((16384, 1152, 384), nt, CoopWideMid),
            ((16384, 384, 1152), nn, CoopWideMid),
            ((4096, 4096, 4096), nn, CoopWideFlat),
            ((4096, 4096, 4096), nt, CoopWideTall),
            ((1152, 384, 16384), tn, CoopWideMid),
        ] {
            assert_eq!(
                planned(&h100, f16, mnk, layout).config,
                want,
                "{mnk:?} {layout:?}"
            );
        }
        // The attention projection's weight gradient: 6 tiles of 128 x 192, 22 splits of K
        // fill the 132 cores once.
        let wgrad = planned(&h100, f16, (384, 384, 16384), tn);
        assert_eq!((wgrad.config, wgrad.splits), (CoopWideMid, 22));
        // RTX 4090-like, 128 SMs: the same kernels, waves counted on 128 cores. 6144 x 2048
        // outputs are 24 x 16 = 384 tiles of 256 x 128: three waves of 128 cores, short of
        // three of 132.
        assert_eq!(
            planned(&rtx, f16, (6144, 2048, 1024), nt).config,
            CoopWideTall
        );
        assert_eq!(planned(&h100, f16, (6144, 2048, 1024), nt).config, CoopWide);
        // 66 tiles of 128 x 128 (two a core) with K = 6144: on 132 cores four splits make
        // 264 workgroups, one wave; on 128 that is two waves, and seven splits of 896 (462
        // workgroups, two waves of 256 nearly full) take less time.
        let split = |hw| planned(hw, f16, (768, 1408, 6144), tn);
        assert_eq!((split(&h100).config, split(&h100).splits), (CoopWide, 4));
        assert_eq!((split(&rtx).config, split(&rtx).splits), (CoopWide, 7));
        // RDNA3-like: no tensor-core kernel for subgroups of 32 to 64: `reg` for f16 and f32,
        // its K split to fill 96 slots where there are few tiles.
        for dtype in [DType::F16, DType::F32] {
            assert_eq!(planned(&rdna, dtype, (4096, 4096, 4096), nn).config, Reg);
        }
        let few = planned(&rdna, DType::F32, (256, 256, 16384), tn);
        assert_eq!(few.config, Reg);
        assert!(few.splits > 1, "{few:?}");
        // Apple-like: no cooperative matrices, no core count: `reg`, never split for waves.
        let p = planned(&apple, f16, (4096, 4096, 4096), nn);
        assert_eq!((p.config, p.splits), (Reg, 1));
        let p = planned(&apple, DType::F32, (256, 256, 16384), tn);
        assert_eq!(p.splits, 16384usize.div_ceil(p.config.kchunk()));
        assert_eq!(
            planned(&apple, DType::F32, (64, 64, 64), nn).config,
            Tiled(64, 64, 16, 4, 4)
        );
        // lavapipe: the CPU kernels, 4-wide along N or K as the layout allows.
        assert!(matches!(
            planned(&lavapipe, DType::F32, (64, 64, 64), nn).config,
            SimtN4(..)
        ));
        assert!(matches!(
            planned(&lavapipe, DType::F32, (64, 64, 64), nt).config,
            SimtK4(..)
        ));
        assert_eq!(
            planned(&lavapipe, DType::F32, (64, 64, 16384), tn).splits,
            16384usize.div_ceil(Config::Simt(4, 4).kchunk()).max(1)
        );
        // Without the core count a tensor-core GPU keeps 128 x 128 `wide` tiles and its
        // loop budget's K range.
        let unknown = DeviceProfile {
            cores: None,
            ..h100.clone()
        };
        let p = planned(&unknown, f16, (384, 384, 16384), tn);
        assert_eq!(p.config, CoopWide);
        assert_eq!(p.splits, 16384usize.div_ceil(CoopWide.kchunk()));
    }

    /// bf16 products take `wide`'s tilings wherever f16 ones do (the same kernel, its
    /// operand matrices bf16), and `reg` or the tiled kernel where `wide` cannot run: the
    /// other tensor-core kernels are WGSL, which has no bf16. Without bf16 cooperative
    /// matrices (a driver without VK_KHR_shader_bfloat16, `WGRAD_DISABLE=bf16_coop`) they
    /// all run on `reg`.
    #[test]
    fn bf16_products_plan_like_f16_on_wide_only() {
        use Config::*;
        let [h100, ..] = profiles().map(|(_, p)| p);
        let (f16, bf16) = (DType::F16, DType::BF16);
        let (nn, tn, nt) = ((false, false), (true, false), (false, true));
        for (mnk, layout) in [
            ((16384, 1152, 384), nt),
            ((16384, 384, 1152), nn),
            ((4096, 4096, 4096), nn),
            ((1152, 384, 16384), tn),
            ((384, 384, 16384), tn),
            ((64, 4096, 256), nn),
        ] {
            let want = planned(&h100, f16, mnk, layout);
            assert!(want.config.wide(), "{mnk:?}");
            assert_eq!(
                planned(&h100, bf16, mnk, layout),
                want,
                "{mnk:?} {layout:?}"
            );
        }
        // Runs of 4, not 8 (a row pitch of 4100): `main` for f16, `reg` for bf16.
        let mut odd = Problem::dense(bf16, (4096, 4100, 4096), nn);
        assert_eq!(plan(&odd, &h100, None).config, Reg);
        odd.dtype = f16;
        assert_eq!(plan(&odd, &h100, None).config, CoopTiled);
        // Runs of 1: the tiled kernel for bf16, `Coop` for f16.
        let mut one = Problem::dense(bf16, (4096, 4097, 4096), nn);
        assert_eq!(plan(&one, &h100, None).config, Tiled(64, 64, 16, 4, 4));
        one.dtype = f16;
        assert_eq!(plan(&one, &h100, None).config, Coop);
        // Forcing a WGSL tensor-core kernel leaves bf16 on the general ones.
        let dense = Problem::dense(bf16, (4096, 4096, 4096), nn);
        assert_eq!(plan(&dense, &h100, Some(CoopTiled)).config, Reg);
        assert_eq!(plan(&dense, &h100, Some(CoopWide)).config, CoopWide);
        // Padding to runs of 8 pays for bf16 as for f16.
        odd.dtype = bf16;
        assert_eq!(
            padding_gain(&odd, &h100, None, (4096, 4104, 4096), nn),
            Some(8)
        );
        let no_bf16 = DeviceProfile {
            coop_bf16_16: false,
            ..h100.clone()
        };
        assert!(!no_bf16.tensor_cores(bf16) && no_bf16.tensor_cores(f16));
        assert_eq!(planned(&no_bf16, bf16, (4096, 4096, 4096), nn).config, Reg);
        // bf16 matrices need wgrad's SPIR-V.
        let no_spirv = DeviceProfile {
            spirv: false,
            ..h100.clone()
        };
        assert!(!no_spirv.tensor_cores(bf16));
        // and native 16-bit storage, which bf16 outputs are stored as.
        let no_f16 = DeviceProfile {
            f16: false,
            ..h100.clone()
        };
        assert!(!no_f16.tensor_cores(bf16));
    }

    /// Padding and the f32 split read the profile too: `wide` pads to runs of 8 where it
    /// runs, `reg` to runs of 4 elsewhere on GPUs, nothing on a CPU adapter; the split needs
    /// f16 tensor cores.
    #[test]
    fn padding_and_precision_split_by_profile() {
        let [h100, _, rdna, _, lavapipe] = profiles().map(|(_, p)| p);
        // A B with N = 4097, B's rows contiguous along N: no run of 8 (or 4) along them.
        let nn = (false, false);
        let odd = Problem::dense(DType::F16, (4096, 4097, 4096), nn);
        assert_eq!(
            padding_gain(&odd, &h100, None, (4096, 4104, 4096), nn),
            Some(8)
        );
        // x W^T with N = 4097: N is not a run of either operand, nothing to gain.
        let xw = Problem::dense(DType::F16, (4096, 4097, 4096), (false, true));
        let same = (4096, 4097, 4096);
        assert_eq!(padding_gain(&xw, &h100, None, same, (false, true)), None);
        let odd32 = Problem {
            dtype: DType::F32,
            ..odd
        };
        let sizes = (4096, 4100, 4096);
        assert_eq!(padding_gain(&odd32, &rdna, None, sizes, nn), Some(4));
        assert_eq!(padding_gain(&odd32, &lavapipe, None, sizes, nn), None);
        assert!(padding_pays((4096, 4097, 4096), 1, 8, 3 * 4096 * 4104));
        assert!(!padding_pays((64, 65, 64), 1, 4, 3 * 64 * 68));
        let big = Problem::dense(DType::F32, (4096, 4096, 4096), (false, false));
        assert!(f32_as_three_f16(&big, MatmulPrecision::High, &h100));
        assert!(!f32_as_three_f16(&big, MatmulPrecision::Highest, &h100));
        assert!(!f32_as_three_f16(&big, MatmulPrecision::High, &rdna));
    }
}
