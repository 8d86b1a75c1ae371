//! Read-backs: a copy into a mappable staging buffer, then a map whose callback says the data
//! is here. [`Readback`] is a future of the elements, or blocks with [`Readback::wait`].

use super::Device;
use super::adapter::lock;
use crate::error::{Error, Result};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Where a read-back stands, shared with the map callback and the submit side.
pub(crate) struct MapState {
    /// The submission that fills the staging buffer, once the submit side has made it.
    pub(crate) submitted: Option<wgpu::SubmissionIndex>,
    /// The map's outcome, once its callback has run.
    pub(crate) done: Option<bool>,
    pub(crate) waker: Option<Waker>,
}

impl MapState {
    pub(crate) fn new() -> Arc<Mutex<MapState>> {
        Arc::new(Mutex::new(MapState {
            submitted: None,
            done: None,
            waker: None,
        }))
    }
}

/// A read-back's map, requested by the submit side right after the submit that fills the
/// buffer: wgpu refuses a submit that uses a buffer with a map pending, and requesting the map
/// here, not on the recording thread, lets a read-back be queued without waiting for the
/// submit thread to catch up (an optimizer step's read-back of the loss scaler's decision
/// would wait for it every step).
pub(crate) struct MapAfter {
    pub buffer: wgpu::Buffer,
    pub size: u64,
    pub state: Arc<Mutex<MapState>>,
}

impl MapAfter {
    /// Notes `idx` as the read-back's submission and requests the map.
    pub(crate) fn request(self, idx: &wgpu::SubmissionIndex) {
        lock(&self.state).submitted = Some(idx.clone());
        let state = self.state;
        self.buffer
            .map_async(wgpu::MapMode::Read, 0..self.size, move |r| {
                let mut s = lock(&state);
                s.done = Some(r.is_ok());
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            });
    }
}

/// A read-back in flight, resolving to the elements as `Vec<T>`. Await it, or call
/// [`Readback::wait`] to block.
pub struct Readback<T> {
    pub(crate) dev: Device,
    pub(crate) staging: Option<wgpu::Buffer>,
    pub(crate) len: u64,
    pub(crate) padded: u64,
    pub(crate) state: Arc<Mutex<MapState>>,
    pub(crate) poller: bool,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T: bytemuck::Pod> Readback<T> {
    /// A read-back of nothing, already complete.
    pub(crate) fn empty(dev: &Device) -> Self {
        Readback {
            dev: dev.clone(),
            staging: None,
            len: 0,
            padded: 0,
            state: Arc::new(Mutex::new(MapState {
                submitted: None,
                done: Some(true),
                waker: None,
            })),
            poller: true,
            _t: PhantomData,
        }
    }

    /// Blocks until the data is here.
    pub fn wait(self) -> Result<Vec<T>> {
        self.wait_with(<[T]>::to_vec)
    }

    /// Blocks until the data is here, then hands it to `f` straight from the mapped staging
    /// memory, and returns what `f` returns. No vector is allocated: a caller that sums or
    /// converts the elements into buffers it keeps skips a copy, and the page faults of
    /// fresh memory, which on some hosts cost more than the transfer (BENCHMARKS.md).
    pub fn wait_with<R>(mut self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        // What was recorded after the copy goes to the device before the host blocks, so the
        // device has it queued instead of idling until the host wakes, records on and submits.
        // A training step that waits at its update for the last step's decision
        // (`GradScaler::step_deferred`) otherwise left the device idle for its update's
        // recording and encoding whenever the step's forward and backward fit in one batch,
        // a measurable part of the step (docs/performance.md, the host path). Also where the
        // data is already here: the host stops here to use it, and the work is handed over
        // at the same point whatever the device's timing.
        self.dev.flush()?;
        if lock(&self.state).done.is_none() {
            let idx = submission(&self.dev, &self.state)?;
            self.dev.wait(idx)?;
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
            self.dev.poll_now()?;
            std::thread::yield_now();
        }
        self.take_with(f)
    }

    fn take_with<R>(&mut self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let ok = lock(&self.state).done;
        let Some(staging) = self.staging.take() else {
            return Ok(f(&[]));
        };
        if ok != Some(true) {
            return Err(Error::DeviceLost(
                "mapping a read-back buffer failed".into(),
            ));
        }
        let out = {
            let view = staging
                .get_mapped_range(0..self.padded)
                .map_err(|e| Error::Gpu(format!("read-back map: {e}")))?;
            // Mapped ranges are aligned to wgpu::MAP_ALIGNMENT (8 bytes), enough for every
            // element type.
            let elems = bytemuck::try_cast_slice::<u8, T>(&view[..self.len as usize])
                .map_err(|e| Error::Internal(format!("read-back of misaligned memory: {e}")))?;
            f(elems)
        };
        staging.unmap();
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
            return Poll::Ready(self.take_with(<[T]>::to_vec));
        }
        // Native wgpu runs map callbacks only inside `poll`; a helper thread waits for this
        // submission, then keeps polling until the callback has run (another thread's poll
        // may have collected it and not yet run it), so the callback fires and wakes us while
        // the caller's thread stays free.
        if !self.poller {
            self.poller = true;
            let dev = self.dev.clone();
            let state = Arc::clone(&self.state);
            std::thread::spawn(move || {
                if let Ok(idx) = submission(&dev, &state) {
                    let _ = dev.wait(idx);
                }
                let dev = &dev.inner.device;
                let t0 = Instant::now();
                while lock(&state).done.is_none() && t0.elapsed() < Duration::from_secs(30) {
                    let _ = dev.poll(wgpu::PollType::Poll);
                    std::thread::yield_now();
                }
            });
        }
        Poll::Pending
    }
}

/// The submission that fills a read-back's buffer, waiting for the submit thread to make it
/// if it has not yet.
fn submission(dev: &Device, state: &Mutex<MapState>) -> Result<wgpu::SubmissionIndex> {
    if let Some(idx) = lock(state).submitted.clone() {
        return Ok(idx);
    }
    lock(&dev.inner.stream).drain()?;
    lock(state)
        .submitted
        .clone()
        .ok_or_else(|| Error::Internal("a read-back's copy was never submitted".into()))
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
