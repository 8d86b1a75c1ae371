//! A kernel profiler: the time of every dispatch, by kernel and by named scope, and a Chrome
//! trace of it with the memory events on the same timeline.
//!
//! With TIMESTAMP_QUERY (most Vulkan, Metal and DX12 adapters, lavapipe too) each dispatch is
//! recorded in a compute pass of its own with a timestamp at its start and end, and the times
//! are GPU times. Without it, each dispatch is submitted and waited for on its own and the
//! times are host times of that round trip (larger: they include the submit); the profile
//! says which it holds. Either way profiling changes how work is batched, so a profiled step
//! runs slower than an unprofiled one: compare kernels within a profile, and step times
//! without one.

use std::collections::BTreeMap;
use std::fmt::{self, Write};
use std::sync::Arc;
use std::time::Duration;

/// One dispatch.
#[derive(Clone, Debug)]
pub struct KernelEvent {
    /// Kernel family and entry point, e.g. `Matmul/main`.
    pub kernel: Arc<str>,
    /// The innermost open scope (`Device::begin_scope`), if any.
    pub scope: Option<Arc<str>>,
    /// Start, microseconds since the device was created (the memory trace's clock; for GPU
    /// times, anchored at the submit of the first profiled batch).
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// Totals of one kernel or scope.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Kernel or scope name.
    pub name: String,
    /// Dispatches.
    pub calls: usize,
    /// Total time.
    pub total: Duration,
}

/// What [`Device::stop_profiling`](crate::Device::stop_profiling) returns.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Every dispatch, in submission order.
    pub events: Vec<KernelEvent>,
    /// True when the times are GPU timestamps, false for host round-trip times.
    pub gpu_timestamps: bool,
}

impl Profile {
    /// Sum of every dispatch's time.
    pub fn total(&self) -> Duration {
        Duration::from_secs_f64(self.events.iter().map(|e| e.dur_us).sum::<f64>() * 1e-6)
    }

    fn summarise(&self, key: impl Fn(&KernelEvent) -> String) -> Vec<Summary> {
        let mut m: BTreeMap<String, (usize, f64)> = BTreeMap::new();
        for e in &self.events {
            let s = m.entry(key(e)).or_default();
            s.0 += 1;
            s.1 += e.dur_us;
        }
        let mut v: Vec<Summary> = m
            .into_iter()
            .map(|(name, (calls, us))| Summary {
                name,
                calls,
                total: Duration::from_secs_f64(us * 1e-6),
            })
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.total));
        v
    }

    /// Time per kernel, largest first.
    pub fn by_kernel(&self) -> Vec<Summary> {
        self.summarise(|e| e.kernel.to_string())
    }

    /// Time per scope (dispatches outside any scope under "-"), largest first.
    pub fn by_scope(&self) -> Vec<Summary> {
        self.summarise(|e| e.scope.as_deref().unwrap_or("-").to_string())
    }

    /// The profile as Chrome trace-event JSON (opens in Perfetto or chrome://tracing): one
    /// complete event per dispatch on the "kernels" track, and, given the memory trace's
    /// events (`Device::memory_events`), counters of allocated and reserved bytes and the
    /// scopes on the same clock.
    pub fn chrome_trace(&self, memory: &[crate::memory::Event]) -> String {
        use crate::memory::EventKind;
        let mut s = String::from("{\"traceEvents\":[");
        let mut first = true;
        let mut sep = |s: &mut String| {
            if !first {
                s.push(',');
            }
            first = false;
        };
        let clock = if self.gpu_timestamps { "gpu" } else { "host" };
        for e in &self.events {
            sep(&mut s);
            let _ = write!(
                s,
                "{{\"name\":{},\"cat\":\"kernel\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1,\"args\":{{\"scope\":{},\"clock\":\"{clock}\"}}}}",
                json_str(&e.kernel),
                e.start_us,
                e.dur_us,
                json_str(e.scope.as_deref().unwrap_or("")),
            );
        }
        for m in memory {
            sep(&mut s);
            match m.kind {
                EventKind::ScopeBegin | EventKind::ScopeEnd => {
                    let ph = if m.kind == EventKind::ScopeBegin {
                        "B"
                    } else {
                        "E"
                    };
                    let _ = write!(
                        s,
                        "{{\"name\":{},\"cat\":\"scope\",\"ph\":\"{ph}\",\"ts\":{},\"pid\":1,\"tid\":2}}",
                        json_str(m.scope.as_deref().unwrap_or("")),
                        m.t_us
                    );
                }
                _ => {
                    let _ = write!(
                        s,
                        "{{\"name\":\"memory\",\"ph\":\"C\",\"ts\":{},\"pid\":1,\"args\":{{\"allocated\":{},\"reserved\":{}}}}}",
                        m.t_us, m.allocated, m.reserved
                    );
                }
            }
        }
        s.push_str(
            "],\"displayTimeUnit\":\"ms\",\"metadata\":{\"tracks\":\"tid 1: kernels, tid 2: scopes\"}}",
        );
        s
    }
}

fn json_str(v: &str) -> String {
    let mut o = String::with_capacity(v.len() + 2);
    crate::memory::trace::json_string(&mut o, v);
    o
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().as_secs_f64().max(1e-12);
        writeln!(
            f,
            "{} dispatches, {:.3} ms of {} time",
            self.events.len(),
            total * 1e3,
            if self.gpu_timestamps {
                "GPU"
            } else {
                "host round-trip"
            }
        )?;
        writeln!(
            f,
            "{:<34} {:>7} {:>11} {:>9} {:>6}",
            "kernel", "calls", "total ms", "mean us", "share"
        )?;
        for s in self.by_kernel() {
            let t = s.total.as_secs_f64();
            writeln!(
                f,
                "{:<34} {:>7} {:>11.3} {:>9.1} {:>5.1}%",
                s.name,
                s.calls,
                t * 1e3,
                t * 1e6 / s.calls as f64,
                100.0 * t / total
            )?;
        }
        Ok(())
    }
}

/// GPU timestamp queries for one batch of dispatches.
pub(crate) struct GpuTimer {
    pub(crate) set: wgpu::QuerySet,
    pub(crate) resolve: wgpu::Buffer,
    pub(crate) read: wgpu::Buffer,
    /// Nanoseconds per tick.
    pub(crate) period: f64,
    /// The first tick seen and the host time (us) it is anchored at.
    pub(crate) anchor: Option<(u64, f64)>,
}

impl GpuTimer {
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, slots: u32) -> GpuTimer {
        let bytes = slots as u64 * wgpu::QUERY_SIZE as u64;
        GpuTimer {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgrad profiler"),
                ty: wgpu::QueryType::Timestamp,
                count: slots,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgrad profiler resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            read: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgrad profiler read"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period: queue.get_timestamp_period() as f64,
            anchor: None,
        }
    }
}

/// The profiler's state inside the stream.
pub(crate) struct Profiling {
    pub(crate) gpu: Option<GpuTimer>,
    /// (kernel, scope) of each dispatch recorded in the current batch (GPU mode).
    pub(crate) pending: Vec<(Arc<str>, Option<Arc<str>>)>,
    pub(crate) events: Vec<KernelEvent>,
    pub(crate) scopes: Vec<Arc<str>>,
}
