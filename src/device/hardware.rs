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
    /// `VK_AMD_shader_core_properties`) or `WGRAD_CORES` gives them; `None` elsewhere, and
    /// the rules that count waves of workgroups then stand aside.
    pub cores: Option<usize>,
    /// Smallest and largest subgroup sizes where subgroup operations are on.
    pub subgroups: Option<(u32, u32)>,
    /// Native f16 arithmetic in shaders.
    pub f16: bool,
    /// 16 x 16 x 16 cooperative matrices of f16 with f32 accumulation.
    pub coop_f16_16: bool,
    /// wgrad's own SPIR-V reaches the driver (Vulkan).
    pub spirv: bool,
    /// Workgroup memory a workgroup may use, bytes.
    pub workgroup_storage: u32,
}

impl DeviceProfile {
    /// Whether products of `dtype` run on tensor cores: f16 on 16 x 16 x 16 cooperative
    /// matrices over subgroups of exactly 32, the layout wgrad's tensor-core kernels are
    /// written for.
    pub fn tensor_cores(&self, dtype: DType) -> bool {
        dtype == DType::F16 && self.coop_f16_16 && self.f16 && self.subgroups == Some((32, 32))
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

/// `WGRAD_CORES=N`: the compute-unit count where the driver does not report it (or to plan
/// as if the device had N).
pub(crate) fn cores_from_env() -> Option<usize> {
    std::env::var("WGRAD_CORES")
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&n| n > 0)
}
