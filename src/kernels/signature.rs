//! The binding signature of every entry point, in one table.
//!
//! Two users: the naga validation test composes every entry with every dtype and capability
//! set the table allows, so a broken shader fails a unit test rather than a user's GPU; and
//! `launch` checks each new pipeline's arguments against the table, so the table cannot drift
//! from the host code that the test is meant to cover.

use super::Kernel;
use crate::dtype::DType;

/// What a binding may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The op's float dtype (f32 or f16).
    Data,
    /// Any dtype (cast).
    Any,
    /// Always u32.
    U32,
    /// Always f32 (statistics saved for backward passes).
    F32,
}

impl Elem {
    /// Whether `d` fits.
    pub fn allows(self, d: DType) -> bool {
        match self {
            Elem::Data => d.is_float(),
            Elem::Any => true,
            Elem::U32 => d == DType::U32,
            Elem::F32 => d == DType::F32,
        }
    }

    /// The dtypes a validation run tries.
    pub fn candidates(self) -> &'static [DType] {
        match self {
            Elem::Data => &[DType::F32, DType::F16],
            Elem::Any => &[DType::F32, DType::F16, DType::U32],
            Elem::U32 => &[DType::U32],
            Elem::F32 => &[DType::F32],
        }
    }
}

/// One binding: name, element kind, written or not.
pub type Binding = (&'static str, Elem, bool);

/// An entry point's signature and the constant sets it is compiled with.
pub struct Sig {
    /// Family.
    pub kernel: Kernel,
    /// Entry point.
    pub entry: &'static str,
    /// Storage bindings after the parameters, in order.
    pub bindings: &'static [Binding],
    /// Workgroup sizes the host uses.
    pub wgs: &'static [u32],
    /// Constant sets validated by the test. At run time a launch must use the names of one of
    /// them; values may differ only for shape constants (strides), which vary per problem.
    pub consts: &'static [&'static [(&'static str, u32)]],
}

const R: bool = false;
const W: bool = true;
use Elem::{Any, Data, F32, U32};

const NONE: &[&[(&str, u32)]] = &[&[]];
const WG256: &[u32] = &[256];
const ROWS: &[u32] = &[32, 64, 128, 256];
const MATMUL: &[&[(&str, u32)]] = &[
    &[("BM", 128), ("BN", 128), ("BK", 8), ("TM", 8), ("TN", 8)],
    &[("BM", 64), ("BN", 64), ("BK", 16), ("TM", 4), ("TN", 4)],
    &[("BM", 32), ("BN", 32), ("BK", 16), ("TM", 2), ("TN", 2)],
];
/// Shape constants: the names are fixed, the values (operand strides) vary per shape; the
/// validation test tries these.
const COOP_DIRECT: &[&[(&str, u32)]] = &[
    &[("SAG", 64), ("SBG", 128), ("TA", 0), ("TB", 0)],
    &[("SAG", 256), ("SBG", 64), ("TA", 1), ("TB", 1)],
];
const ATTN_FWD: &[&[(&str, u32)]] = &[
    &[("BR", 32), ("BC", 32), ("DMAX", 32)],
    &[("BR", 32), ("BC", 32), ("DMAX", 64)],
    &[("BR", 16), ("BC", 16), ("DMAX", 128)],
    &[("BR", 8), ("BC", 8), ("DMAX", 256)],
];
const ATTN_BWD: &[&[(&str, u32)]] = &[
    &[("BR", 16), ("BC", 32), ("DMAX", 32)],
    &[("BR", 16), ("BC", 32), ("DMAX", 64)],
    &[("BR", 8), ("BC", 16), ("DMAX", 128)],
    &[("BR", 4), ("BC", 8), ("DMAX", 256)],
];

macro_rules! sig {
    ($k:ident, $e:literal, [$($b:expr),* $(,)?]) => {
        sig!($k, $e, [$($b),*], WG256, NONE)
    };
    ($k:ident, $e:literal, [$($b:expr),* $(,)?], $wgs:expr, $consts:expr) => {
        Sig { kernel: Kernel::$k, entry: $e, bindings: &[$($b),*], wgs: $wgs, consts: $consts }
    };
}

/// Every entry point of every kernel family.
pub const TABLE: &[Sig] = &[
    sig!(Fill, "fill", [("out", Data, W)]),
    sig!(Fill, "words", [("out", U32, W)]),
    sig!(Fill, "uniform", [("out", Data, W)]),
    sig!(Fill, "normal", [("out", Data, W)]),
    sig!(Fill, "dropout", [("x", Data, R), ("y", Data, W)]),
    sig!(Copy, "cast", [("x", Any, R), ("y", Any, W)]),
    sig!(Copy, "strided", [("x", Data, R), ("y", Data, W)]),
    sig!(Copy, "strided_u32", [("x", U32, R), ("y", U32, W)]),
    sig!(Copy, "words", [("x", U32, R), ("y", U32, W)]),
    sig!(Elementwise, "unary", [("x", Data, R), ("y", Data, W)]),
    sig!(
        Elementwise,
        "unary_bwd",
        [("x", Data, R), ("g", Data, R), ("dx", Data, W)]
    ),
    sig!(
        Elementwise,
        "binary",
        [("x", Data, R), ("y", Data, R), ("z", Data, W)]
    ),
    sig!(
        Elementwise,
        "binary_bcast",
        [("x", Data, R), ("y", Data, R), ("z", Data, W)]
    ),
    sig!(
        Elementwise,
        "select",
        [
            ("c", Any, R),
            ("x", Data, R),
            ("y", Data, R),
            ("z", Data, W)
        ]
    ),
    sig!(Reduce, "rows", [("x", Data, R), ("y", Data, W)]),
    sig!(Reduce, "cols", [("x", Data, R), ("y", Data, W)]),
    sig!(Reduce, "argmax_rows", [("x", Data, R), ("y", U32, W)]),
    sig!(Reduce, "argmax_cols", [("x", Data, R), ("y", U32, W)]),
    sig!(Softmax, "fwd", [("x", Data, R), ("y", Data, W)], ROWS, NONE),
    sig!(
        Softmax,
        "bwd",
        [("y", Data, R), ("dy", Data, R), ("dx", Data, W)],
        ROWS,
        NONE
    ),
    sig!(
        Matmul,
        "main",
        [
            ("a", Data, R),
            ("b", Data, R),
            ("bias", Data, R),
            ("c", Data, W)
        ],
        &[256],
        MATMUL
    ),
    sig!(
        MatmulCoop,
        "main",
        [
            ("a", Data, R),
            ("b", Data, R),
            ("bias", Data, R),
            ("c", Data, W)
        ]
    ),
    sig!(
        MatmulCoop,
        "direct",
        [
            ("a", Data, R),
            ("b", Data, R),
            ("bias", Data, R),
            ("c", Data, W)
        ],
        WG256,
        COOP_DIRECT
    ),
    sig!(Conv, "im2col", [("x", Data, R), ("col", Data, W)]),
    sig!(Conv, "col2im", [("dcol", Data, R), ("dx", Data, W)]),
    sig!(
        Conv,
        "maxpool",
        [("x", Data, R), ("y", Data, W), ("idx", U32, W)]
    ),
    sig!(
        Conv,
        "maxpool_bwd",
        [("idx", U32, R), ("dy", Data, R), ("dx", Data, W)]
    ),
    sig!(Conv, "avgpool", [("x", Data, R), ("y", Data, W)]),
    sig!(Conv, "avgpool_bwd", [("dy", Data, R), ("dx", Data, W)]),
    sig!(
        Attention,
        "fwd",
        [
            ("q", Data, R),
            ("k", Data, R),
            ("v", Data, R),
            ("o", Data, W),
            ("lse", F32, W)
        ],
        &[128],
        ATTN_FWD
    ),
    sig!(
        AttentionCoop,
        "fwd",
        [
            ("q", Data, R),
            ("k", Data, R),
            ("v", Data, R),
            ("o", Data, W),
            ("lse", F32, W)
        ],
        &[128],
        &[&[("DMAX", 64)], &[("DMAX", 128)]]
    ),
    sig!(
        Attention,
        "bwd_delta",
        [("o", Data, R), ("dout", Data, R), ("delta", F32, W)],
        WG256,
        ATTN_BWD
    ),
    sig!(
        Attention,
        "bwd_kv",
        [
            ("q", Data, R),
            ("k", Data, R),
            ("v", Data, R),
            ("dout", Data, R),
            ("lse", F32, R),
            ("delta", F32, R),
            ("dk", Data, W),
            ("dv", Data, W)
        ],
        &[128],
        ATTN_BWD
    ),
    sig!(
        Attention,
        "bwd_q",
        [
            ("q", Data, R),
            ("k", Data, R),
            ("v", Data, R),
            ("dout", Data, R),
            ("lse", F32, R),
            ("delta", F32, R),
            ("dq", Data, W)
        ],
        &[128],
        ATTN_BWD
    ),
    sig!(
        Norm,
        "fwd",
        [
            ("x", Data, R),
            ("gamma", Data, R),
            ("beta", Data, R),
            ("y", Data, W),
            ("mean", F32, W),
            ("rstd", F32, W)
        ],
        ROWS,
        NONE
    ),
    sig!(
        Norm,
        "bwd_x",
        [
            ("x", Data, R),
            ("dy", Data, R),
            ("gamma", Data, R),
            ("mean", F32, R),
            ("rstd", F32, R),
            ("dx", Data, W)
        ],
        ROWS,
        NONE
    ),
    sig!(
        Norm,
        "bwd_params",
        [
            ("x", Data, R),
            ("dy", Data, R),
            ("mean", F32, R),
            ("rstd", F32, R),
            ("dgamma", Data, W),
            ("dbeta", Data, W)
        ]
    ),
    sig!(
        Loss,
        "fwd",
        [
            ("x", Data, R),
            ("labels", U32, R),
            ("loss", Data, W),
            ("lse", F32, W)
        ],
        ROWS,
        NONE
    ),
    sig!(
        Loss,
        "bwd",
        [
            ("x", Data, R),
            ("labels", U32, R),
            ("lse", F32, R),
            ("g", Data, R),
            ("dx", Data, W)
        ]
    ),
    sig!(
        Embedding,
        "gather",
        [("w", Data, R), ("idx", U32, R), ("y", Data, W)]
    ),
    sig!(
        Embedding,
        "scatter_rows",
        [("idx", U32, R), ("dy", Data, R), ("dw", Data, W)]
    ),
    sig!(
        Embedding,
        "scatter_cols",
        [("idx", U32, R), ("dy", Data, R), ("dw", Data, W)]
    ),
    sig!(
        Optim,
        "sgd",
        [
            ("g", Data, R),
            ("w", Data, W),
            ("master", F32, W),
            ("buf", F32, W)
        ]
    ),
    sig!(
        Optim,
        "adam",
        [
            ("g", Data, R),
            ("w", Data, W),
            ("master", F32, W),
            ("m", F32, W),
            ("v", F32, W)
        ]
    ),
    sig!(Optim, "sumsq", [("x", Data, R), ("partial", F32, W)]),
];

/// The signature of one entry point.
pub fn find(kernel: Kernel, entry: &str) -> Option<&'static Sig> {
    TABLE
        .iter()
        .find(|s| s.kernel == kernel && s.entry == entry)
}
