//! Kernels compiled to SPIR-V by wgrad itself, for two things their WGSL cannot say: f16
//! operand tiles staged in workgroup memory as 16-byte runs, and loops to be kept rolled.
//!
//! A tensor-core kernel stages tiles of its f16 operands in workgroup memory and reads them
//! back with cooperative loads. WGSL (naga) types a cooperative load by its pointer: an f16
//! matrix must be read through a pointer to f16 or to `vec4<f16>`, so a tile's runs are at
//! most 8 bytes, stored one by one and read through pointers the driver cannot assume 16-byte
//! aligned. SPIR-V has no such rule: a cooperative load may read an f16 matrix through a
//! pointer to any scalar or vector type, its stride counted in that type (NVIDIA's own
//! cooperative-matrix samples stage tiles as `uvec4`). So a kernel that `//! requires
//! spirv` is written with f32 as the carrier of its operand bits: it binds the operands as
//! `array<vec4<f32>>` (8 halves an element, moved, never computed on), stages them in
//! `array<vec4<f32>>` workgroup tiles, and loads `coop_mat16x16<f32, A>` and `<f32, B>`
//! fragments from them. [`compile`] turns it into SPIR-V with naga and the options wgpu's
//! Vulkan backend uses, and [`f16_operands`] retypes those two matrix types to f16: the
//! loads then read f16 fragments from 16-byte runs, and the products are f16 x f16 -> f32,
//! the only kind these kernels compute. [`dont_unroll`] then keeps their loops rolled (the
//! driver's unrolling spilled registers). wgpu hands the result to the driver unchanged
//! (`PASSTHROUGH_SHADERS`, Vulkan only; `Caps::spirv`).
//!
//! bf16 operands move through the same carriers (a run of 8 bf16 values is 16 bytes too):
//! [`bf16_operands`] retypes the two matrix types to bf16 instead, and for kernels that hold
//! their operands as f16 values (the attention's `_reg` entries) [`bf16_halves`] makes every
//! 16-bit value of the module bf16. Both need a device opened with `VK_KHR_shader_bfloat16`
//! (`Caps::coop_bf16_16`).
//!
//! The retyping relies on a rule such kernels keep: f32 A and B matrices serve only as
//! carriers (an f32 accumulator, role C, is a separate type and stays f32). `tests/shaders.rs`
//! compiles every composition and checks that exactly those two types change, and that
//! nothing changes in a kernel that only `prefers spirv`; the f64-reference tests of the
//! products (tests/kernels.rs) check the results on GPUs that run them.
//!
//! An entry that `//! prefers spirv` is compiled the same way where the adapter allows and by
//! wgpu elsewhere: for kernels that run faster with their loops kept rolled (`reg`, the f32
//! product). Every Vulkan adapter takes it, lavapipe included, so CI runs this path.

use crate::error::{Error, Result};

/// What the device offers the compiled module (naga's capabilities and SPIR-V ones).
#[derive(Clone, Copy, Debug)]
pub struct SpirvTarget {
    /// Native f16 (SHADER_F16).
    pub f16: bool,
    /// Subgroup operations.
    pub subgroups: bool,
    /// Cooperative matrices.
    pub coop: bool,
    /// Bounds checks on buffer and array indices (off only with `WGRAD_SHADER_CHECKS=none`).
    pub bounds_checks: bool,
    /// Also loop bounding and checked integer division (`WGRAD_SHADER_CHECKS=full`).
    pub full_checks: bool,
}

/// WGSL to SPIR-V words with naga, as wgpu's Vulkan backend would compile it with wgrad's
/// runtime checks (by default bounds checks on, loop bounding and division checks off; see
/// `ShaderChecks`) and workgroup memory not zeroed. Buffer indices are clamped here even
/// where wgpu would leave them to the driver's robust buffer access: wgrad cannot ask which
/// robustness a device was opened with.
pub fn compile(src: &str, t: SpirvTarget) -> Result<Vec<u32>> {
    use naga::back::spv;
    use naga::valid::Capabilities as C;
    let fail = |what: &str, e: String| Error::Internal(format!("compiling SPIR-V: {what}: {e}"));
    let module =
        naga::front::wgsl::parse_str(src).map_err(|e| fail("parse", e.emit_to_string(src)))?;
    let mut caps = C::SHADER_FLOAT16_IN_FLOAT32;
    let mut spv_caps = vec![spv::Capability::Shader];
    if t.f16 {
        caps |= C::SHADER_FLOAT16;
        spv_caps.push(spv::Capability::Float16);
    }
    if t.subgroups {
        caps |= C::SUBGROUP;
        spv_caps.extend([
            spv::Capability::GroupNonUniform,
            spv::Capability::GroupNonUniformVote,
            spv::Capability::GroupNonUniformArithmetic,
            spv::Capability::GroupNonUniformBallot,
            spv::Capability::GroupNonUniformShuffle,
            spv::Capability::GroupNonUniformShuffleRelative,
            spv::Capability::GroupNonUniformQuad,
        ]);
    }
    if t.coop {
        caps |= C::COOPERATIVE_MATRIX;
        spv_caps.extend([
            spv::Capability::CooperativeMatrixKHR,
            spv::Capability::VulkanMemoryModel,
        ]);
    }
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| fail("validate", e.emit_to_string(src)))?;
    let check = if t.bounds_checks {
        naga::proc::BoundsCheckPolicy::Restrict
    } else {
        naga::proc::BoundsCheckPolicy::Unchecked
    };
    // Element-access stubs are found by name (`element_access`), so such a module keeps
    // its debug names until that pass drops them.
    let names = src.contains("fn coop_get") || src.contains("fn coop_set");
    let opts = spv::Options {
        // SPIR-V 1.6 needs Vulkan 1.3, which every driver with cooperative matrices has.
        lang_version: if t.coop { (1, 6) } else { (1, 3) },
        flags: if names {
            spv::WriterFlags::DEBUG
        } else {
            spv::WriterFlags::empty()
        },
        capabilities: Some(spv_caps.into_iter().collect()),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: check,
            buffer: check,
            image_load: check,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: t.full_checks,
        emit_int_div_checks: t.full_checks,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    spv::write_vec(&module, &info, &opts, Some(&pipeline)).map_err(|e| fail("write", e.to_string()))
}

const OP_TYPE_FLOAT: u32 = 22;
const OP_TYPE_COOP_MATRIX: u32 = 4456;
const OP_CONSTANT: u32 = 43;
/// `Use` operand of OpTypeCooperativeMatrixKHR: MatrixAKHR = 0, MatrixBKHR = 1.
const USE_A: u32 = 0;
const USE_B: u32 = 1;

/// One instruction: its opcode and the index of its first word.
fn instructions(words: &[u32]) -> Result<Vec<(u32, usize)>> {
    let bad = |why: &str| Error::Internal(format!("SPIR-V module: {why}"));
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err(bad("no header"));
    }
    let mut out = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        if count == 0 || i + count > words.len() {
            return Err(bad("truncated instruction"));
        }
        out.push((words[i] & 0xffff, i));
        i += count;
    }
    Ok(out)
}

/// Asks the driver to keep every loop of the module rolled (SPIR-V's DontUnroll loop
/// control; naga leaves the choice to the driver). Returns how many loops it marked.
///
/// The NVIDIA driver unrolled `wide`'s K loop 8 times: 1,024 HMMA instructions, an 80 KB
/// loop body, and with the registers for eight steps' addresses in flight the code spilled
/// to local memory. Kept rolled, it has no spills and runs faster (docs/performance.md,
/// matmul).
pub fn dont_unroll(words: &mut [u32]) -> Result<usize> {
    const OP_LOOP_MERGE: u32 = 246;
    const DONT_UNROLL: u32 = 0x2;
    let mut n = 0;
    for (op, at) in instructions(words)? {
        // OpLoopMerge: merge block, continue target, loop control (no parameters from naga).
        if op == OP_LOOP_MERGE && words[at] >> 16 == 4 {
            words[at + 3] = DONT_UNROLL;
            n += 1;
        }
    }
    Ok(n)
}

/// The 16-bit float a kernel's operand matrices are retyped to ([`f16_operands`],
/// [`bf16_operands`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// IEEE binary16: `OpTypeFloat 16`.
    F16,
    /// bfloat16: `OpTypeFloat 16 BFloat16KHR` (SPV_KHR_bfloat16).
    BF16,
}

impl Half {
    /// The type's OpTypeFloat operands after its id.
    fn operands(self) -> &'static [u32] {
        // FP encoding BFloat16KHR = 0.
        match self {
            Half::F16 => &[16],
            Half::BF16 => &[16, 0],
        }
    }
}

/// Retypes the module's f32 A and B cooperative-matrix types to f16 (see the module docs):
/// their OpTypeCooperativeMatrixKHR instructions name the f16 type instead of f32. Returns
/// how many types it changed. Where the module has no f16 type (every binding f32, as a
/// split product's partials), it declares one (the module has the Float16 capability
/// wherever these kernels run: `SpirvTarget::f16`).
pub fn f16_operands(words: &mut Vec<u32>) -> Result<usize> {
    retype_operands(words, Half::F16)
}

/// [`f16_operands`] for bf16 operands: the A and B matrices become bfloat16 ones, the module
/// declares the bfloat16 type where it has none, and gains SPV_KHR_bfloat16 with the
/// BFloat16TypeKHR and BFloat16CooperativeMatrixKHR capabilities where any type changed.
/// The operands' bits move through the same f32 carriers: a run of 8 bf16 values is 16 bytes
/// as 8 f16 ones are. Only for devices opened with `VK_KHR_shader_bfloat16`
/// (`Caps::coop_bf16_16`).
pub fn bf16_operands(words: &mut Vec<u32>) -> Result<usize> {
    let changed = retype_operands(words, Half::BF16)?;
    if changed > 0 {
        require_bf16(words)?;
    }
    Ok(changed)
}

/// Makes every f16 value of the module a bfloat16 one: its `OpTypeFloat 16` gains the
/// BFloat16KHR encoding, so f16 bindings, workgroup arrays, conversions and cooperative
/// matrices all become bf16, and the module gains SPV_KHR_bfloat16. For kernels that only move
/// and convert their 16-bit values and multiply them on cooperative matrices (the tensor-core
/// attention, whose `half` bindings carry bf16 where the launch binds bf16). SPV_KHR_bfloat16
/// allows no arithmetic on bf16: a module that computes on its f16 values, or holds an f16
/// constant bf16 cannot represent, is refused with an error. Returns whether the module had
/// an f16 type.
pub fn bf16_halves(words: &mut Vec<u32>) -> Result<bool> {
    let bad = |why: String| Error::Internal(format!("SPIR-V module to bf16: {why}"));
    let insts = instructions(words)?;
    let Some(&(_, f16_at)) = insts
        .iter()
        .find(|&&(op, at)| op == OP_TYPE_FLOAT && words[at] >> 16 == 3 && words[at + 2] == 16)
    else {
        return Ok(false);
    };
    let f16_id = words[f16_at + 1];
    // f16 constants: their bits are binary16's, rewritten as bfloat16's where exact.
    for &(op, at) in &insts {
        if op == OP_CONSTANT && words[at] >> 16 == 4 && words[at + 1] == f16_id {
            let x = half::f16::from_bits(words[at + 3] as u16).to_f32();
            let b = half::bf16::from_f32(x);
            if b.to_f32() != x && !x.is_nan() {
                return Err(bad(format!("the f16 constant {x} is not a bf16 value")));
            }
            words[at + 3] = b.to_bits() as u32;
        }
    }
    words[f16_at] = (4 << 16) | OP_TYPE_FLOAT;
    words.insert(f16_at + 3, 0);
    check_bf16_use(words, f16_id)?;
    require_bf16(words)?;
    Ok(true)
}

/// Checks SPV_KHR_bfloat16's rule on the module whose `bf16` type was just declared: values
/// of types that are or include bf16 go only to constant, memory, function, conversion and
/// composite instructions, OpDot, the cooperative-matrix product and length, OpSelect, OpPhi
/// and OpReturnValue.
fn check_bf16_use(words: &[u32], bf16: u32) -> Result<()> {
    const TYPE_OPS: std::ops::RangeInclusive<u32> = 19..=39;
    // Types built on another: vector, matrix, array, runtime array, struct, pointer,
    // function, cooperative matrix (their operands after the result id name types).
    const COMPOSED_TYPES: [u32; 8] = [23, 24, 28, 29, 30, 32, 33, OP_TYPE_COOP_MATRIX];
    fn allowed(op: u32) -> bool {
        matches!(op,
            // Debug names and decorations.
            5 | 6 | 71 | 72
            // Constant creation, memory, function.
            | 41..=52 | 59..=70 | 4457 | 4458 | 54..=57
            // Conversion and composite instructions.
            | 109..=126 | 77..=84 | 400
            // OpDot, OpSelect, OpPhi, OpReturnValue, lifetimes.
            | 148 | 169 | 245 | 254 | 256 | 257
            // Cooperative-matrix product and length.
            | 4459 | 4460)
    }
    let insts = instructions(words)?;
    // Ids of bf16 types and values, in one pass: SPIR-V declares a type before its uses, and
    // a value's type decides whether it is one. (The header's, names' and decorations' first
    // operands are not result types.)
    let mut tainted = std::collections::HashSet::from([bf16]);
    for &(op, at) in &insts {
        let n = (words[at] >> 16) as usize;
        let operands = &words[at + 1..at + n];
        let is_type = TYPE_OPS.contains(&op) || op == OP_TYPE_COOP_MATRIX;
        if is_type {
            if COMPOSED_TYPES.contains(&op) && operands[1..].iter().any(|w| tainted.contains(w)) {
                tainted.insert(operands[0]);
            }
        } else if !matches!(op, 3 | 4 | 5..=8 | 10 | 11 | 14..=17 | 62..=64 | 71 | 72)
            && operands.len() >= 2
            && tainted.contains(&operands[0])
        {
            // A result of a bf16 (or bf16-holding) type.
            tainted.insert(operands[1]);
        }
    }
    for &(op, at) in &insts {
        let n = (words[at] >> 16) as usize;
        let is_type = TYPE_OPS.contains(&op) || op == OP_TYPE_COOP_MATRIX;
        // The module's header and control flow carry literals (capabilities, loop
        // controls) that could equal a bf16 id, and never a bf16 value.
        let header_or_flow =
            matches!(op, 3 | 4 | 7 | 8 | 10 | 11 | 14..=17 | 246..=253 | 317 | 330 | 331);
        if is_type || allowed(op) || header_or_flow {
            continue;
        }
        // OpExtInst: result type, result, set, instruction number (a literal), operands.
        let from = if op == 12 { at + 5 } else { at + 1 };
        let result_type = n > 1 && tainted.contains(&words[at + 1]);
        if result_type
            || words[from.min(at + n)..at + n]
                .iter()
                .any(|w| tainted.contains(w))
        {
            return Err(Error::Internal(format!(
                "SPIR-V module to bf16: opcode {op} computes on a bf16 value, which \
                 SPV_KHR_bfloat16 does not allow"
            )));
        }
    }
    Ok(())
}

/// `retype_operands`'s work: the A and B matrix types of f32 become `half`'s.
fn retype_operands(words: &mut Vec<u32>, half: Half) -> Result<usize> {
    let insts = instructions(words)?;
    // (`instructions` checked that every instruction's words are inside the module.)
    let float = |operands: &[u32]| {
        insts.iter().find_map(|&(op, at)| {
            let n = (words[at] >> 16) as usize;
            (op == OP_TYPE_FLOAT && n == 2 + operands.len() && words[at + 2..at + n] == *operands)
                .then(|| words[at + 1])
        })
    };
    let (Some(f32_id), half_id) = (float(&[32]), float(half.operands())) else {
        return Ok(0);
    };
    let mut changed = 0;
    for &(op, at) in &insts {
        // OpTypeCooperativeMatrixKHR: result, component type, scope, rows, columns, use.
        if op != OP_TYPE_COOP_MATRIX || words[at] >> 16 != 7 || words[at + 2] != f32_id {
            continue;
        }
        // Use is an id of a constant: find its value.
        let use_id = words[at + 6];
        let value = insts.iter().find_map(|&(o, a)| {
            (o == OP_CONSTANT && words[a] >> 16 == 4 && words[a + 2] == use_id)
                .then(|| words[a + 3])
        });
        if matches!(value, Some(USE_A | USE_B)) {
            let Some(h) = half_id else {
                // OpTypeFloat %bound <operands> after the f32 type (a type is declared before
                // its uses), the bound one higher; then retype.
                let (_, f32_at) = insts
                    .iter()
                    .copied()
                    .find(|&(o, a)| o == OP_TYPE_FLOAT && words[a + 1] == f32_id)
                    .ok_or_else(|| Error::Internal("SPIR-V module: no f32 type".into()))?;
                let id = words[3];
                words[3] += 1;
                let end = f32_at + (words[f32_at] >> 16) as usize;
                let ops = half.operands();
                let mut decl = vec![((2 + ops.len() as u32) << 16) | OP_TYPE_FLOAT, id];
                decl.extend_from_slice(ops);
                words.splice(end..end, decl);
                return retype_operands(words, half);
            };
            words[at + 2] = h;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Adds SPV_KHR_bfloat16's capabilities (BFloat16TypeKHR, BFloat16CooperativeMatrixKHR)
/// after the module's last capability and its extension after them, where missing.
fn require_bf16(words: &mut Vec<u32>) -> Result<()> {
    const OP_CAPABILITY: u32 = 17;
    const OP_EXTENSION: u32 = 10;
    const BF16_TYPE: u32 = 5116;
    const BF16_COOP: u32 = 5118;
    const EXTENSION: &str = "SPV_KHR_bfloat16";
    let insts = instructions(words)?;
    let has_cap = |c: u32| {
        insts
            .iter()
            .any(|&(op, at)| op == OP_CAPABILITY && words[at] >> 16 == 2 && words[at + 1] == c)
    };
    let has_ext = insts.iter().any(|&(op, at)| {
        op == OP_EXTENSION && literal(&words[at + 1..at + (words[at] >> 16) as usize]) == EXTENSION
    });
    let Some(&(_, last_cap)) = insts.iter().rev().find(|&&(op, _)| op == OP_CAPABILITY) else {
        return Err(Error::Internal("SPIR-V module: no capability".into()));
    };
    let mut add = Vec::new();
    for c in [BF16_TYPE, BF16_COOP] {
        if !has_cap(c) {
            add.extend([(2 << 16) | OP_CAPABILITY, c]);
        }
    }
    if !has_ext {
        // A literal string: UTF-8, NUL-terminated, padded to whole words.
        let mut bytes = EXTENSION.as_bytes().to_vec();
        bytes.resize((bytes.len() / 4 + 1) * 4, 0);
        let text: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        add.push(((1 + text.len() as u32) << 16) | OP_EXTENSION);
        add.extend(text);
    }
    // Capabilities, then extensions: the module's layout.
    let end = last_cap + 2;
    words.splice(end..end, add);
    Ok(())
}

/// An element-access stub's role by its name: `coop_get<E>u` reads element E of the
/// invocation's share of a cooperative matrix, `coop_set<E>u` and `coop_seta<E>u` return the
/// matrix with element E replaced (`true` for a read).
fn stub(name: &str) -> Option<(bool, u32)> {
    let rest = name.strip_prefix("coop_")?;
    let (get, index) = if let Some(d) = rest.strip_prefix("get") {
        (true, d)
    } else if let Some(d) = rest.strip_prefix("seta") {
        (false, d)
    } else {
        (false, rest.strip_prefix("set")?)
    };
    // `//! unroll` spells the index as a WGSL literal: `coop_get3u`.
    Some((get, index.strip_suffix('u').unwrap_or(index).parse().ok()?))
}

/// A SPIR-V literal string (UTF-8, NUL-terminated, packed little-endian into words).
fn literal(words: &[u32]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Gives the element-access stubs of common.wgsl their bodies, which WGSL cannot write:
/// `coop_get<E>u(m)` becomes OpCompositeExtract of element E of the invocation's share of
/// `m`, and `coop_set<E>u(m, x)` (`coop_seta<E>u`) OpCompositeInsert of x there, as
/// SPV_KHR_cooperative_matrix allows. Which row and column an element holds is the driver's
/// choice: kernels that read or write elements run only where `kernels::coop_layout`
/// measured the layout they assume. Drops the module's debug names, which `compile` emitted
/// only to find the stubs (some would name ids of the bodies replaced here). Returns how
/// many stubs it rewrote.
pub fn element_access(words: &mut Vec<u32>) -> Result<usize> {
    const OP_NAME: u32 = 5;
    const OP_MEMBER_NAME: u32 = 6;
    const OP_FUNCTION: u32 = 54;
    const OP_FUNCTION_PARAMETER: u32 = 55;
    const OP_FUNCTION_END: u32 = 56;
    const OP_COMPOSITE_EXTRACT: u32 = 81;
    const OP_COMPOSITE_INSERT: u32 = 82;
    const OP_LABEL: u32 = 248;
    const OP_RETURN_VALUE: u32 = 254;
    let bad = |why: &str| Error::Internal(format!("SPIR-V module: {why}"));
    let insts = instructions(words)?;
    let len = |at: usize| (words[at] >> 16) as usize;
    let names: std::collections::HashMap<u32, String> = insts
        .iter()
        .filter(|&&(op, at)| op == OP_NAME && len(at) >= 3)
        .map(|&(_, at)| (words[at + 1], literal(&words[at + 2..at + len(at)])))
        .collect();
    if !names.values().any(|n| stub(n).is_some()) {
        return Ok(0);
    }
    let mut bound = words[3];
    let mut out = Vec::with_capacity(words.len());
    out.extend_from_slice(&words[..5]);
    let mut rewritten = 0;
    let mut i = 0;
    while i < insts.len() {
        let (op, at) = insts[i];
        i += 1;
        if op == OP_NAME || op == OP_MEMBER_NAME {
            continue;
        }
        out.extend_from_slice(&words[at..at + len(at)]);
        let role = (op == OP_FUNCTION && len(at) == 5)
            .then(|| names.get(&words[at + 2]).and_then(|n| stub(n)))
            .flatten();
        let Some((get, index)) = role else {
            continue;
        };
        // OpFunction: result type, id, control, function type; then its parameters and
        // its first block's label, kept; the rest of the body is replaced.
        let result_type = words[at + 1];
        let mut params = Vec::new();
        while let Some(&(op, at)) = insts.get(i) {
            if op != OP_FUNCTION_PARAMETER {
                break;
            }
            params.push(words[at + 2]);
            out.extend_from_slice(&words[at..at + len(at)]);
            i += 1;
        }
        match insts.get(i) {
            Some(&(OP_LABEL, at)) => out.extend_from_slice(&words[at..at + len(at)]),
            _ => return Err(bad("an element-access stub without a body")),
        }
        while insts.get(i).is_some_and(|&(op, _)| op != OP_FUNCTION_END) {
            i += 1;
        }
        if i == insts.len() {
            return Err(bad("an element-access stub without its end"));
        }
        let id = bound;
        bound += 1;
        match (get, params.as_slice()) {
            (true, &[m]) => out.extend([5 << 16 | OP_COMPOSITE_EXTRACT, result_type, id, m, index]),
            (false, &[m, x]) => {
                out.extend([6 << 16 | OP_COMPOSITE_INSERT, result_type, id, x, m, index])
            }
            _ => return Err(bad("an element-access stub with the wrong parameters")),
        }
        out.extend([2 << 16 | OP_RETURN_VALUE, id]);
        rewritten += 1;
    }
    out[3] = bound;
    *words = out;
    Ok(rewritten)
}
