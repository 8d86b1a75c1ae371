//! Builds the WGSL a pipeline is compiled from: a generated prelude, then one kernel family's
//! file, cut down to the entry point asked for.
//!
//! A family file (`shaders/*.wgsl`) holds code shared by its entry points, then one section per
//! entry point. A section opens with its signature line, which is the only place the entry's
//! storage bindings are written down:
//!
//! ```text
//! //! entry binary(x: data, y: data, z: data mut)
//! //! check WG=256
//! ```
//!
//! Each binding is `name: kind`, with `mut` when the kernel writes it; kinds are `data` (the
//! op's float dtype: f32, f16 or bf16), `any` (any dtype), `u32`, `f32` and `f16`. Optional
//! `check` lines list the compile-time constants the entry is built with (`WG` is the
//! workgroup size; a comma gives several values); the validation test composes each, and a
//! launch must use the constant names of one of them. The section defines `fn main(ids: Ids)`.
//! A `//! requires spirv` or `//! prefers spirv` line sends the entry through wgrad's own
//! SPIR-V compilation (`kernels::spirv`); such kernels may bind an operand as `half raw16`,
//! an `array<vec4<f32>>` of raw f16 or bf16 bits, whose matrices take the launch's type.
//!
//! Kernels never declare their storage bindings themselves: the prelude does, from the
//! signature and the launch's dtypes, and gives each binding `x` accessors that hide its
//! storage format:
//!
//! * `ld_x(i) -> f32` and, for written bindings, `st_x(i, v: f32)`, for f32, f16 and bf16
//!   data; all arithmetic is f32;
//! * for f16 on an adapter with SHADER_F16 the array is `array<f16>`; without it, f16 is stored
//!   packed two to a `u32` word (the same bytes), read with `unpack2x16float` and written with
//!   an `atomicAnd` that clears the thread's half followed by an `atomicOr` that sets it, so
//!   two threads writing the two halves of one word cannot lose each other's value;
//! * bf16 is packed the same way (WGSL has no bf16 type): reading is a shift into the high
//!   half of an f32, writing rounds to nearest even (`bf16_round`); except in a kernel whose
//!   16-bit values become bf16 (`halves_hold_bf16`), where bf16 data is declared like native
//!   f16 and the rewrite makes it bf16 storage;
//! * u32 bindings get `ld_x(i) -> u32` and `st_x(i, v: u32)`;
//! * every binding also gets `ldf_x` / `stf_x`, an f32 view (converting for u32), so one body
//!   can cast between any two dtypes.
//!
//! The prelude also defines the launch's constants (`const WG: u32 = 256u;` and any others),
//! the family's op codes (see `decl`), `struct Ids` (the builtins, subgroup ones included
//! only when the adapter has subgroups), `flat_id(ids)` for 1-D kernels laid out on a 2-D
//! grid, and, when the kernel calls them, workgroup reductions `block_sum` / `block_max` built
//! on subgroup operations where available and the helpers of `shaders/common.wgsl`.

use super::decl::Codes;
use crate::device::stream::{PARAMS_BINDING, storage_binding};
use crate::dtype::DType;
use std::fmt::Write;

/// How f16 storage is accessed in generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum F16Mode {
    /// `array<f16>` (SHADER_F16).
    Native,
    /// Two halves per `u32` word.
    Packed,
}

/// The capability set a kernel is composed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// f16 storage access.
    pub f16: F16Mode,
    /// Subgroup operations available.
    pub subgroups: bool,
}

/// What a binding may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The op's float dtype (f32, f16 or bf16).
    Data,
    /// Any dtype (cast).
    Any,
    /// Always u32.
    U32,
    /// Always f32 (statistics saved for backward passes, partial sums).
    F32,
    /// Always f16 (tensor-core kernels).
    F16,
    /// f16 or bf16, read-only: an operand of a tensor-core kernel compiled by wgrad, declared
    /// as f16 whatever the launch binds; where it binds bf16 the module's 16-bit values
    /// become bf16 (`kernels::spirv::bf16_halves`), or with `raw16` the operand matrices
    /// carried in f32 (`kernels::spirv::bf16_operands`).
    Half,
}

impl Elem {
    fn parse(s: &str) -> Option<Elem> {
        Some(match s {
            "data" => Elem::Data,
            "any" => Elem::Any,
            "u32" => Elem::U32,
            "f32" => Elem::F32,
            "f16" => Elem::F16,
            "half" => Elem::Half,
            _ => return None,
        })
    }

    /// Whether `d` fits.
    pub fn allows(self, d: DType) -> bool {
        match self {
            Elem::Data => d.is_float(),
            Elem::Any => true,
            Elem::U32 => d == DType::U32,
            Elem::F32 => d == DType::F32,
            Elem::F16 => d == DType::F16,
            Elem::Half => matches!(d, DType::F16 | DType::BF16),
        }
    }

    /// The dtypes a validation run tries.
    pub fn candidates(self) -> &'static [DType] {
        match self {
            Elem::Data => &[DType::F32, DType::F16, DType::BF16],
            Elem::Any => &[DType::F32, DType::F16, DType::BF16, DType::U32],
            Elem::U32 => &[DType::U32],
            Elem::F32 => &[DType::F32],
            Elem::F16 => &[DType::F16],
            Elem::Half => &[DType::F16, DType::BF16],
        }
    }
}

/// One storage binding of an entry point, as its signature line declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// WGSL name of the array (`x` gives `ld_x`, `st_x`).
    pub name: &'static str,
    /// What it may hold.
    pub elem: Elem,
    /// Whether the kernel writes it.
    pub write: bool,
    /// Declared as an array of 4-element vectors (`vec4` on the signature line; float
    /// bindings): `ld4_x(j)` reads elements 4j .. 4j + 3 as one 16-byte (f32) or 8-byte (f16)
    /// load, and `ld_x(i)` still reads one element; a writable one has `st4_x(j, v)` only
    /// (one plain store of four elements, where a single packed f16 or bf16 element would
    /// need atomics).
    pub vec4: bool,
    /// Declared as `array<vec4<f32>>` whatever its dtype (`raw16` on the signature line;
    /// read-only): 16-byte runs of raw bits (8 halves of f16 or bf16) that the kernel moves,
    /// for the `//! requires spirv` kernels (`kernels::spirv`). No element accessors; the
    /// constant `x_bf16` says which type the runs carry.
    pub raw16: bool,
}

/// An entry point's signature: its bindings and the constant sets it is checked with.
#[derive(Clone, Debug)]
pub struct EntrySig {
    /// Entry name.
    pub name: &'static str,
    /// Storage bindings in binding order.
    pub bindings: Vec<Binding>,
    /// `check` lines: each a list of (constant, values); `WG` among them.
    pub checks: Vec<Vec<(&'static str, Vec<u32>)>>,
    /// A `//! requires subgroups` line: the entry reads the subgroup builtins of `Ids` and
    /// is only built for adapters with subgroups.
    pub subgroups: bool,
    /// A `//! requires spirv` line: the entry is compiled by wgrad and its f32 operand
    /// matrices retyped to f16 (`kernels::spirv`); only adapters with `Caps::spirv` build it.
    pub spirv: bool,
    /// A `//! prefers spirv` line: compiled by wgrad (`kernels::spirv`, loops kept rolled)
    /// where the adapter takes its SPIR-V, by wgpu elsewhere.
    pub prefers_spirv: bool,
}

impl EntrySig {
    /// The workgroup sizes its check lines allow (256 when none is given).
    pub fn wgs(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .checks
            .iter()
            .flat_map(|c| {
                c.iter()
                    .filter(|(n, _)| *n == "WG")
                    .flat_map(|(_, v)| v.clone())
            })
            .collect();
        if v.is_empty() {
            v.push(256);
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every composition the check lines describe, as (WG, other constants).
    pub fn compositions(&self) -> Vec<(u32, Vec<(&'static str, u32)>)> {
        let lines = if self.checks.is_empty() {
            vec![vec![("WG", vec![256])]]
        } else {
            self.checks.clone()
        };
        let mut out = Vec::new();
        for line in lines {
            // The cartesian product of the line's value lists.
            let mut combos: Vec<Vec<(&'static str, u32)>> = vec![Vec::new()];
            for (name, values) in &line {
                let mut next = Vec::new();
                for c in &combos {
                    for &v in values {
                        let mut c2 = c.clone();
                        c2.push((*name, v));
                        next.push(c2);
                    }
                }
                combos = next;
            }
            for c in combos {
                let wg = c.iter().find(|(n, _)| *n == "WG").map_or(256, |x| x.1);
                let rest: Vec<(&'static str, u32)> =
                    c.into_iter().filter(|(n, _)| *n != "WG").collect();
                out.push((wg, rest));
            }
        }
        out
    }

    /// Whether a launch's constant names match one check line's.
    pub fn accepts_consts(&self, consts: &[(&str, u32)]) -> bool {
        if self.checks.is_empty() {
            return consts.is_empty();
        }
        self.checks.iter().any(|line| {
            let names: Vec<&str> = line.iter().map(|x| x.0).filter(|n| *n != "WG").collect();
            names.len() == consts.len() && names.iter().zip(consts).all(|(a, b)| *a == b.0)
        })
    }
}

const ENTRY: &str = "//! entry ";
const CHECK: &str = "//! check ";
const NEEDS_SUBGROUPS: &str = "//! requires subgroups";
const NEEDS_SPIRV: &str = "//! requires spirv";
const PREFERS_SPIRV: &str = "//! prefers spirv";

/// Parses the signature line `name(b: kind [mut], ...)`.
fn parse_signature(line: &'static str) -> Result<(&'static str, Vec<Binding>), String> {
    let open = line
        .find('(')
        .ok_or_else(|| format!("no '(' in {line:?}"))?;
    let close = line
        .rfind(')')
        .ok_or_else(|| format!("no ')' in {line:?}"))?;
    let name = line[..open].trim();
    let mut bindings = Vec::new();
    for part in line[open + 1..close].split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (bname, rest) = part
            .split_once(':')
            .ok_or_else(|| format!("binding {part:?} of {name} has no ':'"))?;
        let mut words = rest.split_whitespace();
        let kind = words.next().unwrap_or("");
        let elem = Elem::parse(kind)
            .ok_or_else(|| format!("binding {part:?} of {name}: unknown kind {kind:?}"))?;
        let (mut write, mut vec4, mut raw16) = (false, false, false);
        for w in words {
            match w {
                "mut" => write = true,
                "vec4" => vec4 = true,
                "raw16" => raw16 = true,
                w => return Err(format!("binding {part:?} of {name}: unexpected {w:?}")),
            }
        }
        if vec4 && !matches!(elem, Elem::Data | Elem::F32 | Elem::F16 | Elem::Half) {
            return Err(format!(
                "binding {part:?} of {name}: vec4 is for float bindings"
            ));
        }
        if raw16 && elem != Elem::Half {
            return Err(format!(
                "binding {part:?} of {name}: raw16 operands are half"
            ));
        }
        if elem == Elem::Half && write {
            return Err(format!(
                "binding {part:?} of {name}: half operands are read-only"
            ));
        }
        if raw16 && (write || vec4) {
            return Err(format!(
                "binding {part:?} of {name}: raw16 is read-only and not vec4"
            ));
        }
        bindings.push(Binding {
            name: bname.trim(),
            elem,
            write,
            vec4,
            raw16,
        });
    }
    // Where a `half` operand holds bf16 every 16-bit value of the module becomes bf16
    // (`halves_hold_bf16`): an `f16` binding beside it would be read as bf16.
    let kinds = |e: Elem| bindings.iter().any(|b| b.elem == e);
    if kinds(Elem::Half) && kinds(Elem::F16) {
        return Err(format!("entry {name}: half and f16 bindings in one entry"));
    }
    Ok((name, bindings))
}

/// Every entry point of a family file with its signature, in file order.
pub fn parse_entries(source: &'static str) -> Result<Vec<EntrySig>, String> {
    let mut out: Vec<EntrySig> = Vec::new();
    for line in source.lines() {
        if let Some(sig) = line.strip_prefix(ENTRY) {
            let (name, bindings) = parse_signature(sig)?;
            out.push(EntrySig {
                name,
                bindings,
                checks: Vec::new(),
                subgroups: false,
                spirv: false,
                prefers_spirv: false,
            });
        } else if line.trim_end() == NEEDS_SUBGROUPS {
            let Some(e) = out.last_mut() else {
                return Err(format!("requires line before any entry: {line:?}"));
            };
            e.subgroups = true;
        } else if line.trim_end() == NEEDS_SPIRV {
            let Some(e) = out.last_mut() else {
                return Err(format!("requires line before any entry: {line:?}"));
            };
            e.spirv = true;
        } else if line.trim_end() == PREFERS_SPIRV {
            let Some(e) = out.last_mut() else {
                return Err(format!("prefers line before any entry: {line:?}"));
            };
            e.prefers_spirv = true;
        } else if let Some(check) = line.strip_prefix(CHECK) {
            let Some(e) = out.last_mut() else {
                return Err(format!("check line before any entry: {line:?}"));
            };
            let mut set = Vec::new();
            for kv in check.split_whitespace() {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("{}: bad check item {kv:?}", e.name))?;
                let values = v
                    .split(',')
                    .map(|x| x.parse::<u32>())
                    .collect::<std::result::Result<Vec<u32>, _>>()
                    .map_err(|_| format!("{}: bad check value {kv:?}", e.name))?;
                set.push((k, values));
            }
            // A launch carries at most MAX_CONSTS constants besides WG: a check line with more
            // would describe a launch that can never be made (caught here, on every adapter).
            if set.iter().filter(|(k, _)| *k != "WG").count() > super::pipeline::MAX_CONSTS {
                return Err(format!(
                    "{}: more than {} constants",
                    e.name,
                    super::pipeline::MAX_CONSTS
                ));
            }
            e.checks.push(set);
        }
    }
    Ok(out)
}

/// Extracts the shared part of a family file plus the section of one entry point.
pub fn select_entry<'a>(source: &'a str, entry: &str) -> Option<(&'a str, &'a str)> {
    let first = source.find(ENTRY)?;
    let common = &source[..first];
    let mut rest = &source[first..];
    while let Some(line_end) = rest.find('\n') {
        let sig = &rest[ENTRY.len()..line_end];
        let name = sig.split('(').next().unwrap_or("").trim();
        let body_start = line_end + 1;
        let next = rest[body_start..]
            .find(ENTRY)
            .map_or(rest.len(), |p| body_start + p);
        if name == entry {
            return Some((common, &rest[body_start..next]));
        }
        if next == rest.len() {
            break;
        }
        rest = &rest[next..];
    }
    None
}

/// Whether entry `sig`, with binding `i` holding bf16 where `is_bf16(i)`, is built with its
/// 16-bit values as bf16 (`kernels::spirv::bf16_halves`): where a `half` operand is bound to
/// bf16.
pub fn halves_hold_bf16(sig: &EntrySig, is_bf16: impl Fn(usize) -> bool) -> bool {
    sig.bindings
        .iter()
        .enumerate()
        .any(|(i, b)| b.elem == Elem::Half && is_bf16(i))
}

/// The full WGSL for one pipeline: entry `sig` of `source`, its bindings holding `dtypes`.
#[allow(clippy::too_many_arguments)]
pub fn compose(
    target: Target,
    source: &str,
    sig: &EntrySig,
    wg: u32,
    consts: &[(&str, u32)],
    dtypes: &[DType],
    codes: &[Codes],
    extra_enables: &[&str],
) -> Option<String> {
    let (common, section) = select_entry(source, sig.name)?;
    if dtypes.len() != sig.bindings.len() {
        return None;
    }
    let mut s = String::with_capacity(source.len() + 4096);
    if target.f16 == F16Mode::Native {
        s.push_str("enable f16;\n");
    }
    for e in extra_enables {
        let _ = writeln!(s, "enable {e};");
    }
    let _ = writeln!(s, "const WG: u32 = {wg}u;");
    for (name, v) in consts {
        let _ = writeln!(s, "const {name}: u32 = {v}u;");
    }
    for set in codes {
        for (name, v) in set.consts {
            let _ = writeln!(s, "const {name}: u32 = {v}u;");
        }
    }
    s.push_str("struct Ids {\n  @builtin(local_invocation_index) lid: u32,\n  @builtin(local_invocation_id) lid3: vec3<u32>,\n  @builtin(workgroup_id) wid: vec3<u32>,\n  @builtin(num_workgroups) nwg: vec3<u32>,\n");
    if target.subgroups {
        s.push_str("  @builtin(subgroup_size) sg_size: u32,\n  @builtin(subgroup_invocation_id) sg_lane: u32,\n  @builtin(subgroup_id) sg_id: u32,\n  @builtin(num_subgroups) sg_num: u32,\n");
    }
    s.push_str("}\n");
    s.push_str("// One thread per element on a grid of up to 65535 x N workgroups of WG threads.\nfn flat_id(ids: Ids) -> u32 { return (ids.wid.y * ids.nwg.x + ids.wid.x) * WG + ids.lid; }\n");
    let _ = writeln!(
        s,
        "@group(0) @binding({PARAMS_BINDING}) var<uniform> p: Params;"
    );
    // Where the module's 16-bit values become bf16 (`halves_hold_bf16`), bf16 data is declared
    // as f16 too, so the rewrite makes it bf16 storage: outputs are written with the device's
    // conversion and 16-bit stores instead of integer rounding into packed words (with an
    // atomic pair per element where one is stored alone).
    let bf16_storage =
        target.f16 == F16Mode::Native && halves_hold_bf16(sig, |i| dtypes[i] == DType::BF16);
    for (i, (b, &dt)) in sig.bindings.iter().zip(dtypes).enumerate() {
        let dt = if bf16_storage && dt == DType::BF16 && b.elem == Elem::Data {
            DType::F16
        } else {
            dt
        };
        declare(&mut s, target, storage_binding(i), b, dt);
    }
    let mut body = unroll(&format!("{common}{section}"), wg, consts)?;
    for set in codes {
        body.push_str(set.wgsl);
    }
    // Shared helpers (shaders/common.wgsl) the kernel calls but does not define, and the
    // helpers they call in turn.
    loop {
        let missing: Vec<&str> = library()
            .filter(|(kind, name, _)| {
                let (used, defined) = if *kind == "fn" {
                    (format!("{name}("), format!("fn {name}("))
                } else {
                    (name.to_string(), format!("struct {name}"))
                };
                // The prelude's accessors call helpers too (bf16 packing).
                (body.contains(&used) || s.contains(&used)) && !body.contains(&defined)
            })
            .map(|(_, _, code)| code)
            .collect();
        if missing.is_empty() {
            break;
        }
        for code in missing {
            body.push_str(code);
        }
    }
    if body.contains("block_sum(") || body.contains("block_max(") {
        s.push_str(if target.subgroups {
            REDUCE_SUBGROUP
        } else {
            REDUCE_SHARED
        });
    }
    s.push_str(&body);
    Some(s)
}

/// Expands `//! unroll NAME in A..B` ... `//! end` blocks: the lines between are repeated for
/// NAME = A, A + 1, ..., B - 1, with each `$NAME` replaced by the value (`3u`). A and B are
/// numbers or the names of the launch's constants (`WG` among them); blocks nest. Loops the
/// kernels need unrolled are written this way because whether a driver unrolls a constant
/// loop depends on its size: a store loop left rolled makes an accumulator array dynamically
/// indexed, and lavapipe then keeps it in memory for the whole kernel (2.4x slower).
pub fn unroll(src: &str, wg: u32, consts: &[(&str, u32)]) -> Option<String> {
    const OPEN: &str = "//! unroll ";
    const END: &str = "//! end";
    let value = |t: &str| -> Option<u32> {
        let t = t.trim().trim_end_matches('u');
        t.parse().ok().or_else(|| {
            if t == "WG" {
                Some(wg)
            } else {
                consts.iter().find(|c| c.0 == t).map(|c| c.1)
            }
        })
    };
    let lines: Vec<&str> = src.lines().collect();
    // Expands lines[start..end] (no unmatched blocks inside) into `out`.
    fn expand(lines: &[&str], value: &dyn Fn(&str) -> Option<u32>, out: &mut String) -> Option<()> {
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i];
            let Some(spec) = l.trim_start().strip_prefix(OPEN) else {
                if l.trim_start().starts_with(END) {
                    return None;
                }
                out.push_str(l);
                out.push('\n');
                i += 1;
                continue;
            };
            let (name, range) = spec.split_once(" in ")?;
            let (a, b) = range.split_once("..")?;
            let (a, b) = (value(a)?, value(b)?);
            // Find the matching end.
            let mut depth = 1;
            let mut j = i + 1;
            while j < lines.len() {
                let t = lines[j].trim_start();
                if t.starts_with(OPEN) {
                    depth += 1;
                } else if t.starts_with(END) {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                j += 1;
            }
            if depth != 0 {
                return None;
            }
            let pat = format!("${}", name.trim());
            for v in a..b {
                let body: Vec<String> = lines[i + 1..j]
                    .iter()
                    .map(|l| l.replace(&pat, &format!("{v}u")))
                    .collect();
                let body: Vec<&str> = body.iter().map(String::as_str).collect();
                expand(&body, value, out)?;
            }
            i = j + 1;
        }
        Some(())
    }
    let mut out = String::with_capacity(src.len());
    expand(&lines, &value, &mut out)?;
    Some(out)
}

/// The helpers of shaders/common.wgsl as (kind, name, code), one per `//! fn NAME` or
/// `//! struct NAME` section.
fn library() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    const LIB: &str = include_str!("../../shaders/common.wgsl");
    LIB.split("\n//! ").skip(1).filter_map(|sec| {
        let nl = sec.find('\n')?;
        let (kind, name) = sec[..nl].trim().split_once(' ')?;
        Some((kind, name.trim(), &sec[nl + 1..]))
    })
}

fn declare(s: &mut String, target: Target, binding: u32, d: &Binding, dtype: DType) {
    let n = d.name;
    if d.raw16 {
        // Read-only in the shader (NonWritable in its SPIR-V), though the bind group's
        // layout has every storage binding read-write: the driver may then read it through
        // the cache for constant data. Only wgrad-compiled kernels have such bindings.
        let _ = writeln!(
            s,
            "@group(0) @binding({binding}) var<storage, read> {n}: array<vec4<f32>>;"
        );
        // Which 16-bit type the runs carry, for kernels that also read them as numbers.
        let _ = writeln!(s, "const {n}_bf16: bool = {};", dtype == DType::BF16);
        return;
    }
    // A `half` operand is declared as f16 whatever the launch binds (see `Elem::Half`).
    let dtype = if d.elem == Elem::Half {
        DType::F16
    } else {
        dtype
    };
    let at = format!("@group(0) @binding({binding}) var<storage, read_write> {n}");
    // Float views (`ldf_x`, `stf_x`) exist for every binding, so one kernel body can convert
    // between any two dtypes (cast); for float storage they are the plain accessors.
    if dtype != DType::U32 {
        let _ = writeln!(s, "fn ldf_{n}(i_: u32) -> f32 {{ return ld_{n}(i_); }}");
        if d.write && !d.vec4 {
            let _ = writeln!(s, "fn stf_{n}(i_: u32, v_: f32) {{ st_{n}(i_, v_); }}");
        }
    }
    if d.vec4 {
        let decl = match (dtype, target.f16) {
            (DType::F32, _) => format!(
                "{at}: array<vec4<f32>>;\nfn ld4_{n}(j_: u32) -> vec4<f32> {{ return {n}[j_]; }}\nfn ld_{n}(i_: u32) -> f32 {{ return {n}[i_ >> 2u][i_ & 3u]; }}"
            ),
            (DType::F16, F16Mode::Native) => format!(
                "{at}: array<vec4<f16>>;\nfn ld4_{n}(j_: u32) -> vec4<f32> {{ return vec4<f32>({n}[j_]); }}\nfn ld_{n}(i_: u32) -> f32 {{ return f32({n}[i_ >> 2u][i_ & 3u]); }}"
            ),
            (DType::F16, F16Mode::Packed) => format!(
                "{at}: array<vec2<u32>>;\nfn ld4_{n}(j_: u32) -> vec4<f32> {{ let w_ = {n}[j_]; return vec4<f32>(unpack2x16float(w_.x), unpack2x16float(w_.y)); }}\nfn ld_{n}(i_: u32) -> f32 {{ return unpack2x16float({n}[i_ >> 2u][(i_ >> 1u) & 1u])[i_ & 1u]; }}"
            ),
            (DType::BF16, _) => format!(
                "{at}: array<vec2<u32>>;\nfn ld4_{n}(j_: u32) -> vec4<f32> {{ let w_ = {n}[j_]; return vec4<f32>(bitcast<f32>(w_.x << 16u), bitcast<f32>(w_.x & 0xffff0000u), bitcast<f32>(w_.y << 16u), bitcast<f32>(w_.y & 0xffff0000u)); }}\nfn ld_{n}(i_: u32) -> f32 {{ return bf16_unpack({n}[i_ >> 2u][(i_ >> 1u) & 1u], i_); }}"
            ),
            // The parser only allows vec4 on float bindings.
            (DType::U32, _) => String::new(),
        };
        let _ = writeln!(s, "{decl}");
        if d.write {
            let store = match (dtype, target.f16) {
                (DType::F32, _) => "v_",
                (DType::F16, F16Mode::Native) => "vec4<f16>(v_)",
                (DType::F16, F16Mode::Packed) => {
                    "vec2<u32>(f16_bits(v_.x) | (f16_bits(v_.y) << 16u), f16_bits(v_.z) | (f16_bits(v_.w) << 16u))"
                }
                (DType::BF16, _) => {
                    "vec2<u32>(bf16_round(v_.x) | (bf16_round(v_.y) << 16u), bf16_round(v_.z) | (bf16_round(v_.w) << 16u))"
                }
                (DType::U32, _) => return,
            };
            let _ = writeln!(
                s,
                "fn st4_{n}(j_: u32, v_: vec4<f32>) {{ {n}[j_] = {store}; }}"
            );
            // One element of a vec4 binding, where the element is its own word or half (a
            // store to a vector's component). Packed halves take a read-modify-write of their
            // word, which is not atomic: a kernel stores them one by one only where no other
            // invocation writes the word's other half (`wide` and the attention `_reg` entries
            // store bf16 as 16-bit values instead: `halves_hold_bf16`).
            let one = match (dtype, target.f16) {
                (DType::F32, _) => Some("v_"),
                (DType::F16, F16Mode::Native) => Some("f16(v_)"),
                _ => None,
            };
            let bits = match (dtype, target.f16) {
                (DType::F16, F16Mode::Packed) => Some("f16_bits(v_)"),
                (DType::BF16, _) => Some("bf16_round(v_)"),
                _ => None,
            };
            if let Some(one) = one {
                let _ = writeln!(
                    s,
                    "fn st_{n}(i_: u32, v_: f32) {{ {n}[i_ >> 2u][i_ & 3u] = {one}; }}"
                );
            } else if let Some(bits) = bits {
                let _ = writeln!(
                    s,
                    "fn st_{n}(i_: u32, v_: f32) {{ let h_ = (i_ >> 1u) & 1u; let s_ = (i_ & 1u) * 16u; let w_ = {n}[i_ >> 2u][h_]; {n}[i_ >> 2u][h_] = (w_ & ~(0xffffu << s_)) | ({bits} << s_); }}"
                );
            }
        }
        return;
    }
    match (dtype, target.f16) {
        (DType::F32, _) => {
            let _ = writeln!(
                s,
                "{at}: array<f32>;\nfn ld_{n}(i_: u32) -> f32 {{ return {n}[i_]; }}"
            );
            if d.write {
                let _ = writeln!(s, "fn st_{n}(i_: u32, v_: f32) {{ {n}[i_] = v_; }}");
            }
        }
        (DType::U32, _) => {
            let _ = writeln!(
                s,
                "{at}: array<u32>;\nfn ld_{n}(i_: u32) -> u32 {{ return {n}[i_]; }}\nfn ldf_{n}(i_: u32) -> f32 {{ return f32({n}[i_]); }}"
            );
            if d.write {
                let _ = writeln!(
                    s,
                    "fn st_{n}(i_: u32, v_: u32) {{ {n}[i_] = v_; }}\nfn stf_{n}(i_: u32, v_: f32) {{ {n}[i_] = u32(max(v_, 0.0)); }}"
                );
            }
        }
        (DType::F16, F16Mode::Native) => {
            let _ = writeln!(
                s,
                "{at}: array<f16>;\nfn ld_{n}(i_: u32) -> f32 {{ return f32({n}[i_]); }}"
            );
            if d.write {
                let _ = writeln!(s, "fn st_{n}(i_: u32, v_: f32) {{ {n}[i_] = f16(v_); }}");
            }
        }
        // bf16 is the high half of an f32: reading is a shift; every adapter packs it (WGSL
        // has no bf16 type), written like packed f16.
        (DType::BF16, _) if !d.write => {
            let _ = writeln!(
                s,
                "{at}: array<u32>;\nfn ld_{n}(i_: u32) -> f32 {{ return bf16_unpack({n}[i_ >> 1u], i_); }}"
            );
        }
        (DType::BF16, _) => {
            let _ = writeln!(
                s,
                "{at}: array<atomic<u32>>;
fn ld_{n}(i_: u32) -> f32 {{ return bf16_unpack(atomicLoad(&{n}[i_ >> 1u]), i_); }}
fn st_{n}(i_: u32, v_: f32) {{
  let h = bf16_round(v_);
  let sh = (i_ & 1u) * 16u;
  atomicAnd(&{n}[i_ >> 1u], ~(0xffffu << sh));
  atomicOr(&{n}[i_ >> 1u], h << sh);
}}"
            );
        }
        (DType::F16, F16Mode::Packed) if !d.write => {
            let _ = writeln!(
                s,
                "{at}: array<u32>;\nfn ld_{n}(i_: u32) -> f32 {{ return unpack2x16float({n}[i_ >> 1u])[i_ & 1u]; }}"
            );
        }
        (DType::F16, F16Mode::Packed) => {
            let _ = writeln!(
                s,
                "{at}: array<atomic<u32>>;
fn ld_{n}(i_: u32) -> f32 {{ return unpack2x16float(atomicLoad(&{n}[i_ >> 1u]))[i_ & 1u]; }}
fn st_{n}(i_: u32, v_: f32) {{
  let h = f16_bits(v_);
  let sh = (i_ & 1u) * 16u;
  atomicAnd(&{n}[i_ >> 1u], ~(0xffffu << sh));
  atomicOr(&{n}[i_ >> 1u], h << sh);
}}"
            );
        }
    }
}

/// Workgroup reductions in workgroup memory only (a tree; WG is a power of two). Every thread
/// of the workgroup must call them, in uniform control flow; every thread gets the result.
const REDUCE_SHARED: &str = "
var<workgroup> red_scratch: array<f32, WG>;
fn block_sum(v: f32, ids: Ids) -> f32 {
  workgroupBarrier();
  red_scratch[ids.lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (ids.lid < s) { red_scratch[ids.lid] = red_scratch[ids.lid] + red_scratch[ids.lid + s]; }
    workgroupBarrier();
  }
  return red_scratch[0];
}
fn block_max(v: f32, ids: Ids) -> f32 {
  workgroupBarrier();
  red_scratch[ids.lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (ids.lid < s) { red_scratch[ids.lid] = max(red_scratch[ids.lid], red_scratch[ids.lid + s]); }
    workgroupBarrier();
  }
  return red_scratch[0];
}
";

/// The same reductions with subgroup operations: one reduction per subgroup, one partial per
/// subgroup in workgroup memory, then every thread folds the few partials.
const REDUCE_SUBGROUP: &str = "
var<workgroup> red_scratch: array<f32, WG>;
fn block_sum(v: f32, ids: Ids) -> f32 {
  let s = subgroupAdd(v);
  workgroupBarrier();
  if (ids.sg_lane == 0u) { red_scratch[ids.sg_id] = s; }
  workgroupBarrier();
  var t = 0.0;
  for (var i = 0u; i < ids.sg_num; i = i + 1u) { t = t + red_scratch[i]; }
  return t;
}
fn block_max(v: f32, ids: Ids) -> f32 {
  let s = subgroupMax(v);
  workgroupBarrier();
  if (ids.sg_lane == 0u) { red_scratch[ids.sg_id] = s; }
  workgroupBarrier();
  var t = red_scratch[0];
  for (var i = 1u; i < ids.sg_num; i = i + 1u) { t = max(t, red_scratch[i]); }
  return t;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_signatures() {
        let src = "// head\nfn shared() {}\n//! entry a(x: data, y: u32 mut)\n//! check WG=64,128 Q=2\nfn main() { A }\n//! entry b()\nfn main() { B }\n";
        assert!(
            select_entry(src, "a")
                .is_some_and(|(c, a)| c.contains("shared") && a.contains('A') && !a.contains('B'))
        );
        assert!(select_entry(src, "b").is_some_and(|(_, b)| b.contains('B') && !b.contains('A')));
        assert!(select_entry(src, "c").is_none());
        let e = parse_entries(src).unwrap_or_default();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "a");
        assert_eq!(
            e[0].bindings,
            vec![
                Binding {
                    name: "x",
                    elem: Elem::Data,
                    write: false,
                    vec4: false,
                    raw16: false,
                },
                Binding {
                    name: "y",
                    elem: Elem::U32,
                    write: true,
                    vec4: false,
                    raw16: false,
                }
            ]
        );
        assert_eq!(e[0].wgs(), vec![64, 128]);
        assert_eq!(e[0].compositions().len(), 2);
        assert!(e[0].accepts_consts(&[("Q", 7)]) && !e[0].accepts_consts(&[]));
        assert!(e[1].bindings.is_empty() && e[1].accepts_consts(&[]));
        assert!(parse_entries("//! entry z(x: float)\n").is_err());
        assert!(parse_entries("//! entry z(x: data vec4)\n").is_ok_and(|e| e[0].bindings[0].vec4));
        assert!(
            parse_entries("//! entry z(x: half raw16)\n").is_ok_and(|e| e[0].bindings[0].raw16)
        );
        assert!(parse_entries("//! entry z(x: half mut raw16)\n").is_err());
        assert!(parse_entries("//! entry z(x: f16 raw16)\n").is_err());
        assert!(parse_entries("//! entry z(x: half vec4)\n").is_ok_and(|e| e[0].bindings[0].vec4));
        assert!(parse_entries("//! entry z(x: half mut)\n").is_err());
        assert!(parse_entries("//! entry z(x: half, y: f16)\n").is_err());
        assert!(parse_entries("//! entry z(x: half, y: data mut)\n").is_ok());
        assert!(
            parse_entries("//! entry z(x: data mut vec4)\n").is_ok_and(|e| e[0].bindings[0].write)
        );
        assert!(parse_entries("//! entry z(x: u32 vec4)\n").is_err());
    }

    #[test]
    fn unrolling() {
        let src =
            "a\n//! unroll i in 0..N\n//! unroll j in 1..3\nx[$i][$j];\n//! end\n//! end\nb\n";
        assert_eq!(
            unroll(src, 64, &[("N", 2)]).as_deref(),
            Some("a\nx[0u][1u];\nx[0u][2u];\nx[1u][1u];\nx[1u][2u];\nb\n")
        );
        assert_eq!(
            unroll("//! unroll i in 0..WG\n$i\n//! end\n", 2, &[]).as_deref(),
            Some("0u\n1u\n")
        );
        // Unknown bounds and unbalanced blocks are refused.
        assert!(unroll("//! unroll i in 0..Q\n//! end\n", 64, &[]).is_none());
        assert!(unroll("//! unroll i in 0..2\n", 64, &[]).is_none());
        assert!(unroll("//! end\n", 64, &[]).is_none());
    }

    /// bf16 data is declared as 16-bit values exactly where the module's halves become bf16:
    /// a `half` operand bound to bf16 on a native-f16 target. Elsewhere it stays packed.
    #[test]
    fn bf16_data_is_16_bit_where_halves_become_bf16() {
        let src = "//! entry e(x: half, y: data mut, z: data mut vec4)\n\
                   //! requires spirv\nfn main(ids: Ids) {}\n";
        let Ok(entries) = parse_entries(src) else {
            panic!("signature parses");
        };
        let sig = &entries[0];
        let native = Target {
            f16: F16Mode::Native,
            subgroups: true,
        };
        let packed = Target {
            f16: F16Mode::Packed,
            ..native
        };
        let bf = DType::BF16;
        let wgsl = |t: Target, d: &[DType]| compose(t, src, sig, 64, &[], d, &[], &[]);
        let Some(halves) = wgsl(native, &[bf, bf, bf]) else {
            panic!("composes");
        };
        assert!(
            halves.contains("var<storage, read_write> y: array<f16>;"),
            "{halves}"
        );
        assert!(halves.contains("var<storage, read_write> z: array<vec4<f16>>;"));
        assert!(!halves.contains("atomic") && !halves.contains("bf16_round("));
        // f16 operands, or a target without native f16: bf16 data in packed words.
        for (t, x) in [(native, DType::F16), (packed, bf)] {
            let Some(words) = wgsl(t, &[x, bf, bf]) else {
                panic!("composes");
            };
            assert!(words.contains("y: array<atomic<u32>>;"), "{words}");
            assert!(words.contains("z: array<vec2<u32>>;") && words.contains("bf16_round("));
        }
        assert!(halves_hold_bf16(sig, |i| i == 0));
        assert!(!halves_hold_bf16(sig, |i| i > 0));
    }
}
