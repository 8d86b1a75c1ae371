//! Builds the WGSL a pipeline is compiled from: a generated prelude, then one kernel family's
//! file, cut down to the entry point asked for.
//!
//! A family file (`shaders/*.wgsl`) holds code shared by its entry points, then one section per
//! entry point, each opened by a line `//! entry NAME` and defining `fn main(ids: Ids)`. Kernels
//! never declare their storage bindings: the prelude does, from the launch's arguments, and
//! gives each binding `x` accessors that hide its storage format:
//!
//! * `ld_x(i) -> f32` and, for written bindings, `st_x(i, v: f32)`, for f32 and f16 data;
//!   all arithmetic is f32;
//! * for f16 on an adapter with SHADER_F16 the array is `array<f16>`; without it, f16 is stored
//!   packed two to a `u32` word (the same bytes), read with `unpack2x16float` and written with
//!   an `atomicAnd` that clears the thread's half followed by an `atomicOr` that sets it, so
//!   two threads writing the two halves of one word cannot lose each other's value;
//! * u32 bindings get `ld_x(i) -> u32` and `st_x(i, v: u32)`;
//! * every binding also gets `ldf_x` / `stf_x`, an f32 view (converting for u32), so one body
//!   can cast between any two dtypes.
//!
//! The prelude also defines the launch's constants (`const WG: u32 = 256u;` and any others),
//! `struct Ids` (the builtins, subgroup ones included only when the adapter has subgroups),
//! `flat_id(ids)` for 1-D kernels laid out on a 2-D grid, and, when the kernel calls them,
//! workgroup reductions `block_sum` / `block_max` built on subgroup operations where available
//! and the helpers of `shaders/common.wgsl` (erf, tanh, sigmoid, a row's max and sum of exp).

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

/// One storage binding as the prelude declares it.
#[derive(Clone, Copy, Debug)]
pub struct Decl {
    /// WGSL name of the array (`x` gives `ld_x`, `st_x`).
    pub name: &'static str,
    /// Element type of the storage.
    pub dtype: DType,
    /// Whether the kernel writes it.
    pub write: bool,
}

/// Extracts the shared part of a family file plus the section of one entry point.
pub fn select_entry<'a>(source: &'a str, entry: &str) -> Option<(&'a str, &'a str)> {
    let marker = "//! entry ";
    let first = source.find(marker)?;
    let common = &source[..first];
    let mut rest = &source[first..];
    while let Some(line_end) = rest.find('\n') {
        let name = rest[marker.len()..line_end].trim();
        let body_start = line_end + 1;
        let next = rest[body_start..]
            .find(marker)
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

/// Lists the entry points of a family file.
pub fn entries(source: &str) -> Vec<&str> {
    source
        .lines()
        .filter_map(|l| l.strip_prefix("//! entry "))
        .map(str::trim)
        .collect()
}

/// The full WGSL for one pipeline.
pub fn compose(
    target: Target,
    source: &str,
    entry: &str,
    wg: u32,
    consts: &[(&str, u32)],
    decls: &[Decl],
    extra_enables: &[&str],
) -> Option<String> {
    let (common, section) = select_entry(source, entry)?;
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
    s.push_str("struct Ids {\n  @builtin(local_invocation_index) lid: u32,\n  @builtin(local_invocation_id) lid3: vec3<u32>,\n  @builtin(workgroup_id) wid: vec3<u32>,\n  @builtin(num_workgroups) nwg: vec3<u32>,\n");
    if target.subgroups {
        s.push_str("  @builtin(subgroup_size) sg_size: u32,\n  @builtin(subgroup_invocation_id) sg_lane: u32,\n  @builtin(subgroup_id) sg_id: u32,\n  @builtin(num_subgroups) sg_num: u32,\n");
    }
    s.push_str("}\n");
    s.push_str("// One thread per element on a grid of up to 65535 x N workgroups of WG threads.\nfn flat_id(ids: Ids) -> u32 { return (ids.wid.y * ids.nwg.x + ids.wid.x) * WG + ids.lid; }\n");
    s.push_str("@group(0) @binding(0) var<uniform> p: Params;\n");
    for (i, d) in decls.iter().enumerate() {
        declare(&mut s, target, i as u32 + 1, d);
    }
    let mut body = format!("{common}{section}");
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
                body.contains(&used) && !body.contains(&defined)
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

fn declare(s: &mut String, target: Target, binding: u32, d: &Decl) {
    let n = d.name;
    // Float views (`ldf_x`, `stf_x`) exist for every binding, so one kernel body can convert
    // between any two dtypes (cast); for float storage they are the plain accessors.
    if d.dtype != DType::U32 {
        let _ = writeln!(s, "fn ldf_{n}(i_: u32) -> f32 {{ return ld_{n}(i_); }}");
        if d.write {
            let _ = writeln!(s, "fn stf_{n}(i_: u32, v_: f32) {{ st_{n}(i_, v_); }}");
        }
    }
    let at = format!("@group(0) @binding({binding}) var<storage, read_write> {n}");
    match (d.dtype, target.f16) {
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
        (DType::F16, F16Mode::Packed) if !d.write => {
            let _ = writeln!(
                s,
                "{at}: array<u32>;\nfn ld_{n}(i_: u32) -> f32 {{ return unpack2x16float({n}[i_ >> 1u])[i_ & 1u]; }}"
            );
        }
        (DType::F16, F16Mode::Packed) => {
            // pack2x16float is indeterminate outside the f16 range, so overflow and NaN are
            // encoded by hand, as a native f16 conversion would round them.
            let _ = writeln!(
                s,
                "{at}: array<atomic<u32>>;
fn ld_{n}(i_: u32) -> f32 {{ return unpack2x16float(atomicLoad(&{n}[i_ >> 1u]))[i_ & 1u]; }}
fn st_{n}(i_: u32, v_: f32) {{
  var h = pack2x16float(vec2<f32>(v_, 0.0)) & 0xffffu;
  if (v_ != v_) {{ h = 0x7e00u; }} else if (abs(v_) >= 65520.0) {{ h = select(0x7c00u, 0xfc00u, v_ < 0.0); }}
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
    fn sections() {
        let src =
            "// head\nfn shared() {}\n//! entry a\nfn main() { A }\n//! entry b\nfn main() { B }\n";
        assert!(
            select_entry(src, "a")
                .is_some_and(|(c, a)| c.contains("shared") && a.contains('A') && !a.contains('B'))
        );
        assert!(select_entry(src, "b").is_some_and(|(_, b)| b.contains('B') && !b.contains('A')));
        assert!(select_entry(src, "c").is_none());
        assert_eq!(entries(src), vec!["a", "b"]);
    }
}
