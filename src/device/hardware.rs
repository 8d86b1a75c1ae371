//! What a device is, as the rules that plan its kernels see it: a [`DeviceProfile`], built
//! once from the adapter when the device is created.
//!
//! Planning reads nothing else about the hardware, so every plan is a pure function of the
//! problem and the profile, unit-tested on profiles of GPUs this machine does not have.

use crate::dtype::DType;

/// The facts kernel planning depends on.
///
/// ```
/// let dev = wgrad::Device::new()?;
/// let p = dev.hardware();
/// // lavapipe: a CPU adapter; an NVIDIA GPU through Vulkan: its SM count.
/// let f16_tensor_cores = p.tensor_cores(wgrad::DType::F16);
/// println!("cpu {} cores {:?} tensor cores {f16_tensor_cores}", p.cpu, p.cores);
/// # Ok::<(), wgrad::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProfile {
    /// The adapter runs on the CPU (lavapipe, llvmpipe, WARP).
    pub cpu: bool,
    /// Compute units (NVIDIA's SMs, AMD's compute units, Arm's shader cores), where the
    /// driver reports them (Vulkan: `VK_NV_shader_sm_builtins`,
    /// `VK_AMD_shader_core_properties`) or `WGRAD_CORES` gives them; elsewhere measured
    /// once on a GPU's first product ([`kernels::cores`](crate::kernels::cores)). `None`
    /// until then, on CPU adapters and where no count is found: the rules that count waves
    /// of workgroups then stand aside.
    pub cores: Option<usize>,
    /// Smallest and largest subgroup sizes where subgroup operations are on.
    pub subgroups: Option<(u32, u32)>,
    /// Native f16 arithmetic in shaders.
    pub f16: bool,
    /// 16 x 16 x 16 cooperative matrices of f16 with f32 accumulation.
    pub coop_f16_16: bool,
    /// 16 x 16 x 16 cooperative matrices of bf16 with f32 accumulation, in wgrad's own
    /// SPIR-V (Vulkan's `VK_KHR_shader_bfloat16`, which the device was opened with).
    pub coop_bf16_16: bool,
    /// wgrad's own SPIR-V reaches the driver (Vulkan).
    pub spirv: bool,
    /// Workgroup memory a workgroup may use, bytes.
    pub workgroup_storage: u32,
}

impl DeviceProfile {
    /// Whether products of `dtype` run on tensor cores: 16 x 16 x 16 cooperative matrices
    /// over subgroups of exactly 32, the layout wgrad's tensor-core kernels are written for;
    /// f16 with native f16 arithmetic, bf16 in wgrad's own SPIR-V (the only kernels that
    /// have bf16 matrices: WGSL has no bf16 type) with native 16-bit storage, which its
    /// outputs are stored as (`kernels::compose::halves_hold_bf16`).
    pub fn tensor_cores(&self, dtype: DType) -> bool {
        let subgroups_32 = self.subgroups == Some((32, 32));
        match dtype {
            DType::F16 => self.coop_f16_16 && self.f16 && subgroups_32,
            DType::BF16 => self.coop_bf16_16 && self.f16 && self.spirv && subgroups_32,
            _ => false,
        }
    }

    /// Workgroups of a kernel that run at once, `per_core` a compute unit (the kernel's
    /// registers and memory decide how many fit), where the core count is known.
    pub fn slots(&self, per_core: usize) -> Option<usize> {
        self.cores.map(|c| c * per_core)
    }
}

/// The compute-unit count the Vulkan driver reports for `adapter`, if it does.
pub(crate) fn compute_units(adapter: &wgpu::Adapter) -> Option<usize> {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    {
        use ash::vk;
        // SAFETY: properties of the physical device are read through the instance that
        // enumerated it; nothing is created or destroyed, and a property struct is chained
        // only where the device lists its extension.
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
        let (phd, instance) = (
            hal.raw_physical_device(),
            hal.shared_instance().raw_instance(),
        );
        let exts = unsafe { instance.enumerate_device_extension_properties(phd) }.ok()?;
        let has =
            |name: &std::ffi::CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        if has(ash::nv::shader_sm_builtins::NAME) {
            let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
            let mut p = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
            unsafe { instance.get_physical_device_properties2(phd, &mut p) };
            return (sm.shader_sm_count > 0).then_some(sm.shader_sm_count as usize);
        }
        if has(ash::amd::shader_core_properties::NAME) {
            let mut core = vk::PhysicalDeviceShaderCorePropertiesAMD::default();
            let mut p = vk::PhysicalDeviceProperties2::default().push_next(&mut core);
            unsafe { instance.get_physical_device_properties2(phd, &mut p) };
            let n = core.shader_engine_count
                * core.shader_arrays_per_engine_count
                * core.compute_units_per_shader_array;
            return (n > 0).then_some(n as usize);
        }
        None
    }
    #[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
    {
        let _ = adapter;
        None
    }
}

/// `VK_KHR_shader_bfloat16`, which ash 0.38 predates: its name, its feature struct's type,
/// and bf16's cooperative-matrix component type.
#[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
mod bf16_ext {
    pub const NAME: &std::ffi::CStr = c"VK_KHR_shader_bfloat16";
    pub const FEATURES: i32 = 1_000_141_000;
    pub const COMPONENT: i32 = 1_000_141_000;

    /// `VkPhysicalDeviceShaderBfloat16FeaturesKHR`.
    #[repr(C)]
    pub struct Features {
        pub s_type: ash::vk::StructureType,
        pub p_next: *mut std::ffi::c_void,
        pub bf16_type: ash::vk::Bool32,
        pub bf16_dot_product: ash::vk::Bool32,
        pub bf16_cooperative_matrix: ash::vk::Bool32,
    }

    impl Features {
        pub fn new(on: bool) -> Features {
            Features {
                s_type: ash::vk::StructureType::from_raw(FEATURES),
                p_next: std::ptr::null_mut(),
                bf16_type: on as u32,
                bf16_dot_product: 0,
                bf16_cooperative_matrix: on as u32,
            }
        }
    }
}

/// Whether the Vulkan driver offers 16 x 16 x 16 bf16 cooperative matrices with f32
/// accumulation over a subgroup: `VK_KHR_shader_bfloat16` with its type and
/// cooperative-matrix features, and that shape among `VK_KHR_cooperative_matrix`'s (wgpu
/// lists only the component types it knows, so the shapes are asked here).
pub(crate) fn bf16_coop_16(adapter: &wgpu::Adapter) -> bool {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    {
        use ash::vk;
        // SAFETY: properties and features of the physical device are read through the
        // instance that enumerated it; nothing is created or destroyed, and a struct is
        // chained only where the device lists its extension.
        let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
            return false;
        };
        let shared = hal.shared_instance();
        let (phd, instance) = (hal.raw_physical_device(), shared.raw_instance());
        let Ok(exts) = (unsafe { instance.enumerate_device_extension_properties(phd) }) else {
            return false;
        };
        let has =
            |name: &std::ffi::CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        if !has(bf16_ext::NAME) || !has(ash::khr::cooperative_matrix::NAME) {
            return false;
        }
        let mut f = bf16_ext::Features::new(false);
        let mut f2 = vk::PhysicalDeviceFeatures2 {
            p_next: (&mut f as *mut bf16_ext::Features).cast(),
            ..Default::default()
        };
        unsafe { instance.get_physical_device_features2(phd, &mut f2) };
        if f.bf16_type == 0 || f.bf16_cooperative_matrix == 0 {
            return false;
        }
        let coop = ash::khr::cooperative_matrix::Instance::new(shared.entry(), instance);
        let Ok(shapes) = (unsafe { coop.get_physical_device_cooperative_matrix_properties(phd) })
        else {
            return false;
        };
        let bf16 = vk::ComponentTypeKHR::from_raw(bf16_ext::COMPONENT);
        let f32 = vk::ComponentTypeKHR::FLOAT32;
        shapes.iter().any(|s| {
            (s.m_size, s.n_size, s.k_size) == (16, 16, 16)
                && (s.a_type, s.b_type) == (bf16, bf16)
                && (s.c_type, s.result_type) == (f32, f32)
                && s.saturating_accumulation == 0
                && s.scope == vk::ScopeKHR::SUBGROUP
        })
    }
    #[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
    {
        let _ = adapter;
        false
    }
}

/// Opens `adapter` (Vulkan) as `desc` asks, with `VK_KHR_shader_bfloat16`'s type and
/// cooperative-matrix features on as well: wgpu knows no bf16, so the device is opened through
/// wgpu-hal, which takes extra extensions and feature structs, and handed to wgpu as its own.
/// Only where [`bf16_coop_16`] holds.
pub(crate) fn open_with_bf16(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> Result<(wgpu::Device, wgpu::Queue), String> {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    {
        let mut f = bf16_ext::Features::new(true);
        let f_ptr: *mut bf16_ext::Features = &mut f;
        let open = {
            // SAFETY: the adapter is Vulkan's (the caller checked `bf16_coop_16`); the hal
            // adapter is used only within this block.
            let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }
                .ok_or("not a Vulkan adapter")?;
            // The callback adds the extension and puts the feature struct at the head of the
            // device's feature chain; wgpu-hal chains its own after it. `f` outlives the call.
            let add = Box::new(
                move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs<'_, '_, '_>| {
                    args.extensions.push(bf16_ext::NAME);
                    // SAFETY: `f_ptr` points at `f`, alive until `open_with_callback` returns.
                    unsafe { (*f_ptr).p_next = args.create_info.p_next.cast_mut() };
                    args.create_info.p_next = f_ptr.cast_const().cast();
                },
            );
            // SAFETY: the features and limits are the adapter's own (wgpu's request_device
            // would pass the same); the extension and features added are ones the driver lists.
            unsafe {
                hal.open_with_callback(
                    desc.required_features,
                    &desc.required_limits,
                    &desc.memory_hints,
                    Some(add),
                )
            }
            .map_err(|e| format!("opening the Vulkan device with bf16: {e}"))?
        };
        // SAFETY: `open` was created from this adapter with exactly `desc`'s features.
        unsafe { adapter.create_device_from_hal(open, desc) }.map_err(|e| e.to_string())
    }
    #[cfg(not(any(target_os = "linux", target_os = "windows", target_os = "android")))]
    {
        let _ = (adapter, desc);
        Err("bf16 cooperative matrices are opened only through Vulkan".into())
    }
}

/// What `WGRAD_CORES` says of the compute-unit count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoresFromEnv {
    /// Unset (or not a count): the driver's report, else the kernels layer's measurement.
    Unset,
    /// `WGRAD_CORES=N`: plan as if the device had N (where the driver does not report them,
    /// or to try another count).
    Given(usize),
    /// `WGRAD_CORES=measure`: ignore the driver's report and measure (`kernels::cores`), to
    /// check the measurement against the report.
    Measure,
    /// `WGRAD_CORES=none`: no count, neither reported nor measured (planning as on a device
    /// that gives none, to see what the count is worth).
    Unknown,
}

/// `WGRAD_CORES`, read when a device is created (and by `kernels::cores` once a device).
pub(crate) fn cores_from_env() -> CoresFromEnv {
    let Ok(v) = std::env::var("WGRAD_CORES") else {
        return CoresFromEnv::Unset;
    };
    match v.trim() {
        "measure" => CoresFromEnv::Measure,
        "none" => CoresFromEnv::Unknown,
        n => match n.parse() {
            Ok(n) if n > 0 => CoresFromEnv::Given(n),
            _ => CoresFromEnv::Unset,
        },
    }
}
