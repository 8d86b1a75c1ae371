//! Host side of `shaders/attention.wgsl` and `shaders/attention_coop.wgsl`.
//!
//! Loop budget: a forward or dQ invocation walks key blocks and a dK/dV invocation walks query
//! blocks; each block costs a fixed number of loop iterations (the shader header gives the
//! counts). Sequences longer than the budget allows are cut into chunks that run as
//! consecutive dispatches carrying their running state (softmax max and sum, accumulators) in
//! an f32 scratch block.

use super::{Arg, Consts, Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 128;
/// Largest head dimension supported.
pub const MAX_HEAD_DIM: usize = 256;
/// Longest key sequence the tensor-core forward takes (its two passes over the keys stay in
/// the loop budget up to here).
const COOP_MAX_KEYS: usize = 4096;

crate::params! {
    /// `struct Params` of attention.wgsl and attention_coop.wgsl.
    pub struct AttnParams {
        bh: u32,
        sq: u32,
        skv: u32,
        d: u32,
        scale: f32,
        causal: u32,
        ninf: f32,
        first: u32,
        last: u32,
        c0: u32,
        c1: u32,
        heads: u32,
        q_off: u32,
        q_sb: u32,
        q_sh: u32,
        q_ss: u32,
        k_off: u32,
        k_sb: u32,
        k_sh: u32,
        k_ss: u32,
        v_off: u32,
        v_sb: u32,
        v_sh: u32,
        v_ss: u32,
        o_off: u32,
        o_sb: u32,
        o_sh: u32,
        o_ss: u32,
        g_off: u32,
        g_sb: u32,
        g_sh: u32,
        g_ss: u32,
        // Where the gradients dq, dk, dv go (the same four words each as q's).
        dq_off: u32,
        dq_sb: u32,
        dq_sh: u32,
        dq_ss: u32,
        dk_off: u32,
        dk_sb: u32,
        dk_sh: u32,
        dk_ss: u32,
        dv_off: u32,
        dv_sb: u32,
        dv_sh: u32,
        dv_ss: u32,
        // Dropout on the attention weights: an entry is dropped when its hash is below
        // drop_thr (0: no dropout); kept entries are scaled by drop_scale = 1 / (1 - p).
        drop_thr: u32,
        drop_scale: f32,
        seed_lo: u32,
        seed_hi: u32,
        // Query heads per key/value head (grouped-query attention; 1 for plain multi-head):
        // query head h reads key/value head h / group.
        group: u32,
    }
}

/// Where a [batch, heads, seq, dim] operand's elements sit: element (b, h, s, c) at
/// off + b sb + h sh + s ss + c (the head dimension contiguous).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HeadLayout {
    pub off: usize,
    pub sb: usize,
    pub sh: usize,
    pub ss: usize,
}

impl HeadLayout {
    /// The dense layout of `heads` x `seq` x `d` per batch element.
    pub fn dense(heads: usize, seq: usize, d: usize) -> HeadLayout {
        HeadLayout {
            off: 0,
            sb: heads * seq * d,
            sh: seq * d,
            ss: d,
        }
    }

    /// Whether the tensor-core kernels can read this operand in place: cooperative loads
    /// need 16-byte aligned rows, so the offset and every stride a multiple of 8 halves.
    pub fn coop_aligned(&self) -> bool {
        self.aligned(8)
    }

    /// Whether the offset and every stride are multiples of `n` elements.
    fn aligned(&self, n: usize) -> bool {
        [self.off, self.sb, self.sh, self.ss]
            .iter()
            .all(|x| x.is_multiple_of(n))
    }

    fn words(&self) -> Result<[u32; 4]> {
        let w = |v: usize| u32_len("attention layout", v);
        Ok([w(self.off)?, w(self.sb)?, w(self.sh)?, w(self.ss)?])
    }
}

/// Problem sizes of one attention call, and the layouts of q, k, v, o and the output
/// gradient (`g`, unused by the forward pass).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub bh: usize,
    pub heads: usize,
    /// Query heads per key/value head: k and v have `heads / group` heads.
    pub group: usize,
    pub sq: usize,
    pub skv: usize,
    pub d: usize,
    pub scale: f32,
    pub causal: bool,
    /// Probability of dropping an attention weight (0 for none), and the mask's seed.
    pub dropout: f32,
    pub seed: u64,
    pub q: HeadLayout,
    pub k: HeadLayout,
    pub v: HeadLayout,
    pub o: HeadLayout,
    pub g: HeadLayout,
}

impl Dims {
    /// fwd_reg's constants: `coop_consts`, then HOLD, how the next runs of K and V load
    /// while a block multiplies: at 64 the next block's whole (1); at 128, where the
    /// accumulators need those registers and a whole block ahead runs slower, half a block
    /// at a time (2) (docs/performance.md, attention).
    fn fwd_reg_consts(&self) -> Consts {
        let mut c = self.coop_consts(false).iter().copied().collect::<Consts>();
        c.push(("HOLD", if self.d == 64 { 1 } else { 2 }));
        c
    }

    fn params(&self) -> Result<AttnParams> {
        let [q_off, q_sb, q_sh, q_ss] = self.q.words()?;
        let [k_off, k_sb, k_sh, k_ss] = self.k.words()?;
        let [v_off, v_sb, v_sh, v_ss] = self.v.words()?;
        let [o_off, o_sb, o_sh, o_ss] = self.o.words()?;
        let [g_off, g_sb, g_sh, g_ss] = self.g.words()?;
        Ok(AttnParams {
            bh: self.bh as u32,
            sq: self.sq as u32,
            skv: self.skv as u32,
            d: self.d as u32,
            scale: self.scale,
            causal: self.causal as u32,
            ninf: f32::NEG_INFINITY,
            first: 1,
            last: 1,
            c0: 0,
            c1: 0,
            heads: self.heads.max(1) as u32,
            q_off,
            q_sb,
            q_sh,
            q_ss,
            k_off,
            k_sb,
            k_sh,
            k_ss,
            v_off,
            v_sb,
            v_sh,
            v_ss,
            o_off,
            o_sb,
            o_sh,
            o_ss,
            g_off,
            g_sb,
            g_sh,
            g_ss,
            drop_thr: drop_threshold(self.dropout),
            drop_scale: if self.dropout > 0.0 {
                1.0 / (1.0 - self.dropout)
            } else {
                1.0
            },
            seed_lo: self.seed as u32,
            seed_hi: (self.seed >> 32) as u32,
            group: self.group.max(1) as u32,
            // The gradients' layouts: set by `backward`, which knows where they go.
            ..Default::default()
        })
    }

    /// Whether q, k and v can be read in aligned runs of 4 elements (`fwd_tile`'s 16-byte
    /// loads): the head dimension, every offset and every stride a multiple of 4.
    fn runs4(&self) -> bool {
        self.d.is_multiple_of(4) && [&self.q, &self.k, &self.v].iter().all(|l| l.aligned(4))
    }

    /// Whether the tensor-core kernels can read q, k and v (and, `backward`, the output
    /// gradient) where they are ([`HeadLayout::coop_aligned`]). The heads of a fused QKV
    /// projection qualify.
    pub fn coop_readable(&self, backward: bool) -> bool {
        [&self.q, &self.k, &self.v].iter().all(|l| l.coop_aligned())
            && (!backward || self.g.coop_aligned())
    }

    /// The tensor-core kernels' constants: the head tiles, the 16-row tiles whose fragments
    /// load together (KT: as many as registers allow, fewer in the backward kernels, which
    /// hold two sets of accumulators), and the row pitches of q, k, v and the output gradient
    /// (constants because naga's cooperative loads need them so). The forward takes the same
    /// names (its check lines do) and ignores GS.
    fn coop_consts(&self, backward: bool) -> [(&'static str, u32); 9] {
        let kt = if backward { 128 } else { 256 } / self.d as u32;
        [
            ("DMAX", self.d as u32),
            ("ND", self.d as u32 / 16),
            ("KT", kt),
            ("QS", self.q.ss as u32),
            ("KS", self.k.ss as u32),
            ("VS", self.v.ss as u32),
            ("GS", self.g.ss as u32),
            ("CAUSAL", self.causal as u32),
            ("DROP", (drop_threshold(self.dropout) != 0) as u32),
        ]
    }
}

impl Dims {
    /// The backward register kernels' constants: `coop_consts`, then HOLD. bwd_kv_reg
    /// (`for_q` false) then keeps its K and V tiles in registers across its loop, which
    /// measured best at both head dimensions against loading them per pair of query tiles,
    /// and at 64 also loads the next block ahead (not at 128: the shader's `ahead`); bwd_q_reg
    /// loads the next block ahead, as fwd_reg does, except at 128, where that ran slower
    /// (docs/performance.md, attention).
    fn reg_consts(&self, for_q: bool) -> Consts {
        let mut c = self.coop_consts(true).iter().copied().collect::<Consts>();
        c.push(("HOLD", !(for_q && self.d == 128) as u32));
        c
    }
}

/// The 32-bit hash below which an attention weight is dropped: round(p 2^32), at least 1 for
/// any p > 0 (the host rejects p outside [0, 1)).
pub(crate) fn drop_threshold(p: f32) -> u32 {
    if p <= 0.0 {
        return 0;
    }
    ((p as f64 * 4294967296.0).round() as u64).clamp(1, u32::MAX as u64) as u32
}

/// Tile sizes for a head dimension, sized so each kernel's workgroup memory stays under 32 KiB
/// (the smallest limit among the adapters wgrad targets).
#[derive(Clone, Copy, Debug)]
struct Tiles {
    dmax: u32,
    /// Forward and dQ: query rows and keys per block.
    fbr: u32,
    fbc: u32,
    /// Backward: query rows and keys per block.
    bbr: u32,
    bbc: u32,
}

fn tiles(d: usize) -> Result<Tiles> {
    let (dmax, fbr, fbc, bbr, bbc) = match d {
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
    };
    Ok(Tiles {
        dmax,
        fbr,
        fbc,
        bbr,
        bbc,
    })
}

/// The longest range (a multiple of `block`) whose `per_block` loop cost fits the budget,
/// keeping some room for the fixed loops around the block loop.
fn chunk_len(per_block: u32, block: u32) -> usize {
    ((LOOP_BUDGET - 256) / per_block as usize).max(1) * block as usize
}

impl Tiles {
    /// Keys one forward invocation covers.
    fn fwd_chunk(&self) -> usize {
        let (br, bc, dm) = (self.fbr, self.fbc, self.dmax);
        let tpr = WG / br;
        let opt = dm / tpr;
        let per = (bc * dm / WG + 1)
            + (bc / tpr + 1)
            + (bc / tpr) * (dm + 2)
            + 2 * (bc + 1)
            + bc * (opt + 1);
        chunk_len(per, bc)
    }

    /// Queries one dK/dV invocation covers.
    fn kv_chunk(&self) -> usize {
        let (br, bc, dm) = (self.bbr, self.bbc, self.dmax);
        let kpt = dm / (WG / bc);
        let per = (br * dm / WG + 1)
            + 2
            + (br * bc / WG + 1)
            + (br * bc / WG) * (dm + 1)
            + (br + 1)
            + br * (kpt + 1);
        chunk_len(per, br)
    }

    /// Keys one dQ invocation covers.
    fn q_chunk(&self) -> usize {
        let (br, bc, dm) = (self.bbr, self.bbc, self.dmax);
        let opt = dm / (WG / br);
        let per = (bc * dm / WG + 1)
            + (br * bc / WG + 1)
            + (br * bc / WG) * (dm + 1)
            + (bc + 1)
            + bc * (opt + 1);
        chunk_len(per, bc)
    }
}

fn check(dev: &Device, a: &Dims) -> Result<()> {
    u32_len(
        "attention",
        a.bh * a.sq.max(a.skv) * (a.d + 2).max(2 * tiles(a.d)?.dmax as usize),
    )?;
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

/// Whether the forward pass runs on cooperative matrices (see attention_coop.wgsl): f16, and
/// bf16 where the device has bf16 matrices and the `_reg` kernels run (wgrad's SPIR-V, whose
/// 16-bit values become bf16: `kernels::spirv::bf16_halves`; the other entries are WGSL).
pub fn uses_tensor_cores(dev: &Device, dtype: DType, sq: usize, skv: usize, d: usize) -> bool {
    let c = dev.caps();
    let kernels = match dtype {
        DType::F16 => true,
        DType::BF16 => super::coop_layout::quad_rows_for(dev, dtype).unwrap_or(false),
        _ => false,
    };
    kernels
        && dev.hardware().tensor_cores(dtype)
        && (d == 64 || d == 128)
        // The forward's workgroup memory (scores, weights, row sums and factors, a flag, the
        // staged K and V blocks: one buffer for both at d = 128): 43,792 bytes at d = 64,
        // 42,784 at 128.
        && c.workgroup_storage >= if d == 64 { 43_792 } else { 42_784 }
        && sq.is_multiple_of(16)
        && skv.is_multiple_of(16)
        && sq >= 16
        && skv <= COOP_MAX_KEYS
}

/// Whether the backward pass runs on cooperative matrices (attention_coop.wgsl's bwd_kv and
/// bwd_q), given dense operands: the forward's conditions, queries within the loop budget
/// of bwd_kv, which walks them, and bwd_kv's workgroup memory (43,520 bytes at d = 64).
pub fn backward_uses_tensor_cores(
    dev: &Device,
    dtype: DType,
    sq: usize,
    skv: usize,
    d: usize,
) -> bool {
    uses_tensor_cores(dev, dtype, sq, skv, d)
        && sq <= COOP_MAX_KEYS
        && dev.caps().workgroup_storage >= 43_520
}

/// Runs `entry` over the range [0, total) in chunks of `chunk`, each dispatch continuing from
/// the state the previous one left. `args` ends with the state binding's place, filled here.
#[allow(clippy::too_many_arguments)]
fn chunked(
    dev: &Device,
    entry: &'static str,
    wg: u32,
    consts: &[(&'static str, u32)],
    p: AttnParams,
    args: &[Arg<'_>],
    groups: [u32; 3],
    total: usize,
    chunk: usize,
    state_floats: usize,
) -> Result<()> {
    let n = total.div_ceil(chunk).max(1);
    let state = if n > 1 {
        Some(dev.alloc((state_floats * 4) as u64)?)
    } else {
        None
    };
    let mut all: Vec<Arg<'_>> = Vec::with_capacity(args.len() + 1);
    all.extend_from_slice(args);
    // A call with one chunk never touches the state; any block stands in for it.
    all.push(arg(state.as_ref().unwrap_or(args[0].block), DType::F32));
    for i in 0..n {
        let c0 = i * chunk;
        let c1 = ((i + 1) * chunk).min(total);
        launch(
            dev,
            &Launch {
                kernel: Kernel::Attention,
                entry,
                wg,
                consts,
                params: AttnParams {
                    first: (i == 0) as u32,
                    last: (i + 1 == n) as u32,
                    c0: c0 as u32,
                    c1: c1 as u32,
                    ..p
                },
                args: &all,
                groups,
            },
        )?;
    }
    Ok(())
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
    let p = a.params()?;
    // The tensor-core forward stores o in runs of 4 (a fresh output's layout qualifies).
    if a.coop_readable(false)
        && a.o.coop_aligned()
        && uses_tensor_cores(dev, dtype, a.sq, a.skv, a.d)
    {
        // The softmax in registers where the driver's layout is the one it assumes.
        let reg = super::coop_layout::quad_rows_for(dev, dtype)?;
        return launch(
            dev,
            &Launch {
                kernel: Kernel::AttentionCoop,
                entry: if reg { "fwd_reg" } else { "fwd" },
                wg: 128,
                consts: &if reg {
                    a.fwd_reg_consts()
                } else {
                    a.coop_consts(false).iter().copied().collect()
                },
                params: p,
                args: &[
                    arg(q, dtype),
                    arg(k, dtype),
                    arg(v, dtype),
                    arg(o, dtype),
                    arg(lse, DType::F32),
                ],
                groups: [a.sq.div_ceil(64) as u32, a.bh as u32, 1],
            },
        );
    }
    let args = [
        arg(q, dtype),
        arg(k, dtype),
        arg(v, dtype),
        arg(o, dtype),
        arg(lse, DType::F32),
    ];
    if let Some(dmax) = fwd_tile_dmax(dev, a.d) {
        // 64 query rows a workgroup, 32 at 128 (where Q, K and V fill 48 KiB).
        let br = 64 * 64 / dmax;
        return chunked(
            dev,
            "fwd_tile",
            WG,
            &[
                ("BR", br),
                ("BC", 32),
                ("DMAX", dmax),
                ("VEC", a.runs4() as u32),
                ("SEP", (dmax == 64 && sep_p(dev)) as u32),
            ],
            p,
            &args,
            [a.sq.div_ceil(br as usize) as u32, a.bh as u32, 1],
            a.skv,
            FWD_TILE_CHUNK,
            a.bh * a.sq * (dmax as usize + 2),
        );
    }
    let t = tiles(a.d)?;
    chunked(
        dev,
        "fwd",
        WG,
        &[("BR", t.fbr), ("BC", t.fbc), ("DMAX", t.dmax)],
        p,
        &args,
        [a.sq.div_ceil(t.fbr as usize) as u32, a.bh as u32, 1],
        a.skv,
        t.fwd_chunk(),
        a.bh * a.sq * (t.dmax as usize + 2),
    )
}

/// Whether attention without tensor cores takes the register-tile kernels built for head
/// dimension 64 (`fwd_tile`, `bwd_kv_tile`, `bwd_q_tile`: head dimensions up to 64, 32 KiB of
/// workgroup memory) rather than `fwd`, `bwd_kv`, `bwd_q`. Heads of 65 to 128 have register
/// tiles of their own (`fwd_tile_dmax`, `backward_tiles`).
pub fn fwd_tiled(dev: &Device, d: usize) -> bool {
    tiled_at_64(dev.caps().workgroup_storage, d)
}

/// Heads of at most 64 and 32 KiB of workgroup memory: the rule of [`fwd_tiled`] for a device
/// with `room` bytes of it.
fn tiled_at_64(room: u32, d: usize) -> bool {
    d <= 64 && room >= 32_768
}

/// The head dimension `fwd_tile` is built for where the forward takes it: 64 for heads up to
/// 64 (as [`fwd_tiled`], and subgroups of at least 8: the lanes of a row group combine their
/// row statistics by shuffles), 128 for heads up to 128 with 48 KiB of workgroup memory and
/// subgroups of at least 16 (a row group's 16 lanes). `fwd` is far slower at head dimension
/// 128 (docs/performance.md, attention).
fn fwd_tile_dmax(dev: &Device, d: usize) -> Option<u32> {
    let c = dev.caps();
    if !c.subgroups {
        return None;
    }
    if fwd_tiled(dev, d) && c.subgroup_min >= 8 {
        Some(64)
    } else if (65..=128).contains(&d) && c.workgroup_storage >= 49_152 && c.subgroup_min >= 16 {
        Some(128)
    } else {
        None
    }
}

/// Whether `fwd_tile` gives the weights P an array of their own (40 KiB of workgroup memory
/// instead of 32): a barrier less a block.
fn sep_p(dev: &Device) -> bool {
    dev.caps().workgroup_storage >= 40_960
}

/// Keys one `fwd_tile` invocation covers: per block of 32 keys its loops count 8 for the
/// scores and 8 for the output, plus exits (the loads are unrolled); the Q staging loop (2)
/// and the output's stores (16) come once. (Sized with room to spare: 32 a block.)
const FWD_TILE_CHUNK: usize = (LOOP_BUDGET - 256) / 32 * 32;

/// A launch of `bwd_kv_tile`, `bwd_q_tile` or `bwd_q_split` (attention.wgsl): its workgroup,
/// the query rows and keys of a block and the head dimension it is built for; the per-thread
/// unrolling follows from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackwardTile {
    kv: bool,
    wg: u32,
    rows: u32,
    keys: u32,
    dmax: u32,
}

impl BackwardTile {
    fn entry(&self) -> &'static str {
        match (self.kv, self.dmax) {
            (true, _) => "bwd_kv_tile",
            (false, 64) => "bwd_q_tile",
            (false, _) => "bwd_q_split",
        }
    }

    /// The launch constants. QPT (KPT): the queries (keys) of a block a thread stages, 4
    /// dimensions each; NQ: the queries a `bwd_kv_tile` thread scores (16 threads across a
    /// block); NK: the keys a `bwd_q_split` thread scores (8 across a block); DH: the halves
    /// of 64 dimensions.
    fn consts(&self) -> Vec<(&'static str, u32)> {
        let staged = if self.kv { self.rows } else { self.keys };
        let (per, split) = if self.kv {
            (
                ("QPT", staged * self.dmax / 4 / self.wg),
                ("NQ", self.rows / 16),
            )
        } else {
            (
                ("KPT", staged * self.dmax / 4 / self.wg),
                ("NK", self.keys / 8),
            )
        };
        let mut c = vec![
            ("BR", self.rows),
            ("BC", self.keys),
            ("DMAX", self.dmax),
            per,
        ];
        // `bwd_q_tile` (64) takes two keys a thread and both S and dP in one thread.
        if self.entry() != "bwd_q_tile" {
            c.extend([split, ("DH", self.dmax / 64)]);
        }
        c
    }

    /// Queries (`bwd_kv_tile`) or keys (`bwd_q_tile`, `bwd_q_split`) one invocation covers.
    /// Per block of the walked range the loops count the score loop's DMAX / 4 steps plus an
    /// exit per half of the dimensions, the gradient loop's steps (a block's queries or keys)
    /// plus an exit, and the block loop's own step; the staging and state loops come once.
    /// Sized with room to spare: 90 a block of 32 at 64, 56 a block of 16 at 128.
    fn chunk(&self) -> usize {
        let (block, per_block) = match (self.dmax, self.kv) {
            (64, _) => (32, 90),
            (_, true) => (self.rows, 56),
            (_, false) => (self.keys, 56),
        };
        (LOOP_BUDGET - 256) / per_block * block as usize
    }
}

/// The register-tile backward kernels' launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackwardTiles {
    kv: BackwardTile,
    q: BackwardTile,
}

/// The register-tile backward kernels for head dimension `d` on a device with `room` bytes of
/// workgroup memory, or None where attention takes `bwd_kv` and `bwd_q`: at most 64 with 32
/// KiB ([`tiled_at_64`]) and 65 to 128 with 32 KiB. Larger tiles where workgroup memory
/// allows them: at 64, 32 keys and 256 threads for dK/dV with 40.25 KiB (half the barriers
/// and staging loads per key), 64 rows and 256 threads for dQ with 48 KiB; at 128, 16 keys
/// and 128 threads for dK/dV with 34.25 KiB, 32 rows and 128 threads for dQ with 48 KiB.
fn backward_tiles(room: u32, d: usize) -> Option<BackwardTiles> {
    let tile = |kv, wg, rows, keys, dmax| BackwardTile {
        kv,
        wg,
        rows,
        keys,
        dmax,
    };
    if tiled_at_64(room, d) {
        Some(BackwardTiles {
            kv: if room >= 41_216 {
                tile(true, 256, 32, 32, 64)
            } else {
                tile(true, 128, 32, 16, 64)
            },
            q: if room >= 49_152 {
                tile(false, 256, 64, 32, 64)
            } else {
                tile(false, 128, 32, 32, 64)
            },
        })
    } else if (65..=128).contains(&d) && room >= 32_768 {
        Some(BackwardTiles {
            kv: if room >= 34_944 {
                tile(true, 128, 16, 16, 128)
            } else {
                tile(true, 64, 16, 8, 128)
            },
            q: if room >= 49_152 {
                tile(false, 128, 32, 16, 128)
            } else {
                tile(false, 64, 16, 16, 128)
            },
        })
    } else {
        None
    }
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
    /// Where the gradients' elements go: dense, or the gradient of a fused QKV projection
    /// written in place.
    pub dq_at: HeadLayout,
    pub dk_at: HeadLayout,
    pub dv_at: HeadLayout,
}

pub(crate) fn backward(dev: &Device, a: &Dims, g: &Grads<'_>, dtype: DType) -> Result<()> {
    check(dev, a)?;
    let t = tiles(a.d)?;
    let consts = [("BR", t.bbr), ("BC", t.bbc), ("DMAX", t.dmax)];
    let mut p = a.params()?;
    [p.dq_off, p.dq_sb, p.dq_sh, p.dq_ss] = g.dq_at.words()?;
    [p.dk_off, p.dk_sb, p.dk_sh, p.dk_ss] = g.dk_at.words()?;
    [p.dv_off, p.dv_sb, p.dv_sh, p.dv_ss] = g.dv_at.words()?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Attention,
            entry: "bwd_delta",
            wg: 256,
            consts: &consts,
            params: p,
            args: &[
                arg(g.o, dtype),
                arg(g.dout, dtype),
                arg(g.delta, DType::F32),
            ],
            // DL = 16 threads a row (attention.wgsl), numbered in u32.
            groups: grid_1d(
                u32_len("attention backward", a.bh * a.sq * 16)? as usize,
                256,
            ),
        },
    )?;
    let common = [
        arg(g.q, dtype),
        arg(g.k, dtype),
        arg(g.v, dtype),
        arg(g.dout, dtype),
        arg(g.lse, DType::F32),
        arg(g.delta, DType::F32),
    ];
    // The tensor-core kernels store the gradients in runs of 4 (the gradient of a fused QKV
    // projection qualifies, as its operands do).
    if a.coop_readable(true)
        && [g.dq_at, g.dk_at, g.dv_at].iter().all(|l| l.coop_aligned())
        && backward_uses_tensor_cores(dev, dtype, a.sq, a.skv, a.d)
    {
        // The element work in registers where the driver's layout is the one it assumes.
        let reg = super::coop_layout::quad_rows_for(dev, dtype)?;
        let (kv, q) = if reg {
            ("bwd_kv_reg", "bwd_q_reg")
        } else {
            ("bwd_kv", "bwd_q")
        };
        let coop = |entry: &'static str, out: &[Arg<'_>], rows: usize| {
            let consts = if reg {
                a.reg_consts(entry == q)
            } else {
                a.coop_consts(true).iter().copied().collect()
            };
            let mut args = common.to_vec();
            args.extend_from_slice(out);
            launch(
                dev,
                &Launch {
                    kernel: Kernel::AttentionCoop,
                    entry,
                    wg: 128,
                    consts: &consts,
                    params: p,
                    args: &args,
                    groups: [rows.div_ceil(64) as u32, a.bh as u32, 1],
                },
            )
        };
        coop(kv, &[arg(g.dk, dtype), arg(g.dv, dtype)], a.skv)?;
        return coop(q, &[arg(g.dq, dtype)], a.sq);
    }
    let mut kv = Vec::with_capacity(common.len() + 2);
    kv.extend_from_slice(&common);
    kv.extend([arg(g.dk, dtype), arg(g.dv, dtype)]);
    if let Some(tiles) = backward_tiles(dev.caps().workgroup_storage, a.d) {
        let kv_tile = tiles.kv;
        chunked(
            dev,
            "bwd_kv_tile",
            kv_tile.wg,
            &kv_tile.consts(),
            p,
            &kv,
            [a.skv.div_ceil(kv_tile.keys as usize) as u32, a.bh as u32, 1],
            a.sq,
            kv_tile.chunk(),
            a.bh * a.skv * 2 * kv_tile.dmax as usize,
        )?;
        let q_tile = tiles.q;
        let mut q = common.to_vec();
        q.push(arg(g.dq, dtype));
        return chunked(
            dev,
            q_tile.entry(),
            q_tile.wg,
            &q_tile.consts(),
            p,
            &q,
            [a.sq.div_ceil(q_tile.rows as usize) as u32, a.bh as u32, 1],
            a.skv,
            q_tile.chunk(),
            a.bh * a.sq * q_tile.dmax as usize,
        );
    }
    chunked(
        dev,
        "bwd_kv",
        WG,
        &consts,
        p,
        &kv,
        [a.skv.div_ceil(t.bbc as usize) as u32, a.bh as u32, 1],
        a.sq,
        t.kv_chunk(),
        a.bh * a.skv * 2 * t.dmax as usize,
    )?;
    let mut q = common.to_vec();
    q.push(arg(g.dq, dtype));
    chunked(
        dev,
        "bwd_q",
        WG,
        &consts,
        p,
        &q,
        [a.sq.div_ceil(t.bbr as usize) as u32, a.bh as u32, 1],
        a.skv,
        t.q_chunk(),
        a.bh * a.sq * t.dmax as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The register-tile backward kernels' larger tiles run only where workgroup memory
    // allows them (none on lavapipe's 32 KiB): every choice is checked here against the
    // entries' check lines, and the workgroup memory each declares against the room.
    #[test]
    fn backward_tiles_match_check_lines_and_fit() {
        let declared = |t: &BackwardTile| -> u32 {
            let (br, bc, dm) = (t.rows, t.keys, t.dmax);
            // vec4s: bwd_kv_tile K^T V^T, Q dO, P dS, and a vec2 of lse and delta a query;
            // bwd_q_tile and bwd_q_split Q^T dO^T, K V.
            if t.kv {
                16 * (2 * dm * bc / 4 + 2 * br * dm / 4 + 2 * br * bc / 4) + 8 * br
            } else {
                16 * (2 * dm * br / 4 + 2 * bc * dm / 4)
            }
        };
        let mut seen = std::collections::HashSet::new();
        for room in [16_384, 32_768, 34_944, 41_216, 49_152, 65_536] {
            for d in [1, 32, 64, 65, 100, 128, 129] {
                let Some(tiles) = backward_tiles(room, d) else {
                    assert!(room < 32_768 || d > 128, "room {room} d {d}");
                    continue;
                };
                assert!(room >= 32_768 && d <= 128, "room {room} d {d}");
                for t in [tiles.kv, tiles.q] {
                    assert_eq!(t.dmax, if d <= 64 { 64 } else { 128 }, "{t:?}");
                    assert!(declared(&t) <= room, "{t:?} declares {} B", declared(&t));
                    let sig = Kernel::Attention.entry(t.entry()).expect("entry");
                    assert!(
                        sig.compositions().contains(&(t.wg, t.consts())),
                        "{t:?} matches no check line of {}",
                        t.entry()
                    );
                    assert!(t.chunk() >= 2048, "{t:?}");
                    seen.insert((t.entry(), t.wg, t.rows, t.keys));
                }
            }
        }
        // Each of the eight check lines is chosen somewhere.
        assert_eq!(seen.len(), 8, "{seen:?}");
    }

    // The tensor-core entries run only on adapters with cooperative matrices, so a launch
    // whose constants no check line accepts would fail only there: checked here everywhere.
    #[test]
    fn tensor_core_constants_match_check_lines() {
        for (d, causal, dropout) in [(64, false, 0.0), (128, true, 0.2)] {
            let l = HeadLayout::dense(2, 64, d);
            let a = Dims {
                bh: 4,
                heads: 2,
                group: 1,
                sq: 64,
                skv: 64,
                d,
                scale: 0.125,
                causal,
                dropout,
                seed: 1,
                q: l,
                k: l,
                v: l,
                o: l,
                g: l,
            };
            for (entry, backward) in [("fwd", false), ("bwd_kv", true), ("bwd_q", true)] {
                let sig = Kernel::AttentionCoop.entry(entry).expect("entry");
                assert!(
                    sig.accepts_consts(&a.coop_consts(backward)),
                    "{entry} d={d}"
                );
            }
            let sig = Kernel::AttentionCoop.entry("fwd_reg").expect("entry");
            assert!(sig.accepts_consts(&a.fwd_reg_consts()), "fwd_reg d={d}");
            for entry in ["bwd_kv_reg", "bwd_q_reg"] {
                let sig = Kernel::AttentionCoop.entry(entry).expect("entry");
                assert!(
                    sig.accepts_consts(&a.reg_consts(entry == "bwd_q_reg")),
                    "{entry} d={d}"
                );
            }
        }
    }
}
