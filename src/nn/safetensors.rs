//! Named weights in the safetensors format, so they move to and from PyTorch, candle and Burn.

use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::path::Path;

struct Host {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Host {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::U32 => Dtype::U32,
    }
}

pub(crate) fn our_dtype(path: &Path, name: &str, d: Dtype) -> Result<DType> {
    Ok(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::U32 => DType::U32,
        other => {
            return Err(Error::format(
                path.display().to_string(),
                format!("tensor {name}: dtype {other:?} is not f32, f16, bf16 or u32"),
            ));
        }
    })
}

pub(crate) fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
        DType::F16 => bytemuck::cast_slice(&t.to_vec::<half::f16>()?).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&t.to_vec::<half::bf16>()?).to_vec(),
        DType::U32 => bytemuck::cast_slice(&t.to_vec::<u32>()?).to_vec(),
    })
}

/// Writes named tensors to a safetensors file.
///
/// ```
/// use wgrad::nn::{self, Linear, Module};
/// use wgrad::DType;
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let path = std::env::temp_dir().join(format!("wgrad-doc-{}.safetensors", std::process::id()));
/// let a = Linear::new(&dev, 3, 2, true, DType::F32)?;
/// nn::save(&path, &a.state_dict())?;
///
/// // Into a model of the same shape, by name:
/// let b = Linear::new(&dev, 3, 2, true, DType::F32)?;
/// nn::load_into(&b, &path)?;
/// assert_eq!(b.weight.to_vec::<f32>()?, a.weight.to_vec::<f32>()?);
///
/// // Or every tensor of the file, with its name:
/// let named = nn::load(&dev, &path)?;
/// let mut names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
/// names.sort();
/// assert_eq!(names, ["bias", "weight"]);
///
/// // A model of another shape is refused, and keeps its weights.
/// let c = Linear::new(&dev, 4, 2, true, DType::F32)?;
/// assert!(nn::load_into(&c, &path).is_err());
/// std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let bytes = serialize(path, tensors, None)?;
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The safetensors bytes of named tensors (read back from the device), with optional
/// metadata in the header.
pub(crate) fn serialize(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let host: Vec<(String, Host)> = tensors
        .iter()
        .map(|(n, t)| {
            Ok((
                n.clone(),
                Host {
                    dtype: st_dtype(t.dtype()),
                    shape: t.shape().to_vec(),
                    data: host_bytes(t)?,
                },
            ))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize(host.iter().map(|(n, h)| (n.as_str(), h)), metadata)
        .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
}

pub(crate) fn open(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the map is read-only and dropped before this function's callers return; a file
    // truncated underneath us would fault, as with any mapped read (documented in load()).
    Ok(unsafe { memmap2::Mmap::map(&file)? })
}

pub(crate) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes)
        .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
}

/// Reads every tensor of a safetensors file onto `dev` in the dtype it is stored in (f32, f16,
/// bf16 and u32 tensors). The file is memory-mapped, so it is not copied into a buffer first.
pub fn load(dev: &Device, path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    load_impl(dev, path.as_ref(), None)
}

/// Like [`load`], with every float tensor converted to `dtype` on the device (a bf16
/// checkpoint into an f16 or f32 model); u32 tensors stay u32.
pub fn load_as(
    dev: &Device,
    path: impl AsRef<Path>,
    dtype: DType,
) -> Result<Vec<(String, Tensor)>> {
    if !dtype.is_float() {
        return Err(Error::invalid(
            "load_as",
            format!("converts float tensors to a float dtype, not {dtype}"),
        ));
    }
    load_impl(dev, path.as_ref(), Some(dtype))
}

fn load_impl(dev: &Device, path: &Path, to: Option<DType>) -> Result<Vec<(String, Tensor)>> {
    let map = open(path)?;
    let st = parse(path, &map)?;
    let mut names: Vec<&str> = st.names();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let v = st
                .tensor(name)
                .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
            let dt = our_dtype(path, name, v.dtype())?;
            let t = Tensor::uninit(dev, v.shape(), dt)?;
            t.write_bytes(v.data())?;
            match to {
                Some(d) if dt.is_float() && d != dt => Ok((
                    name.to_string(),
                    crate::autograd::no_grad(|| t.to_dtype(d))?,
                )),
                _ => Ok((name.to_string(), t)),
            }
        })
        .collect()
}

/// Copies weights from a safetensors file into a module's parameters and buffers
/// ([`Module::state_dict`]), by name. A tensor the
/// module has but the file lacks, or one of another shape or dtype, is an error naming it;
/// nothing is written unless every parameter matches. To load a checkpoint stored in another
/// float dtype (a bf16 file into an f32 model), use [`load_into_converting`].
pub fn load_into(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let map = open(path)?;
    let st = parse(path, &map)?;
    write_named(path, &st, &module.state_dict(), false)
}

/// Like [`load_into`], converting float tensors to each parameter's dtype on the device
/// (rounding to nearest even where the parameter's dtype is narrower).
pub fn load_into_converting(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let map = open(path)?;
    let st = parse(path, &map)?;
    write_named(path, &st, &module.state_dict(), true)
}

/// Copies the file's tensor `name` into each `(name, tensor)` pair: all are checked (present,
/// same shape, same dtype or, with `convert`, both float) before any is written.
pub(crate) fn write_named(
    path: &Path,
    st: &SafeTensors<'_>,
    targets: &[(String, Tensor)],
    convert: bool,
) -> Result<()> {
    let file = path.display().to_string();
    let mut views = Vec::with_capacity(targets.len());
    for (name, p) in targets {
        let v = st
            .tensor(name)
            .map_err(|_| Error::format(file.clone(), format!("tensor {name} is missing")))?;
        if v.shape() != p.shape() {
            return Err(Error::format(
                file.clone(),
                format!(
                    "tensor {name} has shape {:?}, the model expects {:?}",
                    v.shape(),
                    p.shape()
                ),
            ));
        }
        let dt = our_dtype(path, name, v.dtype())?;
        if dt != p.dtype() && !(convert && dt.is_float() && p.dtype().is_float()) {
            return Err(Error::format(
                file.clone(),
                format!("tensor {name} is {dt}, the model expects {}", p.dtype()),
            ));
        }
        views.push(v);
    }
    for ((_, p), v) in targets.iter().zip(views) {
        let dt = our_dtype(path, "", v.dtype())?;
        if dt == p.dtype() {
            p.write_bytes(v.data())?;
        } else {
            let t = Tensor::uninit(p.device(), v.shape(), dt)?;
            t.write_bytes(v.data())?;
            p.assign_cast(&t)?;
        }
    }
    Ok(())
}
