//! Every entry point of every shader, composed for every capability set and dtype it can be
//! built with, parsed and validated by naga; the cooperative-matrix kernel also goes through
//! naga's SPIR-V writer (whose behaviour on matrix-load strides is what its layout avoids).

use wgrad::DType;
use wgrad::kernels::Kernel;
use wgrad::kernels::compose::{self, Decl, F16Mode, Target};
use wgrad::kernels::signature::{Elem, TABLE};

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

fn validate(src: &str, t: Target, extra: naga::valid::Capabilities, what: &str) -> naga::Module {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{what}: parse error\n{}\n{src}", e.emit_to_string(src)));
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps(t) | extra);
    if let Err(e) = v.validate(&module) {
        panic!("{what}: validation error\n{}\n{src}", e.emit_to_string(src));
    }
    module
}

#[test]
fn every_entry_point_validates() {
    let targets = [
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
    let mut count = 0;
    for sig in TABLE {
        let coop = matches!(sig.kernel, Kernel::MatmulCoop | Kernel::AttentionCoop);
        for t in targets {
            // The tensor-core kernel needs native f16 and subgroups; the host never builds it otherwise.
            if coop && !(t.f16 == F16Mode::Native && t.subgroups) {
                continue;
            }
            for &data in &[DType::F32, DType::F16] {
                if coop && data != DType::F16 {
                    continue;
                }
                // Any-typed bindings take each dtype in turn; the others follow `data`.
                let any_choices: &[DType] = if sig.bindings.iter().any(|b| b.1 == Elem::Any) {
                    Elem::Any.candidates()
                } else {
                    &[DType::F32]
                };
                for &any in any_choices {
                    let decls: Vec<Decl> = sig
                        .bindings
                        .iter()
                        .map(|&(name, elem, write)| Decl {
                            name,
                            dtype: match elem {
                                Elem::Data => data,
                                Elem::Any => any,
                                Elem::U32 => DType::U32,
                                Elem::F32 => DType::F32,
                            },
                            write,
                        })
                        .collect();
                    for &wg in sig.wgs {
                        for consts in sig.consts {
                            let src = compose::compose(
                                t,
                                sig.kernel.source(),
                                sig.entry,
                                wg,
                                consts,
                                &decls,
                                sig.kernel.enables(),
                            )
                            .unwrap_or_else(|| {
                                panic!("{:?} has no entry {}", sig.kernel, sig.entry)
                            });
                            let what = format!(
                                "{:?}/{} {t:?} data={data} any={any} wg={wg} {consts:?}",
                                sig.kernel, sig.entry
                            );
                            let extra = if coop {
                                naga::valid::Capabilities::COOPERATIVE_MATRIX
                            } else {
                                naga::valid::Capabilities::empty()
                            };
                            let module = validate(&src, t, extra, &what);
                            if coop {
                                spirv(&module, t, extra, &what);
                            }
                            count += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(count > 100, "only {count} compositions checked");
}

fn spirv(module: &naga::Module, t: Target, extra: naga::valid::Capabilities, what: &str) {
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps(t) | extra)
        .validate(module)
        .unwrap();
    let opts = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = naga::back::spv::write_vec(module, &info, &opts, Some(&pipeline))
        .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
    assert!(words.len() > 100);
}

/// Every family file lists its entries in the table, and every table entry exists in its file.
#[test]
fn table_matches_files() {
    for k in Kernel::ALL {
        let src = k.source();
        assert!(
            src.starts_with("// "),
            "{k:?}: the file opens with its header comment"
        );
        for e in compose::entries(src) {
            assert!(
                TABLE.iter().any(|s| s.kernel == *k && s.entry == e),
                "{k:?}/{e} is missing from the signature table"
            );
        }
    }
    for s in TABLE {
        assert!(
            compose::entries(s.kernel.source()).contains(&s.entry),
            "{:?}/{} not in its file",
            s.kernel,
            s.entry
        );
    }
}
