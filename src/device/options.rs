//! How a device is opened: the options, and the `WGRAD_*` environment variables that set them.

use crate::error::{Error, Result};

/// A memory budget: absolute, or a fraction of the adapter's device-local memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryLimit {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction (0, 1] of the adapter's memory (Vulkan reports it; elsewhere
    /// this gives `Error::Unsupported`).
    Fraction(f64),
}

impl MemoryLimit {
    /// Parses `2GiB`, `512MiB`, `1.5GB`, `1000000`, or `50%`.
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.trim();
        let bad = || {
            Error::invalid(
                "memory limit",
                format!("cannot parse {s:?} (try 2GiB, 512MiB or 50%)"),
            )
        };
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad());
            }
            return Ok(MemoryLimit::Fraction(v / 100.0));
        }
        let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let v: f64 = num.trim().parse().map_err(|_| bad())?;
        let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "kib" => 1024.0,
            "m" | "mb" => 1e6,
            "mib" => 1024.0 * 1024.0,
            "g" | "gb" => 1e9,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad()),
        };
        // NaN fails too.
        if v.is_nan() || v < 0.0 {
            return Err(bad());
        }
        Ok(MemoryLimit::Bytes((v * mul) as u64))
    }
}

/// Which adapter to open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AdapterChoice {
    /// The best one (discrete before integrated before CPU).
    #[default]
    Best,
    /// The first whose name contains this (case-insensitive).
    Name(String),
    /// The n-th in [`Device::all`](crate::Device::all)'s order.
    Index(usize),
}

/// How f32 matrix products are computed (PyTorch's `set_float32_matmul_precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// In f32 throughout (the default).
    #[default]
    Highest,
    /// On tensor cores where the device has f16 ones: each f32 operand, scaled by a power of
    /// two per row (A) or column (B), is split into two f16 parts, and three f16 products
    /// with f32 accumulation (hi x hi + hi x lo + lo x hi) stand for the f32 one. The parts
    /// keep about 22 of an operand's 24 significant bits; the tensor cores' accumulation,
    /// which truncates, adds an error that grows with K (about 2.7e-5 of the output at
    /// K = 4096 where the f32 kernel has 1.7e-6: docs/performance.md,
    /// `MatmulPrecision::High`). Elsewhere, and for products
    /// under 2^32 multiply-adds (where the extra passes cost more than they save), this is
    /// `Highest`. Convolutions keep their f32 products.
    High,
}

impl MatmulPrecision {
    /// Parses `highest` or `high`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "highest" => Ok(MatmulPrecision::Highest),
            "high" => Ok(MatmulPrecision::High),
            other => Err(Error::invalid(
                "matmul precision",
                format!("{other:?} is not highest or high"),
            )),
        }
    }
}

/// How to open a device. `DeviceOptions::from_env()` reads the `WGRAD_*` variables.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Which adapter (`WGRAD_ADAPTER`: a name part, or `#N` for the N-th adapter).
    pub adapter: AdapterChoice,
    /// The memory budget; `None` means the adapter's limits only.
    pub memory_limit: Option<MemoryLimit>,
    /// Disable block reuse (every allocation gets its own buffer), to hunt aliasing bugs.
    pub no_cache: bool,
    /// Keep at most this much memory in empty cached pages, returning the rest to the driver
    /// as pages empty (`WGRAD_RELEASE_THRESHOLD=512MiB|5%`); `None` keeps every page until
    /// [`Device::empty_cache`](crate::Device::empty_cache).
    pub release_threshold: Option<MemoryLimit>,
    /// Record the memory event trace from the start.
    pub trace: bool,
    /// The runtime checks wgpu adds to shaders (`WGRAD_SHADER_CHECKS=full|fast|none`).
    pub shader_checks: ShaderChecks,
    /// Fill every new tensor's memory with NaN before use, so a kernel that leaves an element
    /// unwritten shows up in tests (`WGRAD_POISON=1`).
    pub poison: bool,
    /// Check index inputs (embedding indices, class labels) on the host before use and return
    /// an error naming the op and the bad index, instead of a NaN result (`WGRAD_CHECKED=1`).
    /// Costs a read-back (a sync) per checked op.
    pub checked: bool,
    /// Do not use SHADER_F16 even if present (f16 then uses packed storage).
    pub disable_f16: bool,
    /// Do not use subgroup operations even if present.
    pub disable_subgroups: bool,
    /// Do not use cooperative matrices even if present.
    pub disable_coop_matrix: bool,
    /// Do not hand wgrad-compiled SPIR-V to the driver (wgpu's PASSTHROUGH_SHADERS): the
    /// kernels that need it are then not used, and those that prefer it are compiled by
    /// wgpu (`WGRAD_DISABLE=spirv`).
    pub disable_spirv: bool,
    /// Do not let kernels read and write the elements of cooperative matrices in registers
    /// (`WGRAD_DISABLE=elements`): the tensor-core attention then keeps its scores in
    /// workgroup memory, as on drivers whose element layout it does not know.
    pub disable_coop_elements: bool,
    /// Do not open the device with bf16 cooperative matrices (`VK_KHR_shader_bfloat16`) even
    /// where the Vulkan driver has them (`WGRAD_DISABLE=bf16_coop`): bf16 products then run on
    /// the f32 kernels.
    pub disable_bf16_coop: bool,
    /// Encode and submit command batches on the thread that records them, instead of on the
    /// device's submit thread (`WGRAD_DISABLE=submit_thread`).
    pub disable_submit_thread: bool,
    /// How f32 matrix products are computed (`WGRAD_MATMUL_PRECISION=highest|high`); it can
    /// be changed later with [`Device::set_matmul_precision`](crate::Device::set_matmul_precision).
    pub matmul_precision: MatmulPrecision,
}

impl DeviceOptions {
    /// Options from the environment:
    /// `WGRAD_ADAPTER=<name part>|#N`, `WGRAD_MEMORY_LIMIT=2GiB|50%`,
    /// `WGRAD_RELEASE_THRESHOLD=512MiB|5%`, `WGRAD_NO_CACHE=1`,
    /// `WGRAD_TRACE=1`, `WGRAD_POISON=1`, `WGRAD_CHECKED=1`, `WGRAD_DISABLE=f16,subgroups,coop,bf16_coop,spirv,elements,submit_thread`,
    /// `WGRAD_MATMUL_PRECISION=highest|high`.
    /// wgpu's `WGPU_BACKEND` picks backends.
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let flag = |k: &str| var(k).is_some_and(|v| v != "0");
        let disable = var("WGRAD_DISABLE")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let has = |w: &str| disable.split(',').any(|x| x.trim() == w);
        let adapter = match var("WGRAD_ADAPTER") {
            None => AdapterChoice::Best,
            Some(v) => match v.strip_prefix('#') {
                Some(n) => AdapterChoice::Index(n.trim().parse().map_err(|_| {
                    Error::invalid("WGRAD_ADAPTER", format!("{v:?}: #N needs a number"))
                })?),
                None => AdapterChoice::Name(v),
            },
        };
        Ok(DeviceOptions {
            adapter,
            memory_limit: var("WGRAD_MEMORY_LIMIT")
                .map(|v| MemoryLimit::parse(&v))
                .transpose()?,
            no_cache: flag("WGRAD_NO_CACHE"),
            release_threshold: var("WGRAD_RELEASE_THRESHOLD")
                .map(|v| MemoryLimit::parse(&v))
                .transpose()?,
            trace: flag("WGRAD_TRACE"),
            poison: flag("WGRAD_POISON"),
            checked: flag("WGRAD_CHECKED"),
            shader_checks: match var("WGRAD_SHADER_CHECKS").as_deref() {
                None | Some("fast") => ShaderChecks::Fast,
                Some("full") => ShaderChecks::Full,
                Some("none") => ShaderChecks::None,
                Some(other) => {
                    return Err(Error::invalid(
                        "WGRAD_SHADER_CHECKS",
                        format!("{other:?} is not full, fast or none"),
                    ));
                }
            },
            disable_f16: has("f16"),
            disable_subgroups: has("subgroups") || has("subgroup"),
            disable_coop_matrix: has("coop"),
            disable_spirv: has("spirv"),
            disable_coop_elements: has("elements"),
            disable_bf16_coop: has("bf16_coop"),
            disable_submit_thread: has("submit_thread"),
            matmul_precision: var("WGRAD_MATMUL_PRECISION")
                .map(|v| MatmulPrecision::parse(&v))
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// Runtime checks wgpu injects into every shader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShaderChecks {
    /// wgpu's defaults: buffer bounds checks, a counter on every loop (so no loop can hang the
    /// GPU), guards on integer division.
    Full,
    /// Buffer bounds checks only (the default). wgrad's loops all have bounds the host
    /// computes, and its divisors are never zero, so the loop counters and division guards
    /// only cost time; bounds checks stay, so a kernel bug cannot touch another tensor's page.
    #[default]
    Fast,
    /// No checks at all (for measuring what the checks cost).
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_limits() {
        assert_eq!(
            MemoryLimit::parse("2GiB").ok(),
            Some(MemoryLimit::Bytes(2 << 30))
        );
        assert_eq!(
            MemoryLimit::parse("512 MiB").ok(),
            Some(MemoryLimit::Bytes(512 << 20))
        );
        assert_eq!(
            MemoryLimit::parse("1000").ok(),
            Some(MemoryLimit::Bytes(1000))
        );
        assert_eq!(
            MemoryLimit::parse("50%").ok(),
            Some(MemoryLimit::Fraction(0.5))
        );
        assert!(MemoryLimit::parse("lots").is_err());
        assert!(MemoryLimit::parse("150%").is_err());
        assert!(MemoryLimit::parse("-1GiB").is_err());
    }
}
