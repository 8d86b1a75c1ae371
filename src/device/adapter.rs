//! Choosing an adapter: the instances, the ranking, and the lock that keeps driver calls that
//! create or destroy devices from running at the same time.

use super::options::AdapterChoice;
use crate::error::{Error, Result};
use std::sync::{Mutex, MutexGuard};

/// One adapter as listed by [`Device::all`](crate::Device::all).
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// Position in the ranking (what `AdapterChoice::Index` and `WGRAD_ADAPTER=#N` take).
    pub index: usize,
    /// Name (what `WGRAD_ADAPTER` matches).
    pub name: String,
    /// Backend.
    pub backend: String,
    /// Device type.
    pub device_type: String,
    /// Driver.
    pub driver: String,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Devices are opened *and torn down* one at a time: NVIDIA's Vulkan driver stalled when
/// threads created and destroyed devices at once (seen with 8-16 test threads, threads
/// stuck in vkCreateDevice, vkDestroyDevice and vkDestroyInstance).
pub(crate) static DEVICE_LIFECYCLE: Mutex<()> = Mutex::new(());

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
/// dropped (an instance per device made NVIDIA's driver stall in vkDestroyInstance).
fn primary_instance() -> &'static wgpu::Instance {
    static INSTANCE: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| instance_for(wgpu::Backends::PRIMARY))
}

/// Every adapter, best first, with the instance that owns them. GL adapters come from a
/// fresh instance, and only when no Vulkan, Metal or DX12 adapter exists (or WGPU_BACKEND
/// asks for GL): wgpu's GL backend gives all devices of one instance a single EGL context,
/// which cannot be current on two threads, so each GL device gets an instance of its own.
/// The caller holds [`DEVICE_LIFECYCLE`].
fn ranked() -> (Vec<wgpu::Adapter>, Option<wgpu::Instance>) {
    let mut v = pollster::block_on(primary_instance().enumerate_adapters(wgpu::Backends::PRIMARY));
    let mut gl = None;
    if v.is_empty() {
        let inst = instance_for(wgpu::Backends::SECONDARY);
        v = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::SECONDARY));
        gl = Some(inst);
    }
    v.sort_by_key(|a| {
        let i = a.get_info();
        (type_rank(i.device_type), backend_rank(i.backend))
    });
    (v, gl)
}

fn summary(index: usize, a: &wgpu::Adapter) -> AdapterSummary {
    let i = a.get_info();
    AdapterSummary {
        index,
        name: i.name,
        backend: format!("{:?}", i.backend),
        device_type: format!("{:?}", i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
    }
}

/// Every adapter wgpu can see, best first.
pub(crate) fn list() -> Vec<AdapterSummary> {
    let _g = lock(&DEVICE_LIFECYCLE);
    let (v, _gl) = ranked();
    v.iter().enumerate().map(|(i, a)| summary(i, a)).collect()
}

/// The adapter `choice` names, its index in [`list`]'s order, and the GL instance it came from
/// (if any). The caller holds [`DEVICE_LIFECYCLE`].
pub(crate) fn choose(
    choice: &AdapterChoice,
) -> Result<(usize, wgpu::Adapter, Option<wgpu::Instance>)> {
    let (adapters, gl) = ranked();
    if adapters.is_empty() {
        return Err(Error::NoAdapter(
            "wgpu found no adapter (on Linux without a GPU, install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into(),
        ));
    }
    let names: Vec<String> = adapters
        .iter()
        .enumerate()
        .map(|(i, a)| format!("#{i} {}", a.get_info().name))
        .collect();
    let mut all = adapters.into_iter().enumerate();
    let found = match choice {
        AdapterChoice::Best => all.next(),
        AdapterChoice::Index(n) => all.nth(*n),
        AdapterChoice::Name(want) => {
            let w = want.to_lowercase();
            all.find(|(_, a)| a.get_info().name.to_lowercase().contains(&w))
        }
    };
    found.map(|(i, a)| (i, a, gl)).ok_or_else(|| {
        Error::NoAdapter(format!(
            "no adapter matches {choice:?}; adapters: {}",
            names.join(", ")
        ))
    })
}

/// Device-local memory from the Vulkan driver's heaps; `None` on other backends.
pub(crate) fn device_memory(adapter: &wgpu::Adapter) -> Option<u64> {
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
