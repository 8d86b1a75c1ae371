//! The device: adapter choice, the wgpu device and queue, the memory pool, the command stream
//! and the pipeline cache.
//!
//! A [`Device`] is a cheap handle (`Arc`) and is `Send + Sync`: a data-loader thread can upload
//! while the main thread records kernels; both go through the one ordered stream.

use crate::error::{Error, Result, fmt_bytes};
use crate::memory::staging::DownloadPool;
use crate::memory::{Block, Event, MemoryPool, MemoryReport, MemoryStats, PoolConfig};
use crate::stream::{Pipeline, Slice, Stream};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

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

/// How to open a device. `DeviceOptions::from_env()` reads the `WGRAD_*` variables.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Pick the first adapter whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// The memory budget; `None` means the adapter's limits only.
    pub memory_limit: Option<MemoryLimit>,
    /// Disable block reuse (every allocation gets its own buffer), to hunt aliasing bugs.
    pub no_cache: bool,
    /// Record the memory event trace from the start.
    pub trace: bool,
    /// The runtime checks wgpu adds to shaders (`WGRAD_SHADER_CHECKS=full|fast|none`).
    pub shader_checks: ShaderChecks,
    /// Fill every new tensor's memory with NaN before use, so a kernel that leaves an element
    /// unwritten shows up in tests (`WGRAD_POISON=1`).
    pub poison: bool,
    /// Do not use SHADER_F16 even if present (f16 then uses packed storage).
    pub disable_f16: bool,
    /// Do not use subgroup operations even if present.
    pub disable_subgroups: bool,
    /// Do not use cooperative matrices even if present.
    pub disable_coop_matrix: bool,
}

impl DeviceOptions {
    /// Options from the environment:
    /// `WGRAD_ADAPTER=<name substring>`, `WGRAD_MEMORY_LIMIT=2GiB|50%`, `WGRAD_NO_CACHE=1`,
    /// `WGRAD_TRACE=1`, `WGRAD_POISON=1`, `WGRAD_DISABLE=f16,subgroups,coop`. wgpu's `WGPU_BACKEND` picks backends.
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let flag = |k: &str| var(k).is_some_and(|v| v != "0");
        let disable = var("WGRAD_DISABLE")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let has = |w: &str| disable.split(',').any(|x| x.trim() == w);
        Ok(DeviceOptions {
            adapter: var("WGRAD_ADAPTER"),
            memory_limit: var("WGRAD_MEMORY_LIMIT")
                .map(|v| MemoryLimit::parse(&v))
                .transpose()?,
            no_cache: flag("WGRAD_NO_CACHE"),
            trace: flag("WGRAD_TRACE"),
            poison: flag("WGRAD_POISON"),
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

/// What the device can do, as wgrad uses it.
#[derive(Clone, Debug)]
pub struct Caps {
    /// Native f16 in shaders (SHADER_F16). Without it f16 is stored packed in u32 words.
    pub f16: bool,
    /// Subgroup operations (SUBGROUP).
    pub subgroups: bool,
    /// Smallest subgroup size (0 when unknown).
    pub subgroup_min: u32,
    /// Largest subgroup size.
    pub subgroup_max: u32,
    /// GPU timestamps (TIMESTAMP_QUERY).
    pub timestamps: bool,
    /// 16x16x16 f16 -> f32 cooperative matrices (tensor cores).
    pub coop_matrix_16: bool,
    /// Largest storage binding (and page), bytes.
    pub max_binding: u64,
    /// Largest buffer, bytes.
    pub max_buffer: u64,
    /// Alignment of storage binding offsets.
    pub storage_align: u64,
    /// Alignment of uniform binding offsets.
    pub uniform_align: u64,
    /// Workgroup memory per workgroup, bytes.
    pub workgroup_storage: u32,
    /// Invocations per workgroup.
    pub max_invocations: u32,
    /// Workgroups per grid dimension.
    pub max_groups_per_dim: u32,
    /// Storage buffers per shader stage.
    pub max_storage_buffers: u32,
}

/// A readable description of the device (`Device::info`).
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Adapter name.
    pub name: String,
    /// Backend (Vulkan, Metal, Dx12, Gl).
    pub backend: String,
    /// Discrete, integrated, virtual, CPU.
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Device-local memory reported by the driver, if known.
    pub memory: Option<u64>,
    /// The memory budget in force.
    pub memory_limit: u64,
    /// Capabilities.
    pub caps: Caps,
    /// Optional features that the adapter lacks or that were disabled.
    pub missing: Vec<&'static str>,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.caps;
        let yn = |b: bool| if b { "yes" } else { "no" };
        writeln!(
            f,
            "adapter   {} ({}, {})",
            self.name, self.backend, self.device_type
        )?;
        writeln!(f, "driver    {}", self.driver)?;
        let mem = self.memory.map_or("unknown".to_string(), fmt_bytes);
        let lim = if self.memory_limit == u64::MAX {
            "none".to_string()
        } else {
            fmt_bytes(self.memory_limit)
        };
        writeln!(f, "memory    {mem} device-local, budget {lim}")?;
        writeln!(
            f,
            "features  f16 {}, subgroups {} (size {}..{}), timestamps {}, tensor cores (16x16x16 f16) {}",
            yn(c.f16),
            yn(c.subgroups),
            c.subgroup_min,
            c.subgroup_max,
            yn(c.timestamps),
            yn(c.coop_matrix_16)
        )?;
        writeln!(
            f,
            "limits    binding {}, buffer {}, workgroup memory {}, {} invocations, {} groups/dim, {} storage buffers",
            fmt_bytes(c.max_binding),
            fmt_bytes(c.max_buffer),
            fmt_bytes(c.workgroup_storage as u64),
            c.max_invocations,
            c.max_groups_per_dim,
            c.max_storage_buffers
        )?;
        if self.missing.is_empty() {
            write!(f, "missing   nothing")
        } else {
            write!(f, "missing   {}", self.missing.join(", "))
        }
    }
}

/// One adapter as listed by [`Device::all`].
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// Name (what `WGRAD_ADAPTER` matches).
    pub name: String,
    /// Backend.
    pub backend: String,
    /// Device type.
    pub device_type: String,
    /// Driver.
    pub driver: String,
}

/// A handle to a GPU (cheap to clone, `Send + Sync`).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    pub(crate) device: wgpu::Device,
    pub(crate) caps: Caps,
    info: DeviceInfo,
    pub(crate) memory: Arc<MemoryPool>,
    stream: Mutex<Stream>,
    downloads: Arc<Mutex<DownloadPool>>,
    pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    /// Counter for seeds of random kernels (rand, randn, dropout).
    rng: AtomicU64,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    pub(crate) poison: bool,
    shader_checks: ShaderChecks,
    /// The GL instance this device came from (Vulkan, Metal and DX12 share a static one).
    _gl_instance: Option<wgpu::Instance>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u8 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        wgpu::Backend::Gl => 1,
        _ => 2,
    }
}

/// wgpu's instance options from the environment (WGPU_BACKEND and wgpu's other variables),
/// limited to `backends`.
fn instance_for(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends &= backends;
    wgpu::Instance::new(desc)
}

/// The process's one instance for Vulkan, Metal and DX12, created on first use and never
/// dropped. Creating and tearing down an instance per device made NVIDIA's Vulkan driver
/// stall when many threads did it at once (seen with 16 test threads on an H200: threads stuck
/// in vkDestroyInstance and vkDestroyDevice).
fn primary_instance() -> &'static wgpu::Instance {
    static INSTANCE: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| instance_for(wgpu::Backends::PRIMARY))
}

/// Adapters and devices are opened one at a time: drivers do not take kindly to concurrent
/// context creation.
static OPENING: Mutex<()> = Mutex::new(());

fn rank(v: &mut [wgpu::Adapter]) {
    v.sort_by_key(|a| {
        let i = a.get_info();
        (type_rank(i.device_type), backend_rank(i.backend))
    });
}

/// Every adapter, best first, with the instance that owns them. GL adapters come from a
/// fresh instance, and only when no Vulkan, Metal or DX12 adapter exists (or WGPU_BACKEND
/// asks for GL): wgpu's GL backend gives all devices of one instance a single EGL context,
/// which cannot be current on two threads, so each GL device gets an instance of its own.
fn ranked_adapters() -> (Vec<wgpu::Adapter>, Option<wgpu::Instance>) {
    let mut v = pollster::block_on(primary_instance().enumerate_adapters(wgpu::Backends::PRIMARY));
    if !v.is_empty() {
        rank(&mut v);
        return (v, None);
    }
    let gl = instance_for(wgpu::Backends::SECONDARY);
    let mut v = pollster::block_on(gl.enumerate_adapters(wgpu::Backends::SECONDARY));
    rank(&mut v);
    (v, Some(gl))
}

/// Device-local memory from the Vulkan driver's heaps; `None` on other backends.
fn adapter_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    {
        // SAFETY: we only read properties of the physical device through the instance that
        // enumerated it; nothing is created or destroyed.
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
        let phd = hal.raw_physical_device();
        let props = unsafe {
            hal.shared_instance()
                .raw_instance()
                .get_physical_device_memory_properties(phd)
        };
        const DEVICE_LOCAL: u32 = 1; // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
        let n = props.memory_heap_count as usize;
        let total: u64 = props.memory_heaps[..n]
            .iter()
            .filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0)
            .map(|h| h.size)
            .sum();
        if total > 0 { Some(total) } else { None }
    }
    #[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
    {
        let _ = adapter;
        None
    }
}

impl Device {
    /// Opens the best adapter, with options from the environment (see [`DeviceOptions::from_env`]).
    pub fn new() -> Result<Self> {
        Self::with_options(DeviceOptions::from_env()?)
    }

    /// Lists every adapter wgpu can see, best first.
    pub fn all() -> Vec<AdapterSummary> {
        let _opening = lock(&OPENING);
        let (v, _gl) = ranked_adapters();
        v.iter()
            .map(|a| {
                let i = a.get_info();
                AdapterSummary {
                    name: i.name,
                    backend: format!("{:?}", i.backend),
                    device_type: format!("{:?}", i.device_type),
                    driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
                }
            })
            .collect()
    }

    /// Opens a device with explicit options.
    pub fn with_options(opts: DeviceOptions) -> Result<Self> {
        let _opening = lock(&OPENING);
        let (adapters, gl_instance) = ranked_adapters();
        if adapters.is_empty() {
            return Err(Error::NoAdapter(
                "wgpu found no adapter (on Linux without a GPU, install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into(),
            ));
        }
        let adapter = match &opts.adapter {
            None => adapters.into_iter().next(),
            Some(want) => {
                let w = want.to_lowercase();
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&w))
                    .or_else(|| {
                        eprintln!("wgrad: no adapter matches {want:?}; adapters: {names:?}");
                        None
                    })
            }
        };
        let Some(adapter) = adapter else {
            return Err(Error::NoAdapter(format!(
                "no adapter name contains {:?}",
                opts.adapter.unwrap_or_default()
            )));
        };
        let ainfo = adapter.get_info();
        let have = adapter.features();
        let mut want = wgpu::Features::empty();
        let mut missing = Vec::new();
        let mut opt = |f: wgpu::Features, name: &'static str, disabled: bool| {
            if have.contains(f) && !disabled {
                want |= f;
            } else {
                missing.push(name);
            }
        };
        opt(wgpu::Features::SHADER_F16, "SHADER_F16", opts.disable_f16);
        opt(wgpu::Features::SUBGROUP, "SUBGROUP", opts.disable_subgroups);
        opt(wgpu::Features::TIMESTAMP_QUERY, "TIMESTAMP_QUERY", false);
        opt(
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            "COOPERATIVE_MATRIX",
            opts.disable_coop_matrix,
        );
        let coop_16 = want.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            && adapter.cooperative_matrix_properties().iter().any(|p| {
                p.m_size == 16
                    && p.n_size == 16
                    && p.k_size == 16
                    && p.ab_type == wgpu::CooperativeScalarType::F16
                    && p.cr_type == wgpu::CooperativeScalarType::F32
            });
        if !coop_16 {
            want.remove(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        }
        // The adapter's real limits: wgpu's defaults would cap a binding at 128 MiB.
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgrad"),
            required_features: want,
            required_limits: limits.clone(),
            // SAFETY: cooperative matrices are experimental in wgpu; wgrad only uses them in
            // the matmul kernel, whose every shape is tested against a CPU reference.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| Error::NoAdapter(format!("request_device on {}: {e}", ainfo.name)))?;

        let errors = Arc::new(Mutex::new(Vec::new()));
        {
            let errors = Arc::clone(&errors);
            // wgpu's default handler panics; wgrad turns these into `Error::Gpu` at the next sync.
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                lock(&errors).push(e.to_string());
            }));
        }
        let lost = Arc::new(Mutex::new(None));
        {
            let lost = Arc::clone(&lost);
            device.set_device_lost_callback(move |reason, msg| {
                if reason != wgpu::DeviceLostReason::Destroyed {
                    *lock(&lost) = Some(format!("{reason:?}: {msg}"));
                }
            });
        }

        let caps = Caps {
            f16: want.contains(wgpu::Features::SHADER_F16),
            subgroups: want.contains(wgpu::Features::SUBGROUP),
            subgroup_min: ainfo.subgroup_min_size,
            subgroup_max: ainfo.subgroup_max_size,
            timestamps: want.contains(wgpu::Features::TIMESTAMP_QUERY),
            coop_matrix_16: coop_16,
            max_binding: limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
            max_buffer: limits.max_buffer_size,
            storage_align: limits.min_storage_buffer_offset_alignment as u64,
            uniform_align: limits.min_uniform_buffer_offset_alignment as u64,
            workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            max_groups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
        };
        let memory_size = adapter_memory(&adapter);
        let limit = match opts.memory_limit {
            None => u64::MAX,
            Some(MemoryLimit::Bytes(b)) => b,
            Some(MemoryLimit::Fraction(f)) => match memory_size {
                Some(m) => (m as f64 * f) as u64,
                None => {
                    return Err(Error::Unsupported(format!(
                        "a fractional memory limit needs the adapter's memory size, which {:?} does not report; give bytes instead",
                        ainfo.backend
                    )));
                }
            },
        };
        let memory = MemoryPool::new(
            device.clone(),
            PoolConfig {
                align: caps.storage_align.max(256),
                max_page: caps.max_binding,
                limit,
                no_cache: opts.no_cache,
                trace: opts.trace,
            },
        );
        let info = DeviceInfo {
            name: ainfo.name.clone(),
            backend: format!("{:?}", ainfo.backend),
            device_type: format!("{:?}", ainfo.device_type),
            driver: format!("{} {}", ainfo.driver, ainfo.driver_info)
                .trim()
                .to_string(),
            memory: memory_size,
            memory_limit: limit,
            caps: caps.clone(),
            missing,
        };
        let stream = Stream::new(device.clone(), queue, caps.uniform_align);
        let downloads = DownloadPool::new(device.clone());
        Ok(Device {
            inner: Arc::new(DeviceInner {
                device,
                caps,
                info,
                memory,
                stream: Mutex::new(stream),
                downloads: Arc::new(Mutex::new(downloads)),
                pipelines: Mutex::new(HashMap::new()),
                rng: AtomicU64::new(0x5eed),
                errors,
                lost,
                poison: opts.poison,
                shader_checks: opts.shader_checks,
                _gl_instance: gl_instance,
            }),
        })
    }

    /// Adapter, backend, driver, features and limits.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Capabilities in use.
    pub fn caps(&self) -> &Caps {
        &self.inner.caps
    }

    /// True when both handles name the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Errors if the device was lost or wgpu reported an error since the last check.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(msg) = lock(&self.inner.lost).clone() {
            return Err(Error::DeviceLost(msg));
        }
        let mut errs = lock(&self.inner.errors);
        if !errs.is_empty() {
            let msg = errs.join("; ");
            errs.clear();
            return Err(Error::Gpu(msg));
        }
        Ok(())
    }

    /// Submits everything queued and waits until the device has finished it.
    pub fn sync(&self) -> Result<()> {
        let idx = lock(&self.inner.stream).flush()?;
        if let Some(idx) = idx {
            self.wait(idx)?;
        }
        self.check()
    }

    /// Submits everything queued without waiting.
    pub fn flush(&self) -> Result<()> {
        lock(&self.inner.stream).flush()?;
        self.check()
    }

    fn wait(&self, idx: wgpu::SubmissionIndex) -> Result<()> {
        self.inner
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::DeviceLost(e.to_string()))
    }

    // ----- memory -----

    /// A block of device memory of at least `bytes`.
    pub(crate) fn alloc(&self, bytes: u64) -> Result<Block> {
        self.check()?;
        self.inner.memory.alloc(bytes)
    }

    /// Counters of the memory pool and staging buffers.
    pub fn memory_stats(&self) -> MemoryStats {
        let mut s = self.inner.memory.stats();
        {
            let st = lock(&self.inner.stream);
            s.upload_buffers = st.belt.created;
            s.upload_bytes = st.belt.bytes;
        }
        let d = lock(&self.inner.downloads);
        s.download_buffers = d.created;
        s.download_bytes = d.bytes;
        s
    }

    /// A report to print: allocated, active, reserved and their peaks, the cache hit rate,
    /// device allocations, staging.
    pub fn memory_report(&self) -> MemoryReport {
        MemoryReport {
            adapter: self.inner.info.name.clone(),
            stats: self.memory_stats(),
        }
    }

    /// Releases cached pages and idle staging buffers back to the driver.
    pub fn empty_cache(&self) {
        self.inner.memory.empty_cache();
        lock(&self.inner.stream).belt.trim();
        lock(&self.inner.downloads).trim();
    }

    /// Sets every peak to the current value.
    pub fn reset_peak(&self) {
        self.inner.memory.reset_peak();
    }

    /// Changes the memory budget. Live tensors stay; later allocations obey the new limit.
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        self.inner.memory.set_limit(limit.unwrap_or(u64::MAX));
    }

    /// Turns the memory event trace on or off.
    pub fn set_memory_trace(&self, on: bool) {
        self.inner.memory.set_trace(on);
    }

    /// The memory trace as JSON (see `memory::Event` for the fields).
    pub fn memory_trace_json(&self) -> String {
        self.inner.memory.trace_json()
    }

    /// The memory trace's events.
    pub fn memory_events(&self) -> Vec<Event> {
        self.inner.memory.trace_events()
    }

    /// Clears the memory trace.
    pub fn clear_memory_trace(&self) {
        self.inner.memory.clear_trace();
    }

    /// Runs `f` inside a named memory scope: trace events carry the name, and the report says
    /// how many bytes were allocated and the peak inside, and how long it took (device work
    /// included: the scope syncs at its end).
    pub fn track<T>(&self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<(T, ScopeReport)> {
        let before = self.inner.memory.stats().allocated;
        let t0 = Instant::now();
        self.inner.memory.push_scope(name);
        let out = f();
        let synced = self.sync();
        let peak = self.inner.memory.pop_scope();
        let out = out?;
        synced?;
        let after = self.inner.memory.stats().allocated;
        Ok((
            out,
            ScopeReport {
                name: name.to_string(),
                allocated_before: before,
                allocated_after: after,
                peak,
                time: t0.elapsed(),
            },
        ))
    }

    /// Opens a named memory scope without syncing (layers and the trainer use it); close it
    /// with [`Device::end_scope`].
    pub fn begin_scope(&self, name: &str) {
        self.inner.memory.push_scope(name);
    }

    /// Closes the innermost scope and returns its peak of allocated bytes.
    pub fn end_scope(&self) -> u64 {
        self.inner.memory.pop_scope()
    }

    // ----- random seeds -----

    /// Resets the seed counter that rand, randn and dropout draw from.
    pub fn manual_seed(&self, seed: u64) {
        self.inner.rng.store(seed, Ordering::Relaxed);
    }

    /// The next seed (each random op takes one).
    pub(crate) fn next_seed(&self) -> u64 {
        self.inner.rng.fetch_add(1, Ordering::Relaxed)
    }

    /// The seed counter, to replay random ops (checkpointing).
    pub(crate) fn seed_state(&self) -> u64 {
        self.inner.rng.load(Ordering::Relaxed)
    }

    /// Restores the seed counter.
    pub(crate) fn set_seed_state(&self, s: u64) {
        self.inner.rng.store(s, Ordering::Relaxed);
    }

    // ----- pipelines and commands -----

    /// The cached pipeline for `key`, built from `source()` on first use. `n_storage` storage
    /// buffers are bound after the parameter uniform at binding 0.
    pub(crate) fn pipeline(
        &self,
        key: &str,
        n_storage: usize,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<Pipeline>> {
        if let Some(p) = lock(&self.inner.pipelines).get(key) {
            return Ok(Arc::clone(p));
        }
        let src = source()?;
        let dev = &self.inner.device;
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }];
        for i in 0..n_storage {
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                // Read-write even for inputs: tensors share page buffers, and wgpu forbids one
                // buffer bound read-only and read-write in the same dispatch.
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
        }
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(key),
            entries: &entries,
        });
        let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(key),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let checks = match self.inner.shader_checks {
            ShaderChecks::Full => wgpu::ShaderRuntimeChecks::checked(),
            ShaderChecks::Fast => wgpu::ShaderRuntimeChecks {
                force_loop_bounding: false,
                int_div_checks: false,
                ..wgpu::ShaderRuntimeChecks::checked()
            },
            ShaderChecks::None => wgpu::ShaderRuntimeChecks::unchecked(),
        };
        // SAFETY: wgrad's shaders have no unbounded loops (every trip count comes from sizes
        // the host validated) and never divide by zero (divisors are non-empty dimensions);
        // with `Fast` and `Full` wgpu still bounds-checks every buffer access.
        let module = unsafe {
            dev.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(key),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                },
                checks,
            )
        };
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
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
            return Err(Error::Gpu(format!("building kernel {key}: {e}")));
        }
        let p = Arc::new(Pipeline {
            pipeline,
            layout,
            label: key.into(),
        });
        lock(&self.inner.pipelines).insert(key.to_string(), Arc::clone(&p));
        Ok(p)
    }

    /// Number of pipelines built so far.
    pub fn pipeline_count(&self) -> usize {
        lock(&self.inner.pipelines).len()
    }

    /// Records a dispatch.
    pub(crate) fn dispatch(
        &self,
        pipe: &Pipeline,
        params: &[u32],
        storage: &[Slice<'_>],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.inner.caps.max_groups_per_dim;
        if let Some(&g) = groups.iter().find(|&&g| g > max) {
            return Err(Error::LimitExceeded {
                what: format!("dispatch of {}", pipe.label),
                requested: g as u64,
                limit_name: "max_compute_workgroups_per_dimension",
                limit: max as u64,
            });
        }
        lock(&self.inner.stream).dispatch(pipe, params, storage, groups)
    }

    /// Records an upload of `data` into `block` at byte `offset`.
    pub(crate) fn upload(&self, block: &Block, offset: u64, data: &[u8]) -> Result<()> {
        lock(&self.inner.stream).upload(block.buffer(), block.offset() + offset, data)
    }

    /// Records a plain buffer-to-buffer copy of `bytes` between two blocks, which must not
    /// share a page (wgpu forbids copies within one buffer). The bench uses it as the
    /// device's memory-bandwidth ceiling.
    pub(crate) fn copy_blocks(&self, src: &Block, dst: &Block, bytes: u64) -> Result<()> {
        if src.buffer() == dst.buffer() {
            return Err(Error::invalid(
                "copy",
                "source and destination share a buffer",
            ));
        }
        let len = bytes.div_ceil(4) * 4;
        lock(&self.inner.stream).copy(src.buffer(), src.offset(), dst.buffer(), dst.offset(), len);
        Ok(())
    }

    /// Starts a read-back of `len` bytes of `block`: records the copy, submits, and asks for
    /// the staging buffer to be mapped. The returned future resolves once the data is here.
    pub(crate) fn read_block<T: bytemuck::Pod>(
        &self,
        block: &Block,
        len: u64,
    ) -> Result<Readback<T>> {
        self.check()?;
        let padded = len.div_ceil(4) * 4;
        let state = Arc::new(Mutex::new(MapState {
            done: None,
            waker: None,
        }));
        if padded == 0 {
            lock(&state).done = Some(true);
            return Ok(Readback {
                dev: self.clone(),
                staging: None,
                len: 0,
                padded: 0,
                idx: None,
                state,
                poller: true,
                _t: PhantomData,
            });
        }
        let staging = lock(&self.inner.downloads).get(padded);
        let idx = {
            let mut st = lock(&self.inner.stream);
            st.copy(block.buffer(), block.offset(), &staging, 0, padded);
            st.flush()?
        };
        let st2 = Arc::clone(&state);
        staging.map_async(wgpu::MapMode::Read, 0..padded, move |r| {
            let mut s = lock(&st2);
            s.done = Some(r.is_ok());
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        Ok(Readback {
            dev: self.clone(),
            staging: Some(staging),
            len,
            padded,
            idx,
            state,
            poller: false,
            _t: PhantomData,
        })
    }
}

/// What [`Device::track`] measured.
#[derive(Clone, Debug)]
pub struct ScopeReport {
    /// The scope's name.
    pub name: String,
    /// Allocated bytes when the scope began.
    pub allocated_before: u64,
    /// Allocated bytes when it ended.
    pub allocated_after: u64,
    /// Peak of allocated bytes inside the scope.
    pub peak: u64,
    /// Wall time, device work included.
    pub time: Duration,
}

impl fmt::Display for ScopeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let delta = self.allocated_after as i128 - self.allocated_before as i128;
        let sign = if delta < 0 { "-" } else { "+" };
        write!(
            f,
            "{}: {sign}{} allocated, peak {} ({} above the start), {:.2} ms",
            self.name,
            fmt_bytes(delta.unsigned_abs() as u64),
            fmt_bytes(self.peak),
            fmt_bytes(self.peak.saturating_sub(self.allocated_before)),
            self.time.as_secs_f64() * 1e3
        )
    }
}

struct MapState {
    done: Option<bool>,
    waker: Option<Waker>,
}

/// A read-back in flight, resolving to the elements as `Vec<T>`. Await it, or call
/// [`Readback::wait`] to block.
pub struct Readback<T> {
    dev: Device,
    staging: Option<wgpu::Buffer>,
    len: u64,
    padded: u64,
    idx: Option<wgpu::SubmissionIndex>,
    state: Arc<Mutex<MapState>>,
    poller: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: bytemuck::Pod> Readback<T> {
    /// Blocks until the data is here.
    pub fn wait(mut self) -> Result<Vec<T>> {
        if lock(&self.state).done.is_none() {
            match self.idx.clone() {
                Some(idx) => self.dev.wait(idx)?,
                None => {
                    self.dev
                        .inner
                        .device
                        .poll(wgpu::PollType::wait_indefinitely())
                        .map_err(|e| Error::DeviceLost(e.to_string()))?;
                }
            }
        }
        // Another thread's poll may have collected the map callback and be about to run it:
        // the submission is done, the callback not yet. Poll until it has run (briefly).
        let t0 = Instant::now();
        while lock(&self.state).done.is_none() {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(Error::DeviceLost(
                    "a read-back buffer was never mapped".into(),
                ));
            }
            self.dev
                .inner
                .device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| Error::DeviceLost(e.to_string()))?;
            std::thread::yield_now();
        }
        self.take()
    }

    fn take(&mut self) -> Result<Vec<T>> {
        let ok = lock(&self.state).done;
        let Some(staging) = self.staging.take() else {
            return Ok(Vec::new());
        };
        if ok != Some(true) {
            return Err(Error::DeviceLost(
                "mapping a read-back buffer failed".into(),
            ));
        }
        // One copy, straight from the mapping into the result's elements.
        let n = self.len as usize / std::mem::size_of::<T>();
        let mut out = vec![T::zeroed(); n];
        if self.padded > 0 {
            let view = staging
                .get_mapped_range(0..self.padded)
                .map_err(|e| Error::Gpu(format!("read-back map: {e}")))?;
            bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&view[..self.len as usize]);
            drop(view);
            staging.unmap();
        }
        lock(&self.dev.inner.downloads).put(staging);
        self.dev.check()?;
        Ok(out)
    }
}

impl<T: bytemuck::Pod> Future for Readback<T> {
    type Output = Result<Vec<T>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        {
            let mut s = lock(&self.state);
            if s.done.is_none() {
                s.waker = Some(cx.waker().clone());
            }
        }
        if lock(&self.state).done.is_some() {
            return Poll::Ready(self.take());
        }
        // Native wgpu runs map callbacks only inside `poll`; a helper thread waits for this
        // submission so the callback fires and wakes us, and the caller's thread stays free.
        if !self.poller {
            self.poller = true;
            let dev = self.dev.inner.device.clone();
            let idx = self.idx.clone();
            std::thread::spawn(move || {
                let _ = dev.poll(wgpu::PollType::Wait {
                    submission_index: idx,
                    timeout: None,
                });
            });
        }
        Poll::Pending
    }
}

impl<T> Drop for Readback<T> {
    fn drop(&mut self) {
        // A read-back dropped before completion: its buffer is still mapped or mapping; let
        // wgpu release it rather than return a mapped buffer to the pool.
        if let Some(b) = self.staging.take() {
            let mut d = lock(&self.dev.inner.downloads);
            d.bytes -= b.size();
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Device({}, {})",
            self.inner.info.name, self.inner.info.backend
        )
    }
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
