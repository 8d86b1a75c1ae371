//! Every entry point of every shader, composed for every capability set, dtype and constant set
//! its signature allows, parsed and validated by naga; the cooperative-matrix kernels also go
//! through naga's SPIR-V writer (whose behaviour on matrix-load strides is what their layout
//! avoids). And each family's host parameter struct against the shader's `struct Params`,
//! field by field, through naga's reflection.

use wgrad::DType;
use wgrad::kernels::Kernel;
use wgrad::kernels::compose::{self, EntrySig, F16Mode, Target};

const TARGETS: [Target; 4] = [
    Target {
        f16: F16Mode::Native,
        subgroups: true,
    },
    Target {
        f16: F16Mode::Native,
        subgroups: false,
    },
    Target {
        f16: F16Mode::Packed,
        subgroups: true,
    },
    Target {
        f16: F16Mode::Packed,
        subgroups: false,
    },
];

fn caps(t: Target) -> naga::valid::Capabilities {
    use naga::valid::Capabilities as C;
    // pack2x16float / unpack2x16float: every backend wgpu offers (Vulkan, Metal, DX12, GL)
    // reports SHADER_F16_IN_F32, so the packed-f16 path needs nothing optional.
    let mut c = C::SHADER_FLOAT16_IN_FLOAT32;
    if t.f16 == F16Mode::Native {
        c |= C::SHADER_FLOAT16;
    }
    if t.subgroups {
        c |= C::SUBGROUP;
    }
    c
}

fn is_coop(k: Kernel) -> bool {
    k.enables().contains(&"wgpu_cooperative_matrix")
}

fn extra(k: Kernel) -> naga::valid::Capabilities {
    if is_coop(k) {
        naga::valid::Capabilities::COOPERATIVE_MATRIX
    } else {
        naga::valid::Capabilities::empty()
    }
}

fn parse_validate(
    src: &str,
    t: Target,
    extra: naga::valid::Capabilities,
    what: &str,
) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{what}: parse error\n{}\n{src}", e.emit_to_string(src)));
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps(t) | extra);
    let info = v
        .validate(&module)
        .unwrap_or_else(|e| panic!("{what}: validation error\n{}\n{src}", e.emit_to_string(src)));
    (module, info)
}

/// Every dtype assignment an entry's bindings allow: `data` bindings share one dtype, `any`
/// bindings take each in turn.
fn dtype_sets(sig: &EntrySig, coop: bool) -> Vec<Vec<DType>> {
    use compose::Elem;
    // A tensor-core kernel with `half` operands multiplies f16 or bf16 matrices.
    let datas: &[DType] = if coop && sig.bindings.iter().any(|b| b.elem == Elem::Half) {
        &[DType::F16, DType::BF16]
    } else if coop {
        &[DType::F16]
    } else {
        &[DType::F32, DType::F16, DType::BF16]
    };
    let mut out = Vec::new();
    for &data in datas {
        let anys: &[DType] = if sig.bindings.iter().any(|b| b.elem == Elem::Any) {
            Elem::Any.candidates()
        } else {
            &[DType::F32]
        };
        for &any in anys {
            out.push(
                sig.bindings
                    .iter()
                    .map(|b| match b.elem {
                        Elem::Data => data,
                        Elem::Any => any,
                        Elem::U32 => DType::U32,
                        Elem::F32 => DType::F32,
                        Elem::F16 => DType::F16,
                        Elem::Half => data,
                    })
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn every_entry_point_validates() {
    let mut count = 0;
    for &k in Kernel::ALL {
        let coop = is_coop(k);
        for sig in k.entries().expect("signatures parse") {
            for t in TARGETS {
                // Tensor-core kernels need native f16 and subgroups; the host never builds
                // them otherwise.
                if coop && !(t.f16 == F16Mode::Native && t.subgroups) {
                    continue;
                }
                if sig.subgroups && !t.subgroups {
                    continue;
                }
                for dtypes in dtype_sets(sig, coop) {
                    for (wg, consts) in sig.compositions() {
                        let src = compose::compose(
                            t,
                            k.source(),
                            sig,
                            wg,
                            &consts,
                            &dtypes,
                            k.codes(),
                            k.enables(),
                        )
                        .unwrap_or_else(|| panic!("{k:?} has no entry {}", sig.name));
                        let what =
                            format!("{k:?}/{} {t:?} {dtypes:?} wg={wg} {consts:?}", sig.name);
                        let (module, info) = parse_validate(&src, t, extra(k), &what);
                        if coop {
                            spirv(&module, &info, &what);
                            workgroup_sizes_aligned(&module, &what);
                        }
                        // bf16 where the launch binds it to `half` operands.
                        let bf16 = compose::halves_hold_bf16(sig, |i| dtypes[i] == DType::BF16);
                        if sig.spirv || sig.prefers_spirv {
                            own_spirv(&src, t, coop, sig.spirv, bf16, &what);
                        }
                        count += 1;
                    }
                }
            }
        }
    }
    assert!(count > 300, "only {count} compositions checked");
}

/// Every workgroup variable of a tensor-core kernel is a multiple of 16 bytes long, so that
/// each starts on a 16-byte boundary in whatever order a driver packs them: cooperative loads
/// from workgroup memory need aligned rows (a lone 4-byte flag before the staged tiles gave
/// wrong results on NVIDIA's driver; see attention_coop.wgsl, "Alignment").
fn workgroup_sizes_aligned(module: &naga::Module, what: &str) {
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .unwrap_or_else(|e| panic!("{what}: layout: {e}"));
    for (_, var) in module.global_variables.iter() {
        if var.space == naga::AddressSpace::WorkGroup {
            let size = layouter[var.ty].size;
            assert!(
                size % 16 == 0,
                "{what}: workgroup variable {:?} is {size} bytes, not a multiple of 16",
                var.name
            );
        }
    }
}

fn spirv(module: &naga::Module, info: &naga::valid::ModuleInfo, what: &str) {
    let opts = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = naga::back::spv::write_vec(module, info, &opts, Some(&pipeline))
        .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
    assert!(words.len() > 100);
}

/// A `//! requires spirv` or `//! prefers spirv` kernel through wgrad's own compilation:
/// naga with wgpu's Vulkan options, then the operand retyping, which must find both carrier
/// types (A and B) in the first and none in the second, and the loop controls; and,
/// with `WGRAD_SPIRV_VAL` naming SPIRV-Tools' validator (2023 or later: older ones do not
/// know cooperative matrices, Debian 12's among them), the result validated as Vulkan 1.3
/// SPIR-V.
fn own_spirv(src: &str, t: Target, coop: bool, carriers: bool, bf16: bool, what: &str) {
    use wgrad::kernels::spirv::{
        SpirvTarget, bf16_halves, bf16_operands, compile, dont_unroll, element_access, f16_operands,
    };
    let mut words = compile(
        src,
        SpirvTarget {
            f16: t.f16 == F16Mode::Native,
            subgroups: t.subgroups,
            coop,
            bounds_checks: true,
            full_checks: false,
        },
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    // A bf16 launch: the module's 16-bit values become bf16 (refused if it computes on them),
    // then the carriers' matrices.
    let retype = if bf16 {
        bf16_halves(&mut words).unwrap_or_else(|e| panic!("{what}: {e}"));
        bf16_operands
    } else {
        f16_operands
    };
    let changed = retype(&mut words).unwrap_or_else(|e| panic!("{what}: {e}"));
    // A `requires spirv` product carries both operands as f32 matrices; a `prefers spirv`
    // kernel has none, nor has one that needs wgrad's SPIR-V only for element access.
    let carried = src.contains("coop_mat16x16<f32, A>") && src.contains("coop_mat16x16<f32, B>");
    let want = if carriers && carried { 2 } else { 0 };
    assert_eq!(
        changed, want,
        "{what}: retyped {changed} operand matrix types"
    );
    // Retyping twice finds nothing left to do.
    assert_eq!(retype(&mut words).ok(), Some(0), "{what}");
    if bf16 {
        assert_eq!(
            bf16_halves(&mut words).ok(),
            Some(false),
            "{what}: f16 left"
        );
    }
    // Every element-access stub the composer included gets its body, and no debug name
    // is left (OpName, OpMemberName).
    let stubs = src.matches("fn coop_get").count() + src.matches("fn coop_set").count();
    let rewritten = element_access(&mut words).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(rewritten, stubs, "{what}: element-access stubs");
    let mut at = 5;
    while at < words.len() {
        let op = words[at] & 0xffff;
        assert!(op != 5 && op != 6, "{what}: a debug name left");
        at += (words[at] >> 16) as usize;
    }
    let loops = dont_unroll(&mut words).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(loops >= 1, "{what}: no loop marked");
    let Ok(val) = std::env::var("WGRAD_SPIRV_VAL") else {
        return;
    };
    let path = std::env::temp_dir().join(format!("wgrad-own-{}.spv", std::process::id()));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&path, bytes).expect("temp file");
    let out = std::process::Command::new(&val)
        .args(["--target-env", "vulkan1.3"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("WGRAD_SPIRV_VAL={val}: {e}"));
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{what}: spirv-val: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// naga's spelling of a type, as `Wgsl::WGSL` spells the host's.
fn type_name(module: &naga::Module, ty: naga::Handle<naga::Type>) -> String {
    use naga::{ScalarKind, TypeInner, VectorSize};
    let scalar = |s: naga::Scalar| match (s.kind, s.width) {
        (ScalarKind::Uint, 4) => "u32".to_string(),
        (ScalarKind::Sint, 4) => "i32".to_string(),
        (ScalarKind::Float, 4) => "f32".to_string(),
        (ScalarKind::Float, 2) => "f16".to_string(),
        other => format!("{other:?}"),
    };
    match &module.types[ty].inner {
        TypeInner::Scalar(s) => scalar(*s),
        TypeInner::Vector { size, scalar: s } => {
            let n = match size {
                VectorSize::Bi => 2,
                VectorSize::Tri => 3,
                VectorSize::Quad => 4,
            };
            format!("vec{n}<{}>", scalar(*s))
        }
        TypeInner::Array {
            base,
            size: naga::ArraySize::Constant(n),
            ..
        } => format!("array<{}, {n}>", type_name(module, *base)),
        other => format!("{other:?}"),
    }
}

/// Each family's host parameter struct has the shader's `Params` members, in order, at the
/// same byte offsets, with the same types; and the host struct fills the uniform's span.
#[test]
fn host_params_match_the_shaders() {
    for &k in Kernel::ALL {
        let coop = is_coop(k);
        let t = TARGETS[0];
        for sig in k.entries().expect("signatures parse") {
            let (wg, consts) = sig.compositions()[0].clone();
            let dtypes = dtype_sets(sig, coop).remove(0);
            let src = compose::compose(
                t,
                k.source(),
                sig,
                wg,
                &consts,
                &dtypes,
                k.codes(),
                k.enables(),
            )
            .expect("composes");
            let what = format!("{k:?}/{}", sig.name);
            let (module, _) = parse_validate(&src, t, extra(k), &what);
            let uniform = module
                .global_variables
                .iter()
                .find(|(_, g)| g.space == naga::AddressSpace::Uniform)
                .map(|(_, g)| g.ty)
                .unwrap_or_else(|| panic!("{what}: no uniform"));
            let naga::TypeInner::Struct { members, span } = &module.types[uniform].inner else {
                panic!("{what}: the uniform is not a struct");
            };
            let host = k.params_fields();
            let shader: Vec<(String, usize, String)> = members
                .iter()
                .map(|m| {
                    (
                        m.name.clone().unwrap_or_default(),
                        m.offset as usize,
                        type_name(&module, m.ty),
                    )
                })
                .collect();
            let host_v: Vec<(String, usize, String)> = host
                .iter()
                .map(|f| (f.name.to_string(), f.offset, f.wgsl.to_string()))
                .collect();
            assert_eq!(host_v, shader, "{what}: host params vs WGSL Params");
            // The host struct's size, padded to 16 as the stream pads a parameter block.
            let last = host.last().expect("fields");
            let host_end = last.offset
                + match last.wgsl {
                    "array<vec4<u32>, 2>" => 32,
                    "array<vec4<u32>, 4>" => 64,
                    _ => 4,
                };
            assert_eq!(
                host_end.div_ceil(16) * 16,
                (*span as usize).div_ceil(16) * 16,
                "{what}: size"
            );
        }
    }
}

/// Every op code a family declares is used by its shader (or the WGSL generated with the
/// codes) by name, and the files open with a header comment.
#[test]
fn codes_are_used_and_files_documented() {
    for &k in Kernel::ALL {
        let src = k.source();
        assert!(
            src.starts_with("// "),
            "{k:?}: the file opens with its header comment"
        );
        let generated: String = k.codes().iter().map(|c| c.wgsl).collect();
        let all = format!("{src}{}{generated}", include_str!("../shaders/common.wgsl"));
        for set in k.codes() {
            for (name, _) in set.consts {
                assert!(
                    all.contains(name),
                    "{k:?}: code {name} is declared but never used"
                );
            }
        }
    }
}

/// `wide`'s SPIR-V as naga writes it (before any retyping), composed for the first target
/// with these layouts, row sums and dtypes, 128 x 128 tiles.
fn wide_spirv((ta, tb): (u32, u32), rsum: u32, dtypes: &[DType]) -> Vec<u32> {
    use wgrad::kernels::spirv::{SpirvTarget, compile};
    let k = Kernel::MatmulWide;
    let sig = &k.entries().expect("signatures parse")[0];
    let consts = [
        ("TA", ta),
        ("TB", tb),
        ("FUSE", 0),
        ("GATHER", 0),
        ("RM", 128),
        ("RN", 128),
        ("RSUM", rsum),
        ("REGS", 0),
    ];
    let src = compose::compose(
        TARGETS[0],
        k.source(),
        sig,
        128,
        &consts,
        dtypes,
        k.codes(),
        k.enables(),
    )
    .expect("composes");
    let target = SpirvTarget {
        f16: true,
        subgroups: true,
        coop: true,
        bounds_checks: true,
        full_checks: false,
    };
    compile(&src, target).expect("compiles")
}

/// `wide`'s split products bind only f32 buffers besides their f16 operands (partial
/// products, and with RSUM partial row sums), so the module naga writes has no f16 type:
/// the operand retyping declares one and retypes both matrix types.
#[test]
fn operand_retyping_declares_f16() {
    use wgrad::kernels::spirv::f16_operands;
    for rsum in [0, 1] {
        let mut words = wide_spirv(
            (1, 0),
            rsum,
            &[DType::F16, DType::F16, DType::F32, DType::F32],
        );
        let floats = |w: &[u32]| {
            let (mut at, mut widths) = (5, Vec::new());
            while at < w.len() {
                if w[at] & 0xffff == 22 {
                    widths.push(w[at + 2]);
                }
                at += (w[at] >> 16) as usize;
            }
            widths
        };
        assert_eq!(floats(&words), [32], "RSUM={rsum}: naga wrote an f16 type");
        let bound = words[3];
        assert_eq!(f16_operands(&mut words).ok(), Some(2), "RSUM={rsum}");
        assert_eq!(floats(&words), [32, 16], "RSUM={rsum}");
        assert_eq!(words[3], bound + 1, "RSUM={rsum}: id bound");
        assert_eq!(f16_operands(&mut words).ok(), Some(0), "RSUM={rsum}");
    }
}

/// `wide` with bf16 operands: the retyping declares the bfloat16 type (`OpTypeFloat 16 0`)
/// beside f32, gives both operand matrix types that type, and adds SPV_KHR_bfloat16 with its
/// two capabilities once; a second pass finds nothing to do. Where the module already has an
/// f16 type (f16 output), that type is left alone.
#[test]
fn operand_retyping_to_bf16_declares_its_type_and_capabilities() {
    use wgrad::kernels::spirv::bf16_operands;
    for dtypes in [
        [DType::BF16, DType::BF16, DType::BF16, DType::BF16],
        [DType::BF16, DType::BF16, DType::F16, DType::F16],
    ] {
        let mut words = wide_spirv((0, 1), 0, &dtypes);
        // (opcode, operands) of every instruction.
        let insts = |w: &[u32]| {
            let (mut at, mut out) = (5, Vec::new());
            while at < w.len() {
                let n = (w[at] >> 16) as usize;
                out.push((w[at] & 0xffff, w[at + 1..at + n].to_vec()));
                at += n;
            }
            out
        };
        let floats = |w: &[u32]| -> Vec<Vec<u32>> {
            insts(w)
                .into_iter()
                .filter(|(op, _)| *op == 22)
                .map(|(_, o)| o[1..].to_vec())
                .collect()
        };
        let before = floats(&words);
        let bound = words[3];
        assert_eq!(bf16_operands(&mut words).ok(), Some(2), "{dtypes:?}");
        let after = floats(&words);
        assert_eq!(after.len(), before.len() + 1, "{dtypes:?}: {after:?}");
        assert!(after.contains(&vec![16, 0]), "{dtypes:?}: {after:?}");
        assert_eq!(words[3], bound + 1, "{dtypes:?}: id bound");
        let bf16_id = insts(&words)
            .into_iter()
            .find(|(op, o)| *op == 22 && o[1..] == [16, 0])
            .map(|(_, o)| o[0]);
        // Both operand matrix types (use A = 0, B = 1, given as constants) are bf16 now; the
        // accumulator stays f32.
        let coop: Vec<Vec<u32>> = insts(&words)
            .into_iter()
            .filter(|(op, _)| *op == 4456)
            .map(|(_, o)| o)
            .collect();
        assert_eq!(
            coop.iter().filter(|o| Some(o[1]) == bf16_id).count(),
            2,
            "{dtypes:?}: {coop:?}"
        );
        let caps: Vec<u32> = insts(&words)
            .into_iter()
            .filter(|(op, _)| *op == 17)
            .map(|(_, o)| o[0])
            .collect();
        assert!(caps.contains(&5116) && caps.contains(&5118), "{caps:?}");
        let exts: Vec<Vec<u32>> = insts(&words)
            .into_iter()
            .filter(|(op, _)| *op == 10)
            .map(|(_, o)| o)
            .collect();
        let name: Vec<u8> = b"SPV_KHR_bfloat16\0\0\0\0".to_vec();
        let want: Vec<u32> = name
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(exts.iter().filter(|e| **e == want).count(), 1, "{exts:?}");
        // Capabilities before extensions, as SPIR-V lays a module out.
        let ops: Vec<u32> = insts(&words).into_iter().map(|(op, _)| op).collect();
        let last_cap = ops.iter().rposition(|&op| op == 17);
        let first_ext = ops.iter().position(|&op| op == 10);
        assert!(last_cap < first_ext, "{ops:?}");
        let len = words.len();
        assert_eq!(bf16_operands(&mut words).ok(), Some(0), "{dtypes:?}");
        assert_eq!(words.len(), len, "{dtypes:?}: a second pass added words");
    }
}

/// The whole-module retyping to bf16 refuses what SPV_KHR_bfloat16 does not allow: arithmetic
/// on 16-bit values, and f16 constants that bf16 cannot represent; moves, conversions and
/// constants it can represent pass, the constants' bits rewritten.
#[test]
fn bf16_retyping_refuses_arithmetic_on_halves() {
    use wgrad::kernels::spirv::{SpirvTarget, bf16_halves, compile};
    let target = SpirvTarget {
        f16: true,
        subgroups: false,
        coop: false,
        bounds_checks: true,
        full_checks: false,
    };
    let module = |body: &str| {
        let src = format!(
            "enable f16;\n@group(0) @binding(0) var<storage, read_write> x: array<f16>;\n\
             @group(0) @binding(1) var<storage, read_write> y: array<f32>;\n\
             @compute @workgroup_size(1) fn main() {{ {body} }}"
        );
        compile(&src, target).unwrap_or_else(|e| panic!("{body}: {e}"))
    };
    for body in [
        "x[0] = x[1] * x[2];",
        "x[0] = x[1] + x[2];",
        "x[0] = -x[1];",
        "y[0] = select(0.0, 1.0, x[1] < x[2]);",
        "x[0] = f16(0.1);",
    ] {
        let mut w = module(body);
        assert!(bf16_halves(&mut w).is_err(), "{body}");
    }
    for body in [
        "x[0] = x[1];",
        "y[0] = f32(x[1]);",
        "x[0] = f16(y[1]);",
        "x[0] = select(x[1], x[2], y[0] > 0.0);",
        "x[0] = f16(0.5); x[1] = f16(-3.0);",
    ] {
        let mut w = module(body);
        assert_eq!(bf16_halves(&mut w).ok(), Some(true), "{body}");
    }
    // 0.5 and -3.0 as bf16 bits (0x3f00, 0xc040) where the f16 ones (0x3800, 0xc200) were.
    let mut w = module("x[0] = f16(0.5); x[1] = f16(-3.0);");
    bf16_halves(&mut w).unwrap();
    let consts: Vec<u32> = (0..w.len())
        .filter(|&i| i >= 5 && w[i] == (4 << 16 | 43))
        .map(|i| w[i + 3])
        .collect();
    assert!(
        consts.contains(&0x3f00) && consts.contains(&0xc040),
        "{consts:x?}"
    );
    assert!(!consts.contains(&0x3800), "{consts:x?}");
}
