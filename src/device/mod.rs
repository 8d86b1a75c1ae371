//! The device: one opened adapter with its queue, memory pool and command stream.
//!
//! A [`Device`] is a cheap handle (`Arc`) and is `Send + Sync`: a data-loader thread can upload
//! while the main thread records kernels; both go through the one ordered stream.
//!
//! Open one with [`Device::new`] (the best adapter, options from the `WGRAD_*` environment),
//! [`Device::with_index`] or [`Device::with_options`] ([`DeviceOptions`]); [`Device::all`]
//! lists the adapters. Besides making tensors, the device answers for its memory
//! ([`Device::memory_stats`], [`Device::memory_report`], [`Device::set_memory_limit`]), its
//! random seed ([`Device::manual_seed`]), its kernel profiler ([`Device::start_profiling`])
//! and waiting for queued work ([`Device::sync`]).
//!
//! Files: `options` (how to open one, the environment), `adapter` (which adapter, and the
//! lock around driver calls that create and destroy devices), `stream` (ordered, batched
//! command recording), `readback` (results coming back). Pipelines are built by the kernels
//! layer, which keeps its cache in the device's `Device::kernel_state` slot.

mod adapter;
pub(crate) mod bind_cache;
mod hardware;
mod options;
pub mod profile;
mod readback;
pub(crate) mod stream;
mod submit;

pub use adapter::AdapterSummary;
pub use hardware::DeviceProfile;
pub(crate) use hardware::{CoresFromEnv, cores_from_env};
pub use options::{AdapterChoice, DeviceOptions, MatmulPrecision, MemoryLimit, ShaderChecks};
pub use profile::Profile;
pub use readback::Readback;

use crate::error::{Error, Result, fmt_bytes};
use crate::memory::staging::DownloadPool;
use crate::memory::{Block, Event, MemoryPool, MemoryReport, MemoryStats, PoolConfig};
use adapter::{DEVICE_LIFECYCLE, lock};
use bind_cache::BindCache;
use readback::{MapAfter, MapState};
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stream::{Pipeline, Slice, Stream};

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
    /// 16x16x16 bf16 -> f32 cooperative matrices, in wgrad's own SPIR-V (Vulkan's
    /// `VK_KHR_shader_bfloat16`; off with `WGRAD_DISABLE=bf16_coop`).
    pub coop_bf16_16: bool,
    /// SPIR-V that wgrad compiles itself goes to the driver as is (Vulkan's
    /// PASSTHROUGH_SHADERS): the tensor-core product whose operand staging WGSL cannot
    /// express, and kernels that run faster with their loops kept rolled (`kernels::spirv`).
    pub spirv: bool,
    /// Kernels may read and write the elements of cooperative matrices (wgrad's own SPIR-V;
    /// where they lie is measured once, `kernels::coop_layout`). Off with
    /// `WGRAD_DISABLE=elements`.
    pub coop_elements: bool,
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

impl DeviceInfo {
    /// True for adapters that run on the CPU (lavapipe, llvmpipe, WARP): examples pick smaller
    /// default configurations there.
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }
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
            "features  f16 {}, subgroups {} (size {}..{}), timestamps {}, tensor cores (16x16x16 f16) {}, bf16 {}, own SPIR-V {}",
            yn(c.f16),
            yn(c.subgroups),
            c.subgroup_min,
            c.subgroup_max,
            yn(c.timestamps),
            yn(c.coop_matrix_16),
            yn(c.coop_bf16_16),
            yn(c.spirv)
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

/// A handle to a GPU (cheap to clone, `Send + Sync`).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

/// The device's state. Everything that holds a wgpu object lives in `parts`, dropped under
/// [`DEVICE_LIFECYCLE`] so teardown never overlaps another thread's device creation.
pub(crate) struct DeviceInner {
    parts: ManuallyDrop<Parts>,
}

pub(crate) struct Parts {
    pub(crate) device: wgpu::Device,
    pub(crate) caps: Caps,
    hardware: DeviceProfile,
    /// `hardware` with the core count the kernels layer measured, once it has
    /// (`kernels::cores`).
    measured_hardware: OnceLock<DeviceProfile>,
    info: DeviceInfo,
    pub(crate) memory: Arc<MemoryPool>,
    stream: Mutex<Stream>,
    pub(crate) downloads: Arc<Mutex<DownloadPool>>,
    /// Owned by the kernels layer (its pipeline cache); opaque here.
    kernel_state: OnceLock<Box<dyn Any + Send + Sync>>,
    /// Counter for seeds of random kernels (rand, randn, dropout).
    rng: AtomicU64,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// Set (never cleared) once wgpu has reported an error or a loss: until then `check`
    /// reads this one flag instead of taking two locks, at every allocation.
    trouble: Arc<AtomicBool>,
    pub(crate) poison: bool,
    pub(crate) checked: bool,
    pub(crate) shader_checks: ShaderChecks,
    /// [`MatmulPrecision::High`] when set.
    matmul_high: AtomicBool,
    /// The GL instance this device came from (Vulkan, Metal and DX12 share a static one).
    _gl_instance: Option<wgpu::Instance>,
    /// What to keep the wgpu device under when this one closes (see [`IDLE`]).
    reuse: Option<IdleKey>,
}

impl Deref for DeviceInner {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let _g = lock(&DEVICE_LIFECYCLE);
        // Batches handed to the submit thread reach the queue first; then let queued work
        // finish before its buffers and the device go.
        let _ = lock(&self.parts.stream).drain();
        let _ = self.parts.device.poll(wgpu::PollType::wait_indefinitely());
        // SAFETY: `parts` is taken exactly once, here, and never used afterwards.
        let parts = unsafe { ManuallyDrop::take(&mut self.parts) };
        let Parts {
            device,
            memory,
            stream,
            downloads,
            kernel_state,
            lost,
            reuse,
            _gl_instance,
            ..
        } = parts;
        // Buffers, pipelines and staging memory go now; the wgpu device and queue may stay.
        drop((memory, downloads, kernel_state));
        let queue = stream
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_queue();
        let healthy = lock(&lost).is_none();
        match reuse {
            Some(key) if healthy && _gl_instance.is_none() => {
                // Collect what was just dropped, so an idle device holds no memory.
                let _ = device.poll(wgpu::PollType::wait_indefinitely());
                lock(&IDLE).push(Idle { key, device, queue });
            }
            _ => drop((queue, device, _gl_instance)),
        }
    }
}

/// What a kept device was opened with: a new device reuses it only for the same adapter,
/// features and limits.
#[derive(PartialEq)]
struct IdleKey {
    index: usize,
    adapter: wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: wgpu::Limits,
    /// Opened with bf16 cooperative matrices (`hardware::open_with_bf16`).
    bf16: bool,
}

struct Idle {
    key: IdleKey,
    device: wgpu::Device,
    queue: wgpu::Queue,
}

/// Closed devices, kept for the next `Device` on the same adapter instead of destroyed.
/// NVIDIA's Vulkan driver (580) sometimes never returns from `vkDestroyDevice` while
/// other devices of the process are busy: two data-parallel tests, each closing devices while
/// the other still ran, hung 4 of 9 runs inside it. Reuse avoids the call, and opening a
/// device becomes cheap. The list holds at most as many devices as were ever open at once;
/// they go when the process exits. Every buffer and pipeline of a closed device is freed
/// before it joins the list.
static IDLE: Mutex<Vec<Idle>> = Mutex::new(Vec::new());

impl Device {
    /// Opens the best adapter, with options from the environment (see [`DeviceOptions::from_env`]).
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// println!("{}", dev.info()); // adapter, backend, driver, features, limits
    /// let t = dev.tensor(&[1.0f32, 2.0], &[2])?;
    /// assert!(t.device().same(&dev));
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Result<Self> {
        Self::with_options(DeviceOptions::from_env()?)
    }

    /// Opens the adapter at `index` of [`Device::all`], with the other options from the
    /// environment. Two devices on one adapter are independent (their own memory and queue).
    pub fn with_index(index: usize) -> Result<Self> {
        let mut o = DeviceOptions::from_env()?;
        o.adapter = AdapterChoice::Index(index);
        Self::with_options(o)
    }

    /// Lists every adapter wgpu can see, best first.
    pub fn all() -> Vec<AdapterSummary> {
        adapter::list()
    }

    /// Opens a device with explicit options.
    ///
    /// ```
    /// use wgrad::{Device, DeviceOptions, MemoryLimit};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = Device::with_options(DeviceOptions {
    ///     memory_limit: Some(MemoryLimit::Bytes(256 << 20)),
    ///     ..DeviceOptions::from_env()?
    /// })?;
    /// assert_eq!(dev.memory_stats().limit, 256 << 20);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_options(opts: DeviceOptions) -> Result<Self> {
        let _g = lock(&DEVICE_LIFECYCLE);
        let (index, adapter, gl_instance) = adapter::choose(&opts.adapter)?;
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
        // Only Vulkan takes SPIR-V as is (lavapipe too, so CI runs wgrad's own SPIR-V).
        let spirv = ainfo.backend == wgpu::Backend::Vulkan
            && have.contains(wgpu::Features::PASSTHROUGH_SHADERS)
            && !opts.disable_spirv;
        if spirv {
            want |= wgpu::Features::PASSTHROUGH_SHADERS;
        }
        // bf16 cooperative matrices need wgrad's SPIR-V (WGSL has no bf16) and a device
        // opened with VK_KHR_shader_bfloat16 (`hardware::open_with_bf16`).
        let coop_bf16 = coop_16
            && spirv
            && !opts.disable_bf16_coop
            && ainfo.backend == wgpu::Backend::Vulkan
            && hardware::bf16_coop_16(&adapter);
        // The adapter's real limits: wgpu's defaults would cap a binding at 128 MiB.
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgrad"),
            required_features: want,
            required_limits: limits.clone(),
            // SAFETY: cooperative matrices are experimental in wgpu; wgrad only uses them in
            // kernels whose every shape is tested against a CPU reference.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let mut key = IdleKey {
            index,
            adapter: ainfo.clone(),
            features: want,
            limits: limits.clone(),
            bf16: coop_bf16,
        };
        let kept = {
            let mut idle = lock(&IDLE);
            idle.iter()
                .position(|d| d.key == key)
                .map(|i| idle.swap_remove(i))
        };
        let opened_with_bf16 = match kept {
            Some(_) => None,
            // A driver that lists bf16 matrices but fails to open a device with them gets the
            // device wgpu would open, without them.
            None if coop_bf16 => hardware::open_with_bf16(&adapter, &desc).ok(),
            None => None,
        };
        let coop_bf16 = coop_bf16 && (kept.is_some() || opened_with_bf16.is_some());
        key.bf16 = coop_bf16;
        let (device, queue) = match (kept, opened_with_bf16) {
            (Some(d), _) => (d.device, d.queue),
            (None, Some(opened)) => opened,
            (None, None) => pollster::block_on(adapter.request_device(&desc))
                .map_err(|e| Error::NoAdapter(format!("request_device on {}: {e}", ainfo.name)))?,
        };
        let reuse = gl_instance.is_none().then_some(key);

        let errors = Arc::new(Mutex::new(Vec::new()));
        let trouble = Arc::new(AtomicBool::new(false));
        {
            let (errors, trouble) = (Arc::clone(&errors), Arc::clone(&trouble));
            // wgpu's default handler panics; wgrad turns these into `Error::Gpu` at the next sync.
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                lock(&errors).push(e.to_string());
                trouble.store(true, Ordering::Release);
            }));
        }
        let lost = Arc::new(Mutex::new(None));
        {
            let (lost, trouble) = (Arc::clone(&lost), Arc::clone(&trouble));
            device.set_device_lost_callback(move |reason, msg| {
                if reason != wgpu::DeviceLostReason::Destroyed {
                    *lock(&lost) = Some(format!("{reason:?}: {msg}"));
                    trouble.store(true, Ordering::Release);
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
            coop_bf16_16: coop_bf16,
            spirv,
            coop_elements: coop_16 && spirv && !opts.disable_coop_elements,
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
        let hardware = DeviceProfile {
            cpu: ainfo.device_type == wgpu::DeviceType::Cpu,
            cores: match hardware::cores_from_env() {
                hardware::CoresFromEnv::Given(n) => Some(n),
                hardware::CoresFromEnv::Measure | hardware::CoresFromEnv::Unknown => None,
                hardware::CoresFromEnv::Unset => hardware::compute_units(&adapter),
            },
            subgroups: caps
                .subgroups
                .then_some((caps.subgroup_min, caps.subgroup_max)),
            f16: caps.f16,
            coop_f16_16: caps.coop_matrix_16,
            coop_bf16_16: caps.coop_bf16_16,
            spirv: caps.spirv,
            workgroup_storage: caps.workgroup_storage,
        };
        let memory_size = adapter::device_memory(&adapter);
        let bytes = |l: Option<MemoryLimit>| -> Result<u64> {
            Ok(match l {
                None => u64::MAX,
                Some(MemoryLimit::Bytes(b)) => b,
                Some(MemoryLimit::Fraction(f)) => match memory_size {
                    Some(m) => (m as f64 * f) as u64,
                    None => {
                        return Err(Error::Unsupported(format!(
                            "a fraction of memory needs the adapter's memory size, which {:?} does not report; give bytes instead",
                            ainfo.backend
                        )));
                    }
                },
            })
        };
        let limit = bytes(opts.memory_limit)?;
        let release_threshold = bytes(opts.release_threshold)?;
        let binds = Arc::new(Mutex::new(BindCache::default()));
        let forget = Arc::clone(&binds);
        let memory = MemoryPool::new(
            device.clone(),
            PoolConfig {
                align: caps.storage_align.max(256),
                max_page: caps.max_binding,
                limit,
                no_cache: opts.no_cache,
                trace: opts.trace,
                release_threshold,
                on_page_release: Some(Box::new(move |page| lock(&forget).forget(page))),
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
        let stream = Stream::new(
            device.clone(),
            queue,
            caps.uniform_align,
            memory.epoch(),
            binds,
            !opts.disable_submit_thread,
        );
        let downloads = DownloadPool::new(device.clone());
        Ok(Device {
            inner: Arc::new(DeviceInner {
                parts: ManuallyDrop::new(Parts {
                    device,
                    caps,
                    hardware,
                    measured_hardware: OnceLock::new(),
                    info,
                    memory,
                    stream: Mutex::new(stream),
                    downloads: Arc::new(Mutex::new(downloads)),
                    kernel_state: OnceLock::new(),
                    rng: AtomicU64::new(0x5eed),
                    errors,
                    lost,
                    trouble,
                    poison: opts.poison,
                    checked: opts.checked,
                    shader_checks: opts.shader_checks,
                    matmul_high: AtomicBool::new(opts.matmul_precision == MatmulPrecision::High),
                    _gl_instance: gl_instance,
                    reuse,
                }),
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

    /// What kernel planning knows of the hardware: the capabilities in use and the adapter's
    /// compute units, as the driver reports them or, once a first product has run, as
    /// `kernels::cores` measured them.
    pub fn hardware(&self) -> &DeviceProfile {
        self.inner
            .measured_hardware
            .get()
            .unwrap_or(&self.inner.hardware)
    }

    /// Takes `cores` as the compute-unit count where neither the driver nor `WGRAD_CORES`
    /// gave one (the kernels layer's measurement); a count already known stays.
    pub(crate) fn set_measured_cores(&self, cores: usize) {
        if self.inner.hardware.cores.is_none() {
            let _ = self.inner.measured_hardware.set(DeviceProfile {
                cores: Some(cores),
                ..self.inner.hardware.clone()
            });
        }
    }

    /// True when both handles name the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether index inputs are checked on the host ([`DeviceOptions::checked`]).
    pub fn is_checked(&self) -> bool {
        self.inner.checked
    }

    /// How f32 matrix products are computed from now on (see [`MatmulPrecision`]).
    pub fn set_matmul_precision(&self, p: MatmulPrecision) {
        self.inner
            .matmul_high
            .store(p == MatmulPrecision::High, Ordering::Relaxed);
    }

    /// How f32 matrix products are computed ([`Device::set_matmul_precision`]).
    pub fn matmul_precision(&self) -> MatmulPrecision {
        if self.inner.matmul_high.load(Ordering::Relaxed) {
            MatmulPrecision::High
        } else {
            MatmulPrecision::Highest
        }
    }

    /// The wgpu device, for the kernels layer's pipeline building.
    pub(crate) fn wgpu(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The kernels layer's per-device state (its pipeline cache), created on first use. `None`
    /// only if two different types were asked for, which is a wgrad bug.
    pub(crate) fn kernel_state<T: Default + Send + Sync + 'static>(&self) -> Option<&T> {
        self.inner
            .kernel_state
            .get_or_init(|| Box::new(T::default()))
            .downcast_ref::<T>()
    }

    /// Errors if the device was lost or wgpu reported an error since the last check.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.inner.trouble.load(Ordering::Acquire) {
            return Ok(());
        }
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

    /// Submits everything queued, then waits until the device has finished all submitted
    /// work, including what an earlier [`Device::flush`] (or a read-back) sent.
    pub fn sync(&self) -> Result<()> {
        lock(&self.inner.stream).flush()?;
        self.wait_all()?;
        self.check()
    }

    /// Sends everything recorded on its way to the device without waiting: the submit thread
    /// encodes and submits it while the caller goes on (see `DeviceOptions::disable_submit_thread`).
    pub fn flush(&self) -> Result<()> {
        lock(&self.inner.stream).submit()?;
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

    fn wait_all(&self) -> Result<()> {
        self.inner
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::DeviceLost(e.to_string()))
    }

    fn poll_now(&self) -> Result<()> {
        self.inner
            .device
            .poll(wgpu::PollType::Poll)
            .map(|_| ())
            .map_err(|e| Error::DeviceLost(e.to_string()))
    }

    // ----- memory -----

    /// A block of device memory of at least `bytes`.
    pub(crate) fn alloc(&self, bytes: u64) -> Result<Block> {
        self.check()?;
        self.inner.memory.alloc(bytes)
    }

    /// Counters of the host's side of launching kernels, since the device opened.
    pub fn dispatch_stats(&self) -> DispatchStats {
        let (dispatches, submits, submit_thread, encode_time, binds) = {
            let st = lock(&self.inner.stream);
            (
                st.dispatch_total,
                st.submits,
                st.threaded(),
                st.encode_time(),
                Arc::clone(&st.binds),
            )
        };
        let b = lock(&binds);
        DispatchStats {
            dispatches,
            submits,
            submit_thread,
            encode_time,
            bind_groups_created: b.created,
            bind_groups_reused: b.reused,
            bind_groups_kept: b.len() as u64,
        }
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
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let before = dev.memory_stats().allocated;
    /// let t = dev.zeros(&[1024], wgrad::DType::F32)?; // 4 KiB
    /// assert!(dev.memory_stats().allocated >= before + 4096);
    /// drop(t); // its block goes back to the pool at once
    /// assert_eq!(dev.memory_stats().allocated, before);
    /// assert!(dev.memory_stats().reserved > 0); // the page stays cached for reuse
    /// println!("{}", dev.memory_report());
    /// # Ok(())
    /// # }
    /// ```
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

    /// Keeps at most `bytes` of empty cached pages from now on (`None`: keep them all), and
    /// releases the excess at once. See [`DeviceOptions::release_threshold`].
    pub fn set_release_threshold(&self, bytes: Option<u64>) {
        self.inner
            .memory
            .set_release_threshold(bytes.unwrap_or(u64::MAX));
    }

    /// Sets every peak to the current value.
    pub fn reset_peak(&self) {
        self.inner.memory.reset_peak();
    }

    /// Changes the memory budget (`None`: no budget). Live tensors stay; later allocations
    /// obey the new limit.
    ///
    /// What it counts: the bytes the arena has *reserved* from the driver (its pages, whether
    /// a live tensor or the cache holds them), not only live tensors, since that is what the
    /// device must hold. An allocation that would take reserved bytes past the limit first
    /// releases cached pages, then waits for the device (blocks freed by queued work), then
    /// fails with [`Error::OutOfMemory`](crate::Error), which carries the numbers and loses
    /// nothing already allocated.
    ///
    /// Separate from the budget, one tensor can be no larger than the adapter's largest
    /// storage binding (`max_storage_buffer_binding_size`: 128 MiB on lavapipe, 2-4 GiB on
    /// discrete GPUs); a larger one is [`Error::LimitExceeded`](crate::Error), not
    /// `OutOfMemory`, whatever the budget.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// dev.set_memory_limit(Some(64 << 20));
    /// let err = dev.zeros(&[128 << 20], wgrad::DType::F32).unwrap_err();
    /// assert!(err.is_oom() || matches!(err, wgrad::Error::LimitExceeded { .. }));
    /// let small = dev.zeros(&[1024], wgrad::DType::F32)?; // still fine
    /// assert_eq!(small.numel(), 1024);
    /// dev.set_memory_limit(None);
    /// # Ok(())
    /// # }
    /// ```
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

    /// Opens a named scope without syncing (layers and the trainer use it): memory events
    /// and profiled kernels inside carry its name. Close it with [`Device::end_scope`].
    pub fn begin_scope(&self, name: &str) {
        self.inner.memory.push_scope(name);
        if let Some(p) = &mut lock(&self.inner.stream).prof {
            p.scopes.push(name.into());
        }
    }

    /// Closes the innermost scope and returns its peak of allocated bytes.
    pub fn end_scope(&self) -> u64 {
        if let Some(p) = &mut lock(&self.inner.stream).prof {
            p.scopes.pop();
        }
        self.inner.memory.pop_scope()
    }

    // ----- profiling -----

    /// Starts timing every dispatch: with GPU timestamps where the adapter has them (see
    /// [`Profile`]), host round trips otherwise. Work recorded before is submitted first.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let a = dev.randn(&[64, 64], wgrad::DType::F32)?;
    /// dev.start_profiling()?;
    /// dev.begin_scope("layer");
    /// let y = a.matmul(&a)?.relu()?;
    /// dev.end_scope();
    /// let profile = dev.stop_profiling()?;
    /// assert!(profile.events.len() >= 2); // the product and the ReLU
    /// assert!(profile.by_kernel().iter().any(|k| k.name.starts_with("Matmul")));
    /// assert!(profile.by_scope().iter().any(|s| s.name == "layer"));
    /// println!("{profile}");
    /// # drop(y);
    /// # Ok(())
    /// # }
    /// ```
    pub fn start_profiling(&self) -> Result<()> {
        let ts = self.inner.caps.timestamps;
        lock(&self.inner.stream).start_profiling(ts)
    }

    /// Stops the profiler and returns what it measured (empty if none was running).
    pub fn stop_profiling(&self) -> Result<Profile> {
        let (events, gpu_timestamps) = lock(&self.inner.stream).stop_profiling()?;
        self.check()?;
        Ok(Profile {
            events,
            gpu_timestamps,
        })
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

    /// The seed counter: what `manual_seed` set plus the random ops run since. Saving it
    /// with a training checkpoint and restoring it with [`Device::manual_seed`] resumes the
    /// same random stream.
    pub fn seed_state(&self) -> u64 {
        self.inner.rng.load(Ordering::Relaxed)
    }

    /// Restores the seed counter.
    pub(crate) fn set_seed_state(&self, s: u64) {
        self.inner.rng.store(s, Ordering::Relaxed);
    }

    // ----- commands -----

    /// Records a dispatch.
    pub(crate) fn dispatch(
        &self,
        pipe: &Pipeline,
        params: &[u8],
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
    #[cfg(feature = "testing")]
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

    /// Starts a read-back of `len` bytes of `block` from byte `offset`: records the copy,
    /// submits, and asks for the staging buffer to be mapped. The returned future resolves
    /// once the data is here. `offset` must be a multiple of 4.
    pub(crate) fn read_block<T: bytemuck::Pod>(
        &self,
        block: &Block,
        offset: u64,
        len: u64,
    ) -> Result<Readback<T>> {
        self.check()?;
        let padded = len.div_ceil(4) * 4;
        if padded == 0 {
            return Ok(Readback::empty(self));
        }
        let state = MapState::new();
        let staging = lock(&self.inner.downloads).get(padded);
        {
            // Handed to the submit side, which maps the buffer once the copy is submitted.
            let mut st = lock(&self.inner.stream);
            st.copy(block.buffer(), block.offset() + offset, &staging, 0, padded);
            st.read_after(MapAfter {
                buffer: staging.clone(),
                size: padded,
                state: Arc::clone(&state),
            });
            st.submit()?;
        }
        Ok(Readback {
            dev: self.clone(),
            staging: Some(staging),
            len,
            padded,
            state,
            poller: false,
            _t: PhantomData,
        })
    }
}

/// What [`Device::dispatch_stats`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Kernel launches recorded.
    pub dispatches: u64,
    /// Batches submitted to the queue.
    pub submits: u64,
    /// Whether batches are encoded and submitted on the device's submit thread (see
    /// `DeviceOptions::disable_submit_thread`).
    pub submit_thread: bool,
    /// Time spent encoding and submitting batches (wgpu's validation and the driver's
    /// recording), on the submit thread or the recording one.
    pub encode_time: Duration,
    /// Bind groups created (a launch on memory no earlier launch of its layout bound).
    pub bind_groups_created: u64,
    /// Launches that reused a kept bind group.
    pub bind_groups_reused: u64,
    /// Bind groups kept now.
    pub bind_groups_kept: u64,
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

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Device({}, {})",
            self.inner.info.name, self.inner.info.backend
        )
    }
}
