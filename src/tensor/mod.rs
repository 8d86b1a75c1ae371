//! Tensors: a layout (shape, strides, offset) over storage in the device's memory pool.
//!
//! A [`Tensor`] is a cheap handle (`Arc`). Views (reshape, permute, transpose, narrow,
//! broadcast) share storage and only change the layout; ops that need a plain buffer make a
//! dense copy first (`contiguous`), the others read strides. Dropping the last handle to a
//! storage returns its block to the pool at once: commands already queued that read it are
//! ordered before any later use of the block (see `memory`).
//!
//! Autograd state lives here too, as in candle: `requires_grad`, the node an op recorded
//! (only when an input needs gradients; see [`graph`]) and, for leaves, the accumulated
//! gradient. The differentiable ops are in `ops/`; the backward walk in `autograd/`.
//!
//! Tensors are made from host data ([`Tensor::from_slice`], [`Device::tensor`]) or on the
//! device ([`Tensor::zeros`], [`Tensor::full`], [`Tensor::randn`], ...), and read back with
//! [`Tensor::to_vec`], [`Tensor::to_f32_vec`], [`Tensor::to_scalar`] or, without blocking,
//! [`Tensor::to_vec_async`]. A read-back is where the host waits for the queued work.

pub mod graph;

pub(crate) use crate::layout::check_numel;
pub use crate::layout::{Layout, contiguous_strides};

use crate::device::{Device, Readback};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::kernels;
use crate::kernels::fill::Dist;
use crate::memory::Block;
use graph::Node;
use half::f16;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Identifies a tensor (unique per process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn fresh() -> TensorId {
        TensorId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// An n-dimensional array on a device.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

pub(crate) struct TensorInner {
    pub(crate) id: TensorId,
    pub(crate) dev: Device,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) storage: Arc<Block>,
    /// Gradients flow to (or through) this tensor.
    pub(crate) requires_grad: AtomicBool,
    /// A leaf whose gradient is accumulated (a parameter).
    pub(crate) variable: AtomicBool,
    /// How the tensor was computed, when recorded. Taken (and so freed) by `backward`.
    pub(crate) node: Mutex<Option<Node>>,
    /// Accumulated gradient of a variable.
    pub(crate) grad: Mutex<Option<Tensor>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Number of elements of a shape, with overflow checked.
pub(crate) fn numel_of(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid(
                op,
                format!("shape {shape:?} has more elements than fit in memory"),
            )
        })
}

impl Tensor {
    // ----- construction -----

    /// A dense tensor of `shape` and `dtype` whose contents are not initialised (NaN on a
    /// poisoning device).
    pub(crate) fn uninit(dev: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = numel_of("alloc", shape)?;
        let block = dev.alloc(dtype.bytes(n))?;
        if dev.inner.poison {
            kernels::fill::fill_words(dev, &block, 0x7fc0_7fc0)?;
        }
        Ok(Tensor::from_parts(
            dev,
            Layout::contiguous(shape),
            dtype,
            Arc::new(block),
            None,
        ))
    }

    /// Wraps storage; `node` is the op's record, present only when it records (the caller
    /// checked).
    pub(crate) fn from_parts(
        dev: &Device,
        layout: Layout,
        dtype: DType,
        storage: Arc<Block>,
        node: Option<Node>,
    ) -> Tensor {
        let requires_grad = node.is_some();
        Tensor(Arc::new(TensorInner {
            id: TensorId::fresh(),
            dev: dev.clone(),
            layout,
            dtype,
            storage,
            requires_grad: AtomicBool::new(requires_grad),
            variable: AtomicBool::new(false),
            node: Mutex::new(node),
            grad: Mutex::new(None),
        }))
    }

    /// A view of this tensor's storage with another layout, recording `node`.
    pub(crate) fn view(&self, layout: Layout, node: Option<Node>) -> Tensor {
        Tensor::from_parts(
            self.device(),
            layout,
            self.dtype(),
            Arc::clone(&self.0.storage),
            node,
        )
    }

    /// A tensor holding `data` (row-major) with `shape`; the dtype is `T`'s.
    ///
    /// ```
    /// use wgrad::{DType, Device, Tensor};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = Device::new()?;
    /// let t = Tensor::from_slice(&dev, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!(t.shape(), [2, 3]);
    /// assert_eq!(t.dtype(), DType::F32);
    /// let ids = Tensor::from_slice(&dev, &[7u32, 8, 9], &[3])?;
    /// assert_eq!(ids.dtype(), DType::U32);
    /// assert!(Tensor::from_slice(&dev, &[1.0f32, 2.0], &[3]).is_err()); // 2 values, 3 places
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_slice<T: Element>(dev: &Device, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = numel_of("from_slice", shape)?;
        if data.len() != n {
            return Err(Error::shape(
                "from_slice",
                format!("{} values for shape {shape:?} ({n} elements)", data.len()),
            ));
        }
        let t = Tensor::uninit(dev, shape, T::DTYPE)?;
        dev.upload(&t.0.storage, 0, bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// A tensor of `dtype` from f32 values, converted on the host (rounding to nearest even).
    pub fn from_f32(dev: &Device, data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::F32 => Tensor::from_slice(dev, data, shape),
            DType::F16 => {
                let h: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
                Tensor::from_slice(dev, &h, shape)
            }
            DType::BF16 => {
                let h: Vec<half::bf16> = data.iter().map(|&v| half::bf16::from_f32(v)).collect();
                Tensor::from_slice(dev, &h, shape)
            }
            DType::U32 => {
                let u: Vec<u32> = data.iter().map(|&v| v as u32).collect();
                Tensor::from_slice(dev, &u, shape)
            }
        }
    }

    /// A tensor filled with `value` (for u32, the value converted to an integer).
    pub fn full(dev: &Device, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor> {
        let t = Tensor::uninit(dev, shape, dtype)?;
        let v = if dtype == DType::U32 {
            f32::from_bits(value.max(0.0) as u32)
        } else {
            value
        };
        kernels::fill::fill(dev, &t.0.storage, dtype, t.numel(), v)?;
        Ok(t)
    }

    /// Zeros.
    pub fn zeros(dev: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(dev, shape, 0.0, dtype)
    }

    /// Ones.
    pub fn ones(dev: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(dev, shape, 1.0, dtype)
    }

    fn random(dev: &Device, shape: &[usize], dtype: DType, dist: Dist) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::DType {
                op: "rand",
                expected: DType::F32,
                got: dtype,
            });
        }
        let t = Tensor::uninit(dev, shape, dtype)?;
        kernels::fill::random(dev, &t.0.storage, dtype, t.numel(), dist, dev.next_seed())?;
        Ok(t)
    }

    /// Uniform in [lo, hi), generated on the device from the device's seed counter
    /// (`Device::manual_seed` makes it reproducible).
    pub fn rand(dev: &Device, shape: &[usize], lo: f32, hi: f32, dtype: DType) -> Result<Tensor> {
        Tensor::random(dev, shape, dtype, Dist::Uniform(lo, hi))
    }

    /// Normal with `mean` and `std`, generated on the device.
    pub fn randn(
        dev: &Device,
        shape: &[usize],
        mean: f32,
        std: f32,
        dtype: DType,
    ) -> Result<Tensor> {
        Tensor::random(dev, shape, dtype, Dist::Normal(mean, std))
    }

    /// Overwrites the elements with `data` (same count and dtype; the tensor must own dense
    /// storage, not be a view). The upload is ordered after every command already queued, so
    /// kernels queued earlier still see the old values.
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op: "copy_from_slice",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        self.write_bytes(bytemuck::cast_slice(data))
    }

    /// Overwrites the elements with raw little-endian bytes of the tensor's dtype.
    pub(crate) fn write_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 != self.nbytes() {
            return Err(Error::shape(
                "write",
                format!(
                    "{} bytes for a tensor of {} bytes ({:?}, {})",
                    bytes.len(),
                    self.nbytes(),
                    self.shape(),
                    self.dtype()
                ),
            ));
        }
        self.dense_block("write")?;
        self.device().upload(&self.0.storage, 0, bytes)
    }

    // ----- reading -----

    /// The elements, row-major. `T` must match the dtype. Submits queued work and waits.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0], &[3])?;
    /// let y = x.mul(&x)?.add_scalar(1.0)?; // queued
    /// assert_eq!(y.to_vec::<f32>()?, [2.0, 5.0, 10.0]); // submitted, waited for, copied
    /// assert!(y.to_vec::<u32>().is_err()); // `T` is not the dtype
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_read::<T>()?;
        self.read_async::<T>()?.wait()
    }

    /// The elements as f32, whatever the dtype.
    ///
    /// ```
    /// use wgrad::{DType, Tensor};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let h = Tensor::from_f32(&dev, &[0.5, -2.0, 1.0e-3], &[3], DType::BF16)?;
    /// let back = h.to_f32_vec()?;
    /// assert_eq!(back[..2], [0.5, -2.0]); // exact in bf16
    /// assert!((back[2] - 1.0e-3).abs() < 1.0e-5); // rounded to bf16's 8 bits
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        Ok(match self.dtype() {
            DType::F32 => self.to_vec::<f32>()?,
            DType::F16 => self.to_vec::<f16>()?.into_iter().map(f16::to_f32).collect(),
            DType::BF16 => self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(half::bf16::to_f32)
                .collect(),
            DType::U32 => self
                .to_vec::<u32>()?
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        })
    }

    /// The single element of a one-element tensor, as f32.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.5f32, 2.5], &[2])?;
    /// assert_eq!(x.sum_all()?.to_scalar()?, 4.0);
    /// assert!(x.to_scalar().is_err()); // two elements
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_scalar(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "to_scalar",
                format!("tensor of shape {:?} is not one element", self.shape()),
            ));
        }
        Ok(self.to_f32_vec()?[0])
    }

    /// Starts a read-back and returns a future of the elements, so the host can queue more
    /// work while the data comes back.
    pub fn to_vec_async<T: Element>(&self) -> Result<Readback<T>> {
        self.check_read::<T>()?;
        self.read_async::<T>()
    }

    fn check_read<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op: "to_vec",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        Ok(())
    }

    fn read_async<T: bytemuck::Pod>(&self) -> Result<Readback<T>> {
        // A contiguous layout reads straight from its offset when that is word-aligned;
        // anything else is copied dense first.
        let l = self.layout();
        let byte_off = self.dtype().bytes(l.offset());
        if l.is_contiguous() && byte_off.is_multiple_of(4) {
            return self.device().read_block(
                &self.0.storage,
                byte_off,
                self.dtype().bytes(self.numel()),
            );
        }
        self.dense_copy()?.read_async()
    }

    /// Starts reading the elements' bytes back (any dtype), for moving them to another device.
    pub(crate) fn read_bytes_async(&self) -> Result<Readback<u8>> {
        self.read_async::<u8>()
    }

    /// A dense copy of the elements (not recorded; `contiguous` is the differentiable one).
    pub(crate) fn dense_copy(&self) -> Result<Tensor> {
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        kernels::copy::strided_layout(
            self.device(),
            self.block(),
            self.layout(),
            out.block(),
            out.layout(),
            self.dtype(),
        )?;
        Ok(out)
    }

    // ----- metadata -----

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }

    /// Elements between neighbours along each dimension (views have other strides than
    /// row-major ones; 0 for a broadcast dimension).
    pub fn strides(&self) -> &[usize] {
        self.0.layout.strides()
    }

    /// Shape, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// Row-major without gaps (possibly from an offset).
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Size of dimension `d`; negative counts from the end.
    pub fn dim(&self, d: isize) -> Result<usize> {
        let a = self.axis(d, "dim")?;
        Ok(self.shape()[a])
    }

    /// Resolves a possibly negative axis against the rank.
    pub(crate) fn axis(&self, d: isize, op: &'static str) -> Result<usize> {
        let r = self.rank() as isize;
        let a = if d < 0 { d + r } else { d };
        if a < 0 || a >= r {
            return Err(Error::invalid(
                op,
                format!("axis {d} out of range for shape {:?}", self.shape()),
            ));
        }
        Ok(a as usize)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// Bytes of the elements (not counting block rounding).
    pub fn nbytes(&self) -> u64 {
        self.dtype().bytes(self.numel())
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.0.dev
    }

    /// The tensor's unique id.
    pub fn id(&self) -> TensorId {
        self.0.id
    }

    /// The storage block, whatever the layout (kernels that read strides take it with the
    /// layout).
    pub(crate) fn block(&self) -> &Block {
        &self.0.storage
    }

    /// The storage block of a dense tensor (row-major from element 0), which is what kernels
    /// without strides read; an internal error otherwise (an op forgot `contiguous`).
    pub(crate) fn dense_block(&self, op: &'static str) -> Result<&Block> {
        if !self.0.layout.is_dense() {
            return Err(Error::Internal(format!(
                "{op}: a {:?} view reached a kernel that needs dense storage",
                self.shape()
            )));
        }
        Ok(&self.0.storage)
    }

    /// (page, byte offset) of the tensor's storage in the memory pool; for tests of reuse.
    #[doc(hidden)]
    pub fn storage_location(&self) -> (u64, u64) {
        (self.0.storage.page(), self.0.storage.offset())
    }

    /// True when both handles share storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    // ----- autograd state -----

    /// Whether gradients are tracked for this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// Makes this tensor a variable (a parameter): a leaf whose gradient accumulates in
    /// [`Tensor::grad`], like PyTorch's `requires_grad_()`. The change is in place, so every
    /// handle to this tensor (the one returned and the caller's) sees the gradient. A tensor
    /// computed by a recorded op is not a leaf: for it this returns a new leaf on the same
    /// storage, cut from the graph, and only that handle gets gradients.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let w = dev.tensor(&[1.0f32, 2.0], &[2])?.variable();
    /// assert!(w.is_variable() && w.requires_grad());
    /// let y = w.mul_scalar(3.0)?; // computed from a variable: recorded
    /// assert!(y.requires_grad() && !y.is_variable());
    /// y.sum_all()?.backward()?;
    /// assert_eq!(w.grad().expect("a variable").to_vec::<f32>()?, [3.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn variable(&self) -> Tensor {
        if lock(&self.0.node).is_some() {
            let t = self.detach();
            t.0.requires_grad.store(true, Ordering::Relaxed);
            t.0.variable.store(true, Ordering::Relaxed);
            return t;
        }
        self.0.requires_grad.store(true, Ordering::Relaxed);
        self.0.variable.store(true, Ordering::Relaxed);
        self.clone()
    }

    /// Freezes a variable: it stays a parameter (in `params()` and weight files) but gets no
    /// gradient. Ops on it alone record nothing, products skip its gradient, and optimizers
    /// keep no state for it. Its gradient so far is dropped. No effect on other tensors.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let w = dev.tensor(&[1.0f32, 2.0], &[2])?.variable();
    /// w.freeze();
    /// assert!(w.is_frozen() && !w.requires_grad());
    /// let y = w.mul_scalar(3.0)?; // nothing recorded
    /// assert!(!y.requires_grad());
    /// w.unfreeze();
    /// assert!(w.requires_grad());
    /// # Ok(())
    /// # }
    /// ```
    pub fn freeze(&self) {
        if self.is_variable() {
            self.0.requires_grad.store(false, Ordering::Relaxed);
            self.set_grad(None);
        }
    }

    /// Undoes [`freeze`](Tensor::freeze): the variable gets gradients again.
    pub fn unfreeze(&self) {
        if self.is_variable() {
            self.0.requires_grad.store(true, Ordering::Relaxed);
        }
    }

    /// True for a frozen variable (see [`freeze`](Tensor::freeze)).
    pub fn is_frozen(&self) -> bool {
        self.is_variable() && !self.requires_grad()
    }

    /// The same elements, cut from the graph (no gradient flows through it).
    pub fn detach(&self) -> Tensor {
        self.view(self.layout().clone(), None)
    }

    /// True for a variable (a leaf whose gradient is kept).
    pub fn is_variable(&self) -> bool {
        self.0.variable.load(Ordering::Relaxed)
    }

    /// The accumulated gradient of a leaf variable.
    pub fn grad(&self) -> Option<Tensor> {
        lock(&self.0.grad).clone()
    }

    /// Replaces (or clears) the accumulated gradient.
    pub fn set_grad(&self, g: Option<Tensor>) {
        *lock(&self.0.grad) = g;
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// Attaches a recorded node to a freshly computed tensor.
    pub(crate) fn with_node(mut self, node: Option<Node>) -> Tensor {
        let Some(node) = node else {
            return self;
        };
        // In place when this is the only handle (an op's fresh output): unwrapping the `Arc`
        // and wrapping it again was a free and an allocation per recorded op.
        match Arc::get_mut(&mut self.0) {
            Some(inner) => {
                *inner.requires_grad.get_mut() = true;
                *inner.node.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(node);
                self
            }
            None => self.view_with(node),
        }
    }

    fn view_with(&self, node: Node) -> Tensor {
        self.view(self.layout().clone(), Some(node))
    }
}

impl Device {
    /// Zeros of `shape` and `dtype`.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let z = dev.zeros(&[2, 3], wgrad::DType::F16)?;
    /// assert_eq!((z.shape(), z.nbytes()), (&[2, 3][..], 12));
    /// assert_eq!(z.to_f32_vec()?, [0.0; 6]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::zeros(self, shape, dtype)
    }

    /// Ones of `shape` and `dtype`.
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::ones(self, shape, dtype)
    }

    /// Standard normal numbers of `shape` and `dtype`, generated on the device.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// use wgrad::DType;
    /// let dev = wgrad::Device::new()?;
    /// dev.manual_seed(7);
    /// let a = dev.randn(&[1000], DType::F32)?;
    /// dev.manual_seed(7);
    /// let b = dev.randn(&[1000], DType::F32)?;
    /// assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?); // same seed, same numbers
    /// assert!(a.mean_all()?.to_scalar()?.abs() < 0.2);
    /// assert!((a.std(0, 1, false)?.to_scalar()? - 1.0).abs() < 0.2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::randn(self, shape, 0.0, 1.0, dtype)
    }

    /// Uniform numbers in [0, 1).
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::rand(self, shape, 0.0, 1.0, dtype)
    }

    /// A tensor holding `data` with `shape`.
    pub fn tensor<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice(self, data, shape)
    }
}
