//! How fast a GPU's cores pull 16-byte runs out of memory through wgpu, by the bytes each
//! core has in flight: the ceiling that the staged tensor-core products
//! (`shaders/matmul_wide.wgsl`) load their tiles against. They load through registers
//! (Vulkan offers no asynchronous copy into workgroup memory), 36 KiB a core a step at 256 x
//! 128, one workgroup a core; BENCHMARKS.md compares the two.
//!
//!     cargo run --release --example load_rate -- [--region-mib 32] [--cores 132] [--ms 200]
//!
//! It launches `--cores` workgroups of 256 invocations (the default, 132, for a GPU of 132
//! cores; that the GPU deals one to each core is assumed, not checked), then two and four
//! times as many.
//! Each loops: every invocation issues NL independent 16-byte loads (NL x 4 KiB a workgroup,
//! contiguous across its invocations) from a region of `--region-mib` (a power of two; 32
//! MiB stays in a 50 MiB L2, 128 does not), and only then folds them into a sum. Bytes in
//! flight a core = workgroups a core x 256 x NL x 16. One workgroup's sum is checked against
//! the CPU's, so the loads cannot be optimised away.
use clap::Parser;
use std::time::Instant;
use wgpu::util::DeviceExt;

#[derive(Parser)]
#[command(about = "L2 / memory load rate by bytes in flight a core (16-byte loads)")]
struct Args {
    /// Size of the region read, MiB (a power of two).
    #[arg(long, default_value_t = 32)]
    region_mib: u64,
    /// The GPU's cores (SMs, compute units): workgroups launched for one a core.
    #[arg(long, default_value_t = 132)]
    cores: u32,
    /// About how long each configuration is timed, ms.
    #[arg(long, default_value_t = 200.0)]
    ms: f64,
}

const WG: u32 = 256;

fn shader(nl: u32) -> String {
    let loads: String = (0..nl)
        .map(|i| format!("    let v{i} = src[(at + {i}u * {WG}u) & mask];\n"))
        .collect();
    let folds: String = (0..nl).map(|i| format!(" ^ v{i}")).collect();
    format!(
        "@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> p: vec4<u32>; // region mask (vec4s), steps, stride
var<workgroup> hold: array<vec4<u32>, {WG}>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let mask = p.x;
  var at = g.x * p.z + lid;
  var acc = vec4<u32>(0u);
  for (var s = 0u; s < p.y; s++) {{
{loads}    acc = acc{folds};
    at = at + {nl}u * {WG}u;
  }}
  hold[lid] = acc;
  workgroupBarrier();
  dst[g.x * {WG}u + lid] = hold[(lid + 1u) % {WG}u];
}}
"
    )
}

fn main() {
    let a = Args::parse();
    if !a.region_mib.is_power_of_two() || a.cores == 0 {
        eprintln!("--region-mib must be a power of two and --cores at least 1");
        std::process::exit(2);
    }
    let (region_mib, target_ms, cores) = (a.region_mib, a.ms, a.cores);
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    let instance = wgpu::Instance::new(desc);
    let Ok(adapter) = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    })) else {
        eprintln!("no adapter");
        std::process::exit(1);
    };
    let info = adapter.get_info();
    let limits = adapter.limits();
    let (dev, queue) = match pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: limits.clone(),
        ..Default::default()
    })) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("device: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "adapter: {} ({:?}, driver {})",
        info.name, info.backend, info.driver_info
    );
    let n = (region_mib << 20) / 16;
    let data: Vec<u32> = (0..n * 4)
        .map(|i| (i as u32).wrapping_mul(2654435761))
        .collect();
    let src = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&data),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let dst = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4 * cores as u64 * WG as u64 * 16,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    println!("region {region_mib} MiB, {cores} cores, workgroups of {WG}");
    println!(
        "{:>10} {:>8} {:>18} {:>8}",
        "loads/inv", "wg/core", "KiB in flight/core", "TB/s"
    );
    let mut wrong = 0;
    for &(nl, per) in &[
        (4u32, 1u32),
        (9, 1),
        (12, 1),
        (18, 1),
        (27, 1),
        (9, 2),
        (18, 2),
        (9, 4),
    ] {
        let groups = cores * per;
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(shader(nl).into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        // Steps per workgroup (each nl x 4 KiB): about 3.5 GB in all; the workgroups start
        // spread over the region.
        let steps = (6400 / nl / per).max(1);
        let stride = (n as u32 / groups) & !(WG - 1);
        let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(&[n as u32 - 1, steps, stride, 0]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: dst.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: params.as_entire_binding(),
                },
            ],
        });
        let run = |reps: u32| -> f64 {
            let t = Instant::now();
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut p = enc.begin_compute_pass(&Default::default());
                p.set_pipeline(&pipe);
                p.set_bind_group(0, &bg, &[]);
                for _ in 0..reps {
                    p.dispatch_workgroups(groups, 1, 1);
                }
            }
            queue.submit([enc.finish()]);
            let _ = dev.poll(wgpu::PollType::wait_indefinitely());
            t.elapsed().as_secs_f64() * 1e3
        };
        run(1);
        let one = run(1).max(1e-3);
        let reps = ((target_ms / 5.0 / one) as u32).clamp(1, 10_000);
        run(reps);
        let mut best = f64::MAX;
        for _ in 0..5 {
            best = best.min(run(reps) / reps as f64);
        }
        // Check one workgroup's result against the CPU.
        let rb = dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: WG as u64 * 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let g = groups - 1;
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&dst, g as u64 * WG as u64 * 16, &rb, 0, WG as u64 * 16);
        queue.submit([enc.finish()]);
        rb.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        let _ = dev.poll(wgpu::PollType::wait_indefinitely());
        let got: Vec<u32> = match rb.slice(..).get_mapped_range() {
            Ok(v) => bytemuck::cast_slice(&v).to_vec(),
            Err(e) => {
                eprintln!("read back: {e}");
                std::process::exit(1);
            }
        };
        let mask = n - 1;
        // The output's lane 0 holds lane 1's sum (`hold[(lid + 1) % WG]`).
        let lid = 0u64;
        let mut want = [0u32; 4];
        let mut at = g as u64 * stride as u64 + (lid + 1) % WG as u64;
        for _ in 0..steps {
            for i in 0..nl as u64 {
                let v = ((at + i * WG as u64) & mask) as usize;
                for c in 0..4 {
                    want[c] ^= data[v * 4 + c];
                }
            }
            at += nl as u64 * WG as u64;
        }
        let ok = got[0..4] == want;
        wrong += usize::from(!ok);
        let bytes = groups as f64 * WG as f64 * steps as f64 * nl as f64 * 16.0;
        println!(
            "{:>10} {:>8} {:>18} {:>8.2}{}",
            nl,
            per,
            per * WG * nl * 16 / 1024,
            bytes / (best * 1e-3) / 1e12,
            if ok { "" } else { "  WRONG SUM" }
        );
    }
    if wrong > 0 {
        eprintln!("{wrong} configurations summed wrong");
        std::process::exit(1);
    }
}
