//! Staging memory: host-visible buffers that carry data to and from the device without a new
//! buffer per transfer.
//!
//! Uploads: [`UploadBelt`] hands out space in mapped `MAP_WRITE | COPY_SRC` chunks. The caller
//! records a buffer-to-buffer copy in the command stream, so the upload is ordered with the
//! kernels around it (this is what makes reuse of freed blocks safe, see `memory`). At submit the
//! used chunks are unmapped; right after the submit, each is re-mapped with `map_async`, whose callback
//! fires once the GPU has finished the copies, and puts the chunk back on the ready list. A
//! steady loop therefore cycles through the same few chunks.
//!
//! Downloads: [`DownloadPool`] keeps `MAP_READ | COPY_DST` buffers by power-of-two size. A
//! read-back copies into one, maps it, reads, unmaps, and returns it to the pool.

use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// Copies are recorded in pieces of at most this many bytes, one chunk each.
pub(crate) const CHUNK_SIZE: u64 = 4 << 20;
/// Offsets inside a chunk are kept at this alignment (wgpu needs 8 for mapping, 4 for copies).
const CHUNK_ALIGN: u64 = 16;

struct Chunk {
    buffer: wgpu::Buffer,
    size: u64,
    used: u64,
}

/// A piece of an upload: `len` bytes at `offset` of `buffer`, to be copied by the caller.
pub(crate) struct Piece {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub len: u64,
}

/// The chunks of one submitted batch, unmapped, waiting to be mapped again.
pub(crate) struct Submitted {
    chunks: Vec<Chunk>,
    ready: Arc<Mutex<Vec<Chunk>>>,
}

impl Submitted {
    /// After the batch's submit: ask for each chunk to be mapped again; the callback, run once
    /// the GPU is done with the chunk, puts it back on the belt's ready list.
    pub(crate) fn recall(self) {
        for c in self.chunks {
            let ready = Arc::clone(&self.ready);
            let buffer = c.buffer.clone();
            buffer.map_async(wgpu::MapMode::Write, .., move |res| {
                // A failed map (device lost) just drops the chunk.
                if res.is_ok() {
                    ready.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
            });
        }
    }
}

/// The upload staging ring.
pub(crate) struct UploadBelt {
    device: wgpu::Device,
    /// The chunk being filled (mapped).
    current: Option<Chunk>,
    /// Chunks filled in this batch, unmapped at submit.
    filled: Vec<Chunk>,
    /// Mapped, empty chunks, ready to fill. Map callbacks push here.
    ready: Arc<Mutex<Vec<Chunk>>>,
    /// Bytes written in the current batch.
    pub batch_bytes: u64,
    /// Chunks created so far.
    pub created: u64,
    /// Bytes of all chunks created so far.
    pub bytes: u64,
}

impl UploadBelt {
    pub(crate) fn new(device: wgpu::Device) -> Self {
        UploadBelt {
            device,
            current: None,
            filled: Vec::new(),
            ready: Arc::new(Mutex::new(Vec::new())),
            batch_bytes: 0,
            created: 0,
            bytes: 0,
        }
    }

    /// Copies `data` (at most [`CHUNK_SIZE`] bytes) into staging memory. The piece's length is
    /// `data.len()` rounded up to 4 (copies move whole words; the padding is zero).
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<Piece> {
        let len = (data.len() as u64).div_ceil(4) * 4;
        debug_assert!(len <= CHUNK_SIZE);
        let fits = self
            .current
            .as_ref()
            .is_some_and(|c| c.used + len <= c.size);
        if !fits {
            if let Some(c) = self.current.take() {
                self.filled.push(c);
            }
            self.current = Some(self.fresh_chunk());
        }
        let Some(chunk) = self.current.as_mut() else {
            unreachable!("a current chunk was just installed")
        };
        let offset = chunk.used;
        {
            let mut view = chunk
                .buffer
                .get_mapped_range_mut(offset..offset + len)
                .map_err(|e| Error::Gpu(format!("staging map: {e}")))?;
            let mut w = view.slice(..);
            let n = data.len();
            w.slice(..n).copy_from_slice(data);
            if len as usize > n {
                let zeros = [0u8; 4];
                w.slice(n..len as usize)
                    .copy_from_slice(&zeros[..len as usize - n]);
            }
        }
        chunk.used = (offset + len).div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN;
        self.batch_bytes += len;
        Ok(Piece {
            buffer: chunk.buffer.clone(),
            offset,
            len,
        })
    }

    fn fresh_chunk(&mut self) -> Chunk {
        // Let finished maps hand their chunks back before deciding to create one.
        let _ = self.device.poll(wgpu::PollType::Poll);
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(mut c) = ready {
            c.used = 0;
            return c;
        }
        self.created += 1;
        self.bytes += CHUNK_SIZE;
        Chunk {
            buffer: self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgrad upload staging"),
                size: CHUNK_SIZE,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            }),
            size: CHUNK_SIZE,
            used: 0,
        }
    }

    /// Before submit: unmap every chunk written in this batch. The returned set goes with the
    /// batch and is recalled right after its submit (on whichever thread submits it).
    pub(crate) fn finish(&mut self) -> Submitted {
        if let Some(c) = self.current.take() {
            if c.used > 0 {
                self.filled.push(c);
            } else {
                self.current = Some(c);
            }
        }
        let chunks: Vec<Chunk> = self.filled.drain(..).collect();
        for c in &chunks {
            c.buffer.unmap();
        }
        self.batch_bytes = 0;
        Submitted {
            chunks,
            ready: Arc::clone(&self.ready),
        }
    }

    /// True when nothing was written in this batch.
    pub(crate) fn is_empty(&self) -> bool {
        self.filled.is_empty() && self.current.as_ref().is_none_or(|c| c.used == 0)
    }

    /// Releases ready chunks (empty_cache).
    pub(crate) fn trim(&mut self) {
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        self.bytes -= ready.iter().map(|c| c.size).sum::<u64>();
        ready.clear();
    }
}

/// Pooled read-back buffers.
pub(crate) struct DownloadPool {
    device: wgpu::Device,
    free: Vec<wgpu::Buffer>,
    /// Buffers created so far.
    pub created: u64,
    /// Bytes of buffers held (free and in use).
    pub bytes: u64,
}

/// Free read-back buffers above this many bytes in total are released instead of kept.
const DOWNLOAD_KEEP: u64 = 256 << 20;

impl DownloadPool {
    pub(crate) fn new(device: wgpu::Device) -> Self {
        DownloadPool {
            device,
            free: Vec::new(),
            created: 0,
            bytes: 0,
        }
    }

    /// A mappable buffer of at least `len` bytes.
    pub(crate) fn get(&mut self, len: u64) -> wgpu::Buffer {
        let size = len.max(4096).next_power_of_two();
        if let Some(i) = self.free.iter().position(|b| b.size() == size) {
            return self.free.swap_remove(i);
        }
        self.created += 1;
        self.bytes += size;
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Returns an unmapped buffer to the pool.
    pub(crate) fn put(&mut self, b: wgpu::Buffer) {
        let kept: u64 = self.free.iter().map(|b| b.size()).sum();
        if kept + b.size() > DOWNLOAD_KEEP {
            self.bytes -= b.size();
            return;
        }
        self.free.push(b);
    }

    /// Releases every free buffer (empty_cache).
    pub(crate) fn trim(&mut self) {
        self.bytes -= self.free.iter().map(|b| b.size()).sum::<u64>();
        self.free.clear();
    }
}
