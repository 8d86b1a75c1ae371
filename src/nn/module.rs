//! The layer trait and sequential composition.

use crate::error::Result;
use crate::tensor::Tensor;

/// A layer or model.
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

/// Prefixes parameter names (for layers built from other layers).
pub(crate) fn prefixed(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}
