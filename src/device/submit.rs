//! The submit thread: encodes and submits the stream's batches off the recording thread.
//!
//! Why: wgpu validates and encodes a command buffer at `finish`, and the driver records it at
//! submit, about a third of the host's time in a training step (docs/performance.md, the
//! host path); on the thread that runs the model it would all add to the step. The stream
//! hands each finished batch here and goes on recording the next one while this thread
//! encodes, so the two overlap.
//!
//! Order: batches are encoded and submitted one at a time, in the order they were handed over,
//! so the queue order that block reuse and uploads rely on (`memory`, `staging`) is kept.
//! Back-pressure: at most [`QUEUED`] batches wait; a host far ahead of the device blocks in
//! [`Submitter::send`] instead of holding ever more commands.
//!
//! `WGRAD_DISABLE=submit_thread` (`DeviceOptions::disable_submit_thread`) encodes and submits on
//! the recording thread instead, as before. So does a device whose thread cannot be started.

use super::adapter::lock;
use super::readback::MapAfter;
use crate::error::{Error, Result};
use crate::memory::staging::{Piece, Submitted};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Batches handed over and not yet taken by the thread, at most.
const QUEUED: usize = 2;

/// One recorded command.
pub(crate) enum Cmd {
    Dispatch {
        pipeline: wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        /// Where the dispatch's parameter block starts in the parameter buffer.
        params_offset: u32,
        groups: [u32; 3],
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        size: u64,
    },
}

/// Timestamp queries written around each dispatch while the GPU profiler runs.
pub(crate) struct Timestamps {
    pub set: wgpu::QuerySet,
    pub resolve: wgpu::Buffer,
    pub read: wgpu::Buffer,
}

/// One batch: everything recorded between two submits.
pub(crate) struct Batch {
    pub cmds: Vec<Cmd>,
    /// The batch's kernel parameters in staging memory, copied into `params_buf` first.
    pub params: Option<Piece>,
    pub params_buf: wgpu::Buffer,
    /// The staging chunks this batch reads, mapped again after its submit.
    pub staging: Submitted,
    pub timer: Option<Timestamps>,
    /// Read-backs whose copies this batch holds, mapped after its submit.
    pub maps: Vec<MapAfter>,
}

/// The last two submissions, as the waiting side needs them.
#[derive(Default, Clone)]
pub(crate) struct Submissions {
    /// The latest batch's submission.
    pub last: Option<wgpu::SubmissionIndex>,
    /// The one before it.
    pub before: Option<wgpu::SubmissionIndex>,
    /// Time spent encoding and submitting, all batches so far.
    pub busy: Duration,
}

impl Submissions {
    /// Encodes and submits `batch`, and notes it.
    fn run(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, batch: Batch) {
        let t = Instant::now();
        let idx = encode_and_submit(device, queue, batch);
        self.busy += t.elapsed();
        self.before = self.last.replace(idx);
    }
}

#[derive(Default)]
struct State {
    /// Batches submitted so far.
    done: u64,
    subs: Submissions,
    /// The thread has ended (its channel closed, or it unwound).
    stopped: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// Marks the thread stopped when it ends for any reason, so no waiter waits forever.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        lock(&self.0.state).stopped = true;
        self.0.cv.notify_all();
    }
}

enum Mode {
    Inline(Submissions),
    Thread {
        tx: Option<SyncSender<Batch>>,
        shared: Arc<Shared>,
        handle: Option<JoinHandle<()>>,
        /// Batches handed over so far.
        sent: u64,
    },
}

/// Encodes and submits batches, on its own thread or inline.
pub(crate) struct Submitter {
    device: wgpu::Device,
    queue: wgpu::Queue,
    mode: Mode,
}

impl Submitter {
    pub(crate) fn new(device: wgpu::Device, queue: wgpu::Queue, threaded: bool) -> Submitter {
        let mode = if threaded {
            let shared = Arc::new(Shared::default());
            let (tx, rx) = sync_channel::<Batch>(QUEUED);
            let (d, q, sh) = (device.clone(), queue.clone(), Arc::clone(&shared));
            let spawned = std::thread::Builder::new()
                .name("wgrad-submit".into())
                .spawn(move || {
                    let _guard = StopGuard(Arc::clone(&sh));
                    // The submissions are kept outside the lock while a batch is encoded.
                    let mut subs = Submissions::default();
                    while let Ok(batch) = rx.recv() {
                        subs.run(&d, &q, batch);
                        let mut st = lock(&sh.state);
                        st.done += 1;
                        st.subs = subs.clone();
                        drop(st);
                        sh.cv.notify_all();
                    }
                });
            match spawned {
                Ok(handle) => Mode::Thread {
                    tx: Some(tx),
                    shared,
                    handle: Some(handle),
                    sent: 0,
                },
                Err(_) => Mode::Inline(Submissions::default()),
            }
        } else {
            Mode::Inline(Submissions::default())
        };
        Submitter {
            device,
            queue,
            mode,
        }
    }

    pub(crate) fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Whether batches are submitted on the submit thread.
    pub(crate) fn threaded(&self) -> bool {
        matches!(self.mode, Mode::Thread { .. })
    }

    /// Time spent encoding and submitting the batches submitted so far (without waiting for
    /// those still queued).
    pub(crate) fn busy(&self) -> Duration {
        match &self.mode {
            Mode::Inline(subs) => subs.busy,
            Mode::Thread { shared, .. } => lock(&shared.state).subs.busy,
        }
    }

    /// Hands a batch over; it is submitted after every batch handed over before it.
    pub(crate) fn send(&mut self, batch: Batch) -> Result<()> {
        match &mut self.mode {
            Mode::Inline(subs) => {
                subs.run(&self.device, &self.queue, batch);
                Ok(())
            }
            Mode::Thread { tx, sent, .. } => {
                let Some(tx) = tx.as_ref() else {
                    return Err(stopped());
                };
                tx.send(batch).map_err(|_| stopped())?;
                *sent += 1;
                Ok(())
            }
        }
    }

    /// Waits until every batch handed over has been submitted; returns the last two
    /// submissions.
    pub(crate) fn drain(&mut self) -> Result<Submissions> {
        match &self.mode {
            Mode::Inline(subs) => Ok(subs.clone()),
            Mode::Thread { shared, sent, .. } => {
                let mut st = lock(&shared.state);
                while st.done < *sent {
                    if st.stopped {
                        return Err(stopped());
                    }
                    st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                Ok(st.subs.clone())
            }
        }
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        if let Mode::Thread { tx, handle, .. } = &mut self.mode {
            // Closing the channel ends the thread once it has submitted what it holds.
            drop(tx.take());
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

fn stopped() -> Error {
    Error::DeviceLost("the submit thread stopped".into())
}

/// Encodes `batch` into one command buffer and submits it. With timestamps each dispatch gets
/// a pass of its own, timestamped at both ends.
fn encode_and_submit(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    batch: Batch,
) -> wgpu::SubmissionIndex {
    let Batch {
        cmds,
        params,
        params_buf,
        staging,
        timer,
        maps,
    } = batch;
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("wgrad batch"),
    });
    if let Some(p) = &params {
        enc.copy_buffer_to_buffer(&p.buffer, p.offset, &params_buf, 0, p.len);
    }
    let mut timed = 0u32;
    let mut i = 0;
    while i < cmds.len() {
        match &cmds[i] {
            Cmd::Copy {
                src,
                src_off,
                dst,
                dst_off,
                size,
            } => {
                enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *size);
                i += 1;
            }
            Cmd::Dispatch { .. } => {
                let timestamp_writes = timer.as_ref().map(|t| wgpu::ComputePassTimestampWrites {
                    query_set: &t.set,
                    beginning_of_pass_write_index: Some(2 * timed),
                    end_of_pass_write_index: Some(2 * timed + 1),
                });
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                });
                while let Some(Cmd::Dispatch {
                    pipeline,
                    bind_group,
                    params_offset,
                    groups,
                }) = cmds.get(i)
                {
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind_group, &[*params_offset]);
                    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                    i += 1;
                    if timer.is_some() {
                        timed += 1;
                        break;
                    }
                }
            }
        }
    }
    if let Some(t) = &timer
        && timed > 0
    {
        enc.resolve_query_set(&t.set, 0..2 * timed, &t.resolve, 0);
        enc.copy_buffer_to_buffer(&t.resolve, 0, &t.read, 0, 16 * timed as u64);
    }
    let idx = queue.submit([enc.finish()]);
    for m in maps {
        m.request(&idx);
    }
    staging.recall();
    // The commands' handles (pipelines, bind groups, buffers) go now, after the submit.
    drop(cmds);
    // Let finished maps (staging chunks coming back) run their callbacks; never blocks.
    let _ = device.poll(wgpu::PollType::Poll);
    idx
}
