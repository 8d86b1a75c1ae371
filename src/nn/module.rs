//! The layer trait and sequential composition.

use crate::error::Result;
use crate::tensor::Tensor;

/// A layer or model.
///
/// A model is a module built from modules; its parameters are named by where they sit
/// (`fc1.weight`), which is what weight files and checkpoints use.
///
/// ```
/// use wgrad::nn::{BatchNorm2d, Module};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let bn = BatchNorm2d::new(&dev, 3, wgrad::DType::F32)?;
/// let names = |v: Vec<(String, wgrad::Tensor)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
/// assert_eq!(names(bn.params()), ["weight", "bias"]); // trained
/// assert_eq!(names(bn.buffers()), ["running_mean", "running_var"]); // kept, not trained
/// assert_eq!(names(bn.state_dict()).len(), 4); // both: what a weight file holds
/// bn.train(false); // evaluation: the running statistics, not the batch's
/// # Ok(())
/// # }
/// ```
pub trait Module: Send + Sync {
    /// Applies the layer.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Named parameters, in a stable order (names are what weight files use).
    fn params(&self) -> Vec<(String, Tensor)>;
    /// Switches between training and evaluation behaviour (dropout, batch statistics).
    /// No-op by default.
    fn train(&self, _on: bool) {}
    /// Named state that is not trained but belongs in weight files (BatchNorm's running
    /// statistics). None by default.
    fn buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// Parameters then buffers: everything a weight file holds
    /// ([`save`](crate::nn::save) it; [`load_into`](crate::nn::load_into) reads both back).
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut v = self.params();
        v.extend(self.buffers());
        v
    }
}

/// Layers applied in order. Parameter names are `<layer name>.<parameter name>`.
///
/// ```
/// use wgrad::nn::{Activation, Linear, Module, Sequential};
/// use wgrad::DType;
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let mlp = Sequential::new()
///     .add("fc1", Linear::new(&dev, 4, 8, true, DType::F32)?)
///     .add("act", Activation::Relu)
///     .add("fc2", Linear::new(&dev, 8, 2, true, DType::F32)?);
/// assert_eq!(mlp.len(), 3);
/// let names: Vec<String> = mlp.params().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
/// let y = mlp.forward(&dev.randn(&[5, 4], DType::F32)?)?;
/// assert_eq!(y.shape(), [5, 2]);
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<(String, Box<dyn Module>)>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Self {
        Sequential::default()
    }

    /// Appends a layer under `name`.
    pub fn add(mut self, name: &str, layer: impl Module + 'static) -> Self {
        self.layers.push((name.to_string(), Box::new(layer)));
        self
    }

    /// Appends a boxed layer.
    pub fn push(&mut self, name: &str, layer: Box<dyn Module>) {
        self.layers.push((name.to_string(), layer));
    }

    /// The layers.
    pub fn layers(&self) -> impl Iterator<Item = (&str, &dyn Module)> {
        self.layers.iter().map(|(n, l)| (n.as_str(), l.as_ref()))
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (_, l) in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .flat_map(|(name, l)| {
                l.params()
                    .into_iter()
                    .map(move |(p, t)| (format!("{name}.{p}"), t))
            })
            .collect()
    }

    fn train(&self, on: bool) {
        self.layers.iter().for_each(|(_, l)| l.train(on));
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .flat_map(|(name, l)| prefixed(name, l.buffers()))
            .collect()
    }
}

/// A boxed module is a module, so wrappers such as
/// [`Checkpointed`](crate::nn::Checkpointed) take layers chosen at run time.
impl Module for Box<dyn Module> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        (**self).params()
    }
    fn train(&self, on: bool) {
        (**self).train(on)
    }
    fn buffers(&self) -> Vec<(String, Tensor)> {
        (**self).buffers()
    }
}

/// Prefixes parameter names with `prefix.`: a module built from other modules names its
/// parameters as `<field>.<name>` with it, as PyTorch's `state_dict` does.
///
/// ```
/// # fn main() -> wgrad::Result<()> {
/// use wgrad::nn::{Linear, Module, prefixed};
/// let dev = wgrad::Device::new()?;
/// let fc = Linear::new(&dev, 4, 2, true, wgrad::DType::F32)?;
/// let names: Vec<String> = prefixed("fc1", fc.params()).into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, vec!["fc1.weight", "fc1.bias"]);
/// # Ok(())
/// # }
/// ```
pub fn prefixed(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

/// Freezes the parameters of `module` whose names match `pattern` (`*` for any run of
/// characters; `"*"` freezes the whole module) and returns how many it froze. A frozen
/// parameter gets no gradient and optimizers made afterwards keep no state for it (see
/// [`Tensor::freeze`]); weight files still hold it.
///
/// ```
/// use wgrad::nn::{self, Linear, Module, Sequential};
/// use wgrad::DType;
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let model = Sequential::new()
///     .add("body", Linear::new(&dev, 4, 4, true, DType::F32)?)
///     .add("head", Linear::new(&dev, 4, 2, true, DType::F32)?);
/// assert_eq!(nn::freeze(&model, "body.*"), 2); // weight and bias
/// let x = dev.randn(&[3, 4], DType::F32)?;
/// model.forward(&x)?.sum_all()?.backward()?;
/// for (name, p) in model.params() {
///     assert_eq!(p.grad().is_some(), name.starts_with("head"), "{name}");
/// }
/// # Ok(())
/// # }
/// ```
pub fn freeze(module: &dyn Module, pattern: &str) -> usize {
    let mut n = 0;
    for (name, p) in module.params() {
        if crate::names::matches(pattern, &name) && !p.is_frozen() {
            p.freeze();
            n += 1;
        }
    }
    n
}

/// Undoes [`freeze`] for the parameters whose names match `pattern`; returns how many.
pub fn unfreeze(module: &dyn Module, pattern: &str) -> usize {
    let mut n = 0;
    for (name, p) in module.params() {
        if crate::names::matches(pattern, &name) && p.is_frozen() {
            p.unfreeze();
            n += 1;
        }
    }
    n
}
