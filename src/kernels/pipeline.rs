//! Compiling kernels into pipelines, cached per device.
//!
//! A pipeline is identified by (family, entry, workgroup size, constants, argument dtypes).
//! The key is a small fixed-size value, so looking one up costs a hash, not the string
//! formatting it once took.

use super::{Arg, Kernel, compose, spirv};
use crate::device::stream::{Pipeline, layout_entries};
use crate::device::{Device, ShaderChecks};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hash::FastMap;
use std::sync::{Arc, Mutex};

/// Most compile-time constants a launch passes.
pub(crate) const MAX_CONSTS: usize = 12;
/// Most storage arguments of a launch (as many as a bind group holds).
pub(crate) const MAX_ARGS: usize = crate::device::bind_cache::MAX_STORAGE;

#[derive(Clone, Copy)]
pub(crate) struct Key {
    kernel: Kernel,
    entry: &'static str,
    wg: u32,
    /// Constants given (the rest of `consts` is unused): lookups compare and hash only those.
    n_consts: u8,
    consts: [(&'static str, u32); MAX_CONSTS],
    /// The arguments' dtypes, 3 bits each (0: no argument; see `dtype_code`): one word to hash
    /// and compare. Hashed as 21 `Option`s they were most of a lookup's instructions.
    dtypes: u64,
}

/// A dtype's 3-bit code in [`Key::dtypes`] (never 0).
fn dtype_code(d: DType) -> u64 {
    match d {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::U32 => 4,
    }
}

// 21 arguments of 3 bits fit one word.
const _: () = assert!(3 * MAX_ARGS <= 64);

impl Key {
    fn given(&self) -> &[(&'static str, u32)] {
        &self.consts[..self.n_consts as usize]
    }
}

/// Names compare by address first: a launch site passes the same `&'static str`s every time,
/// so a lookup that hits compares no bytes. Comparing them byte by byte called `memcmp` 13
/// times a lookup, a large share of a training step's recording time on the host
/// (docs/performance.md, the host path). Equal text at another address still compares
/// equal.
fn same_name(a: &'static str, b: &'static str) -> bool {
    std::ptr::eq(a, b) || a == b
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.kernel == o.kernel
            && self.wg == o.wg
            && self.n_consts == o.n_consts
            && self.dtypes == o.dtypes
            && same_name(self.entry, o.entry)
            && self
                .given()
                .iter()
                .zip(o.given())
                .all(|(a, b)| a.1 == b.1 && same_name(a.0, b.0))
    }
}

impl Eq for Key {}

/// Hashes everything but the constants' names: a launch site always passes the same names
/// in the same order, so they tell keys apart only where the kernel and entry already do, and
/// hashing their bytes was most of a lookup's cost. Equal keys still hash equal.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.kernel.hash(h);
        self.entry.len().hash(h);
        self.wg.hash(h);
        for (_, v) in self.given() {
            v.hash(h);
        }
        self.dtypes.hash(h);
    }
}

impl Key {
    pub(crate) fn new(
        kernel: Kernel,
        entry: &'static str,
        wg: u32,
        consts: &[(&'static str, u32)],
        args: &[Arg<'_>],
    ) -> Result<Key> {
        if consts.len() > MAX_CONSTS || args.len() > MAX_ARGS {
            return Err(Error::Internal(format!(
                "launch of {kernel:?}/{entry}: {} constants, {} arguments",
                consts.len(),
                args.len()
            )));
        }
        let mut k = Key {
            kernel,
            entry,
            wg,
            n_consts: consts.len() as u8,
            consts: [("", 0); MAX_CONSTS],
            dtypes: 0,
        };
        k.consts[..consts.len()].copy_from_slice(consts);
        for (i, a) in args.iter().enumerate() {
            k.dtypes |= dtype_code(a.dtype) << (3 * i);
        }
        Ok(k)
    }
}

/// The per-device pipeline cache (in the kernels layer's device state).
#[derive(Default)]
pub(crate) struct Cache {
    map: Mutex<FastMap<Key, Arc<Pipeline>>>,
}

fn cache(dev: &Device) -> Result<&Cache> {
    super::state(dev).map(|s| &s.pipelines)
}

/// Number of pipelines built so far on `dev`.
pub(crate) fn count(dev: &Device) -> usize {
    cache(dev).map_or(0, |c| c.map.lock().unwrap_or_else(|e| e.into_inner()).len())
}

/// The cached pipeline for `key`, built from `source()` on first use with `n_storage` storage
/// bindings.
pub(crate) fn get(
    dev: &Device,
    key: &Key,
    n_storage: usize,
    source: impl FnOnce() -> Result<String>,
) -> Result<Arc<Pipeline>> {
    let c = cache(dev)?;
    if let Some(p) = c.map.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
        return Ok(Arc::clone(p));
    }
    let label = format!("{:?}/{}", key.kernel, key.entry);
    let src = source()?;
    // WGRAD_DUMP_WGSL=DIR writes every composed shader there (for reading what runs).
    if let Ok(dir) = std::env::var("WGRAD_DUMP_WGSL") {
        let n = c.map.lock().unwrap_or_else(|e| e.into_inner()).len();
        let name = format!("{n:03}_{:?}_{}.wgsl", key.kernel, key.entry);
        let _ = std::fs::write(std::path::Path::new(&dir).join(name), &src);
    }
    let sig = key.kernel.entry(key.entry)?;
    let own_spirv = sig.spirv || (sig.prefers_spirv && dev.caps().spirv);
    // `half` operands hold bf16 where the launch binds bf16 there: the module's 16-bit
    // values and operand matrices are then bf16 instead of f16.
    let bf16_operands = compose::halves_hold_bf16(sig, |i| {
        (key.dtypes >> (3 * i)) & 7 == dtype_code(DType::BF16)
    });
    let half = if bf16_operands {
        spirv::Half::BF16
    } else {
        spirv::Half::F16
    };
    let p = Arc::new(build(dev, &label, n_storage, &src, own_spirv, half)?);
    c.map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(*key, Arc::clone(&p));
    Ok(p)
}

fn build(
    dev: &Device,
    label: &str,
    n_storage: usize,
    src: &str,
    own_spirv: bool,
    half: spirv::Half,
) -> Result<Pipeline> {
    let d = dev.wgpu();
    // The element-access stubs have bodies only in wgrad's own SPIR-V (`spirv::element_access`):
    // compiled by wgpu they would return zeros.
    if !own_spirv && (src.contains("fn coop_get") || src.contains("fn coop_set")) {
        return Err(Error::Internal(format!(
            "kernel {label} reads cooperative-matrix elements but is not compiled by wgrad"
        )));
    }
    // Compiled before the error scope opens: a failure here is wgrad's, not wgpu's.
    let words = if own_spirv {
        let c = dev.caps();
        if !c.spirv {
            return Err(Error::Internal(format!(
                "kernel {label} needs SPIR-V passthrough, which this device does not have"
            )));
        }
        if half == spirv::Half::BF16 && !c.coop_bf16_16 {
            return Err(Error::Internal(format!(
                "kernel {label} multiplies bf16 matrices, which this device was not opened with"
            )));
        }
        let checks = dev.inner.shader_checks;
        let target = spirv::SpirvTarget {
            f16: c.f16,
            subgroups: c.subgroups,
            coop: c.coop_matrix_16,
            bounds_checks: checks != ShaderChecks::None,
            full_checks: checks == ShaderChecks::Full,
        };
        let words = spirv::compile(src, target).and_then(|mut w| {
            match half {
                spirv::Half::F16 => spirv::f16_operands(&mut w)?,
                spirv::Half::BF16 => {
                    spirv::bf16_halves(&mut w)?;
                    spirv::bf16_operands(&mut w)?
                }
            };
            spirv::element_access(&mut w)?;
            spirv::dont_unroll(&mut w)?;
            Ok(w)
        });
        // The kernel's name in the message, once.
        Some(words.map_err(|e| match e {
            Error::Internal(m) => Error::Internal(format!("{label}: {m}")),
            e => e,
        })?)
    } else {
        None
    };
    let scope = d.push_error_scope(wgpu::ErrorFilter::Validation);
    let layout = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(label),
        entries: &layout_entries(n_storage),
    });
    let pl = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let checks = match dev.inner.shader_checks {
        ShaderChecks::Full => wgpu::ShaderRuntimeChecks::checked(),
        ShaderChecks::Fast => wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            int_div_checks: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        },
        ShaderChecks::None => wgpu::ShaderRuntimeChecks::unchecked(),
    };
    let module = match words {
        // SAFETY: the words are naga's output for WGSL that naga validated, compiled with
        // the bounds checks wgpu itself would add (`spirv::compile`); the rewrites after it
        // change the component type of operand matrices that carry f16 or bf16 bits
        // (`spirv::f16_operands`, `spirv::bf16_operands`, whose precondition tests/shaders.rs
        // checks per kernel; bf16 only on a device opened with its extension),
        // give the element-access stubs their one-instruction bodies
        // (`spirv::element_access`) and set loop-unrolling hints (`spirv::dont_unroll`).
        Some(words) => unsafe {
            d.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: Some(label),
                entry_points: std::borrow::Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint {
                    name: "main".into(),
                    workgroup_size: (0, 0, 0),
                }]),
                spirv: Some(std::borrow::Cow::Owned(words)),
                ..Default::default()
            })
        },
        // SAFETY: wgrad's shaders have no unbounded loops (every trip count comes from sizes
        // the host validated, and is bounded per thread; see `kernels`) and never divide by
        // zero (divisors are non-empty dimensions); with `Fast` and `Full` wgpu still
        // bounds-checks every buffer access.
        None => unsafe {
            d.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                },
                checks,
            )
        },
    };
    let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: Some(&pl),
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &[],
            // Kernels initialise the workgroup memory they read.
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Internal(format!("building kernel {label}: {e}")));
    }
    // Ids for the bind-group cache's keys; never reused in the process.
    static LAYOUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    Ok(Pipeline {
        pipeline,
        layout,
        layout_id: LAYOUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        label: label.into(),
    })
}

/// Checks a launch against its entry's signature (once, when its pipeline is built).
pub(crate) fn check_launch(
    kernel: Kernel,
    sig: &compose::EntrySig,
    wg: u32,
    consts: &[(&str, u32)],
    args: &[Arg<'_>],
) -> Result<()> {
    let bad = |why: String| {
        Err(Error::Internal(format!(
            "launch of {kernel:?}/{} {why}",
            sig.name
        )))
    };
    if sig.bindings.len() != args.len() {
        return bad(format!(
            "binds {} buffers, its signature {}",
            args.len(),
            sig.bindings.len()
        ));
    }
    for (a, b) in args.iter().zip(&sig.bindings) {
        if !b.elem.allows(a.dtype) {
            return bad(format!("binds {} as {} ({:?})", a.dtype, b.name, b.elem));
        }
    }
    if !sig.wgs().contains(&wg) {
        return bad(format!("uses workgroup size {wg}, not in {:?}", sig.wgs()));
    }
    if !sig.accepts_consts(consts) {
        return bad(format!("uses constants {consts:?}, not in its check lines"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn key(entry: &'static str, name: &'static str, v: u32) -> Key {
        match Key::new(Kernel::Elementwise, entry, 64, &[(name, v)], &[]) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        }
    }

    /// Names compare by address first, then by text: the same text at another address is
    /// the same key (and hashes the same), other text or another value is not.
    #[test]
    fn keys_compare_names_by_text_when_addresses_differ() {
        let entry2: &'static str = String::from("unary").leak();
        let name2: &'static str = String::from("VEC").leak();
        let a = key("unary", "VEC", 4);
        let b = key(entry2, name2, 4);
        assert!(!std::ptr::eq(a.entry, b.entry));
        assert!(a == b);
        let hasher = std::hash::BuildHasherDefault::<crate::hash::FastHasher>::default();
        assert_eq!(hasher.hash_one(a), hasher.hash_one(b));
        assert!(a != key("unary", "VEC", 8));
        assert!(a != key("unary", "VEX", 4));
        assert!(a != key("binary", "VEC", 4));
    }
}
