//! The command stream: every GPU command wgrad issues, in order, submitted in batches.
//!
//! Ops do not submit. They record a [`Cmd`] here; the stream hands the batch to the submit
//! thread (`submit.rs`), which encodes and submits it, when it holds [`MAX_BATCH`] dispatches,
//! when staging memory in the batch grows large, or when the host needs a result (`sync`, a
//! read-back). One submit per op would cost tens of microseconds each on a discrete GPU and
//! stall the CPU on driver calls.
//!
//! Kernel parameters (shapes, strides, scalars) go into one uniform buffer: each dispatch gets
//! an aligned slot; the host fills a byte vector while recording and, at submit, the vector is
//! copied into the uniform buffer by the first command of the batch. A batch that runs after an
//! earlier one reusing the same slots is ordered after it on the queue, so no slot is
//! overwritten while a kernel still reads it. The slot is bound with a dynamic offset, so a
//! dispatch's bind group names only memory and is kept for the next launch on the same memory
//! (`bind_cache.rs`).

use super::adapter::lock;
use super::bind_cache::{BindCache, MAX_STORAGE, bound_size};
use super::profile::{GpuTimer, KernelEvent, Profiling};
use super::readback::MapAfter;
use super::submit::{Batch, Cmd, Submitter, Timestamps};
use crate::error::{Error, Result};
use crate::memory::staging::{CHUNK_SIZE, UploadBelt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Dispatches per submit.
pub(crate) const MAX_BATCH: usize = 256;
/// Upload bytes per submit before the stream submits early, so staging chunks can recycle.
const MAX_BATCH_STAGING: u64 = 64 << 20;

/// The binding of a kernel's parameter block (a uniform).
pub(crate) const PARAMS_BINDING: u32 = 0;

/// The binding of a kernel's `i`-th storage argument. With [`PARAMS_BINDING`] and
/// [`layout_entries`] this is the one statement of the binding layout: the composer declares
/// bindings with it, pipelines are built with it, bind groups follow it.
pub(crate) fn storage_binding(i: usize) -> u32 {
    i as u32 + 1
}

/// The bind-group layout of a kernel with `n_storage` storage arguments: the parameter
/// uniform, then the storage buffers in order, all read-write (tensors share page buffers, and
/// wgpu forbids one buffer bound read-only and read-write in the same dispatch).
pub(crate) fn layout_entries(n_storage: usize) -> Vec<wgpu::BindGroupLayoutEntry> {
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: PARAMS_BINDING,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            // The block's place in the parameter buffer is given at dispatch, so one bind
            // group serves every launch on the same memory (see bind_cache.rs).
            has_dynamic_offset: true,
            min_binding_size: None,
        },
        count: None,
    }];
    for i in 0..n_storage {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: storage_binding(i),
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    entries
}

/// A compiled kernel and the layout its bind groups use.
pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// Unique in the process: what the bind-group cache knows `layout` by.
    pub layout_id: u64,
    pub label: Arc<str>,
}

/// A byte range of a buffer bound as storage.
#[derive(Clone, Copy)]
pub(crate) struct Slice<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// The memory pool's page that `buffer` is (ids are never reused on a device).
    pub page: u64,
    pub offset: u64,
    pub size: u64,
}

pub(crate) struct Stream {
    device: wgpu::Device,
    submitter: Submitter,
    cmds: Vec<Cmd>,
    /// Read-backs to map once the batch recorded so far is submitted.
    maps: Vec<MapAfter>,
    dispatches: usize,
    params: Vec<u8>,
    params_buf: wgpu::Buffer,
    param_align: usize,
    pub(crate) belt: UploadBelt,
    /// Submits so far.
    pub(crate) submits: u64,
    /// Dispatches so far.
    pub(crate) dispatch_total: u64,
    /// The profiler, while one runs.
    pub(crate) prof: Option<Profiling>,
    /// The clock profiles and the memory trace share.
    epoch: Instant,
    /// Bind groups for reuse, shared with the memory pool, which drops the entries of pages
    /// it releases.
    pub(crate) binds: Arc<Mutex<BindCache>>,
}

impl Stream {
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        param_align: u64,
        epoch: Instant,
        binds: Arc<Mutex<BindCache>>,
        threaded: bool,
    ) -> Self {
        let param_align = param_align.max(16) as usize;
        let cap = (MAX_BATCH * param_align.max(256)) as u64;
        let params_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad params"),
            size: cap,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Stream {
            belt: UploadBelt::new(device.clone()),
            submitter: Submitter::new(device.clone(), queue, threaded),
            device,
            cmds: Vec::with_capacity(MAX_BATCH),
            maps: Vec::new(),
            dispatches: 0,
            params: Vec::new(),
            params_buf,
            param_align,
            submits: 0,
            dispatch_total: 0,
            prof: None,
            epoch,
            binds,
        }
    }

    /// The queue back, for a device kept for reuse; everything else the stream holds is
    /// dropped, the submit thread last (call after the last submission has finished).
    pub(crate) fn into_queue(self) -> wgpu::Queue {
        self.submitter.queue().clone()
    }

    /// Waits until every batch handed over is on the queue (what is still being recorded
    /// stays here).
    pub(crate) fn drain(&mut self) -> Result<()> {
        self.submitter.drain().map(|_| ())
    }

    /// Whether batches are encoded and submitted on the submit thread.
    pub(crate) fn threaded(&self) -> bool {
        self.submitter.threaded()
    }

    /// Time spent encoding and submitting batches so far.
    pub(crate) fn encode_time(&self) -> std::time::Duration {
        self.submitter.busy()
    }

    /// Starts profiling every dispatch (GPU timestamps when `timestamps`, host round trips
    /// otherwise). What was recorded before is submitted first, unprofiled.
    pub(crate) fn start_profiling(&mut self, timestamps: bool) -> Result<()> {
        self.flush()?;
        let gpu = timestamps
            .then(|| GpuTimer::new(&self.device, self.submitter.queue(), 2 * MAX_BATCH as u32));
        self.prof = Some(Profiling {
            gpu,
            pending: Vec::new(),
            events: Vec::new(),
            scopes: Vec::new(),
        });
        Ok(())
    }

    /// Stops profiling; returns the events and whether they are GPU times.
    pub(crate) fn stop_profiling(&mut self) -> Result<(Vec<KernelEvent>, bool)> {
        self.flush()?;
        Ok(self
            .prof
            .take()
            .map(|p| (p.events, p.gpu.is_some()))
            .unwrap_or_default())
    }

    fn now_us(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e6
    }

    /// Records one dispatch of `pipe` with `params` in its uniform slot and `storage` bound
    /// in order.
    pub(crate) fn dispatch(
        &mut self,
        pipe: &Pipeline,
        bytes: &[u8],
        storage: &[Slice<'_>],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let padded = bytes.len().max(16).div_ceil(16) * 16;
        let start = self.params.len().div_ceil(self.param_align) * self.param_align;
        if self.dispatches >= MAX_BATCH || start + padded > self.params_buf.size() as usize {
            self.submit()?;
        }
        let start = self.params.len().div_ceil(self.param_align) * self.param_align;
        self.params.resize(start, 0);
        self.params.extend_from_slice(bytes);
        self.params.resize(start + padded, 0);

        let bind_group = lock(&self.binds).get_or(pipe.layout_id, padded as u64, storage, || {
            let mut entries = Vec::with_capacity(MAX_STORAGE + 1);
            entries.push(wgpu::BindGroupEntry {
                binding: PARAMS_BINDING,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.params_buf,
                    offset: 0,
                    size: wgpu::BufferSize::new(padded as u64),
                }),
            });
            for (i, s) in storage.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: storage_binding(i),
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: s.buffer,
                        offset: s.offset,
                        size: wgpu::BufferSize::new(bound_size(s)),
                    }),
                });
            }
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.layout,
                entries: &entries,
            })
        });
        let Some(bind_group) = bind_group else {
            return Err(Error::Internal(format!(
                "dispatch of {} with {} storage bindings (at most {MAX_STORAGE})",
                pipe.label,
                storage.len()
            )));
        };
        self.cmds.push(Cmd::Dispatch {
            pipeline: pipe.pipeline.clone(),
            bind_group,
            params_offset: start as u32,
            groups,
        });
        self.dispatches += 1;
        self.dispatch_total += 1;
        if let Some(p) = &mut self.prof {
            let scope = p.scopes.last().cloned();
            if p.gpu.is_some() {
                p.pending.push((Arc::clone(&pipe.label), scope));
            } else {
                // Host timing: this dispatch alone, submitted and waited for.
                let t0 = self.now_us();
                if let Some(idx) = self.flush()? {
                    self.wait(idx)?;
                }
                let t1 = self.now_us();
                if let Some(p) = &mut self.prof {
                    p.events.push(KernelEvent {
                        kernel: Arc::clone(&pipe.label),
                        scope,
                        start_us: t0,
                        dur_us: t1 - t0,
                    });
                }
            }
        }
        Ok(())
    }

    fn wait(&self, idx: wgpu::SubmissionIndex) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::DeviceLost(e.to_string()))
    }

    /// Records a buffer-to-buffer copy (different buffers; sizes and offsets multiples of 4).
    pub(crate) fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) {
        if size == 0 {
            return;
        }
        self.cmds.push(Cmd::Copy {
            src: src.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            size,
        });
    }

    /// Records an upload of `data` to `dst` at `dst_off`, through the staging belt. The bytes
    /// written are `data` padded with zeros to a multiple of 4, so `dst` needs that much room.
    pub(crate) fn upload(&mut self, dst: &wgpu::Buffer, dst_off: u64, data: &[u8]) -> Result<()> {
        for (i, part) in data.chunks(CHUNK_SIZE as usize).enumerate() {
            if self.belt.batch_bytes >= MAX_BATCH_STAGING {
                // Double-buffer the staging memory of a large upload: submit this batch, then
                // wait for the one before it, whose chunks come back for the next pieces.
                self.submit()?;
                if let Some(idx) = self.submitter.drain()?.before {
                    self.device
                        .poll(wgpu::PollType::Wait {
                            submission_index: Some(idx),
                            timeout: None,
                        })
                        .map_err(|e| Error::DeviceLost(e.to_string()))?;
                }
            }
            let piece = self.belt.write(part)?;
            let off = dst_off + (i as u64) * CHUNK_SIZE;
            self.copy(&piece.buffer.clone(), piece.offset, dst, off, piece.len);
        }
        Ok(())
    }

    /// Maps a read-back's buffer once the batch recorded so far, which fills it, is submitted.
    pub(crate) fn read_after(&mut self, map: MapAfter) {
        self.maps.push(map);
    }

    /// Reads a profiled batch's timestamps back (waiting for the batch) into events.
    fn collect_timestamps(&mut self, idx: wgpu::SubmissionIndex, n: u32) -> Result<()> {
        let host_submit = self.now_us();
        let Some(p) = self.prof.as_mut() else {
            return Ok(());
        };
        let Some(t) = p.gpu.as_mut() else {
            return Ok(());
        };
        let bytes = 16 * n as u64;
        let done = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicBool::new(false));
        {
            let (done, ok) = (Arc::clone(&done), Arc::clone(&ok));
            t.read
                .slice(0..bytes)
                .map_async(wgpu::MapMode::Read, move |r| {
                    ok.store(r.is_ok(), Ordering::SeqCst);
                    done.store(true, Ordering::SeqCst);
                });
        }
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| Error::DeviceLost(e.to_string()))?;
        let t0 = Instant::now();
        while !done.load(Ordering::SeqCst) {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(Error::DeviceLost("profiler timestamps never mapped".into()));
            }
            let _ = self.device.poll(wgpu::PollType::Poll);
            std::thread::yield_now();
        }
        if !ok.load(Ordering::SeqCst) {
            return Err(Error::DeviceLost(
                "mapping profiler timestamps failed".into(),
            ));
        }
        let ticks: Vec<u64> = {
            let view = t
                .read
                .slice(0..bytes)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("profiler map: {e}")))?;
            view.chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect()
        };
        t.read.unmap();
        let (base, base_us) = *t.anchor.get_or_insert((ticks[0], host_submit));
        let us = |tick: u64| base_us + (tick.wrapping_sub(base) as i64) as f64 * t.period * 1e-3;
        for (k, (kernel, scope)) in p.pending.drain(..).enumerate() {
            let (a, b) = (ticks[2 * k], ticks[2 * k + 1]);
            p.events.push(KernelEvent {
                kernel,
                scope,
                start_us: us(a),
                dur_us: (b.saturating_sub(a)) as f64 * t.period * 1e-3,
            });
        }
        Ok(())
    }

    /// Hands everything recorded to the submitter, without waiting for the submit (but for it
    /// while the GPU profiler runs, whose timestamps are read back per batch).
    pub(crate) fn submit(&mut self) -> Result<()> {
        if self.prof.as_ref().is_some_and(|p| p.gpu.is_some()) {
            return self.flush().map(|_| ());
        }
        self.hand_off()
    }

    fn hand_off(&mut self) -> Result<()> {
        if self.cmds.is_empty() && self.belt.is_empty() && self.maps.is_empty() {
            return Ok(());
        }
        let params = if self.params.is_empty() {
            None
        } else {
            Some(self.belt.write(&self.params)?)
        };
        let timer = self
            .prof
            .as_ref()
            .and_then(|p| p.gpu.as_ref())
            .map(|t| Timestamps {
                set: t.set.clone(),
                resolve: t.resolve.clone(),
                read: t.read.clone(),
            });
        let batch = Batch {
            // Sized for a full batch: a vector grown one push at a time reallocated and
            // copied eight times a batch (seen in a profile of the recording thread).
            cmds: std::mem::replace(&mut self.cmds, Vec::with_capacity(MAX_BATCH)),
            params,
            params_buf: self.params_buf.clone(),
            staging: self.belt.finish(),
            timer,
            maps: std::mem::take(&mut self.maps),
        };
        self.params.clear();
        self.dispatches = 0;
        self.submits += 1;
        self.submitter.send(batch)
    }

    /// Submits everything recorded and waits until the submit (not the work) is done: after
    /// it, every command recorded so far is on the queue. Returns the latest submission.
    pub(crate) fn flush(&mut self) -> Result<Option<wgpu::SubmissionIndex>> {
        let timed = match self.prof.as_ref() {
            Some(p) if p.gpu.is_some() => p.pending.len() as u32,
            _ => 0,
        };
        self.hand_off()?;
        let last = self.submitter.drain()?.last;
        if timed > 0
            && let Some(idx) = &last
        {
            self.collect_timestamps(idx.clone(), timed)?;
        }
        Ok(last)
    }
}
