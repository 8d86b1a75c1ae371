//! Published language models: load a Llama-family model from a GGUF file or a Hugging Face
//! checkpoint, run it over a key/value cache on the device, and sample from it.
//!
//! * [`LlamaConfig`]: the model's sizes, from GGUF metadata or `config.json`;
//! * [`Llama`]: the weights on the device and the forward pass over a [`KvCache`];
//! * [`Sampling`] and [`sample`]: greedy, temperature, top-k and top-p sampling on the device,
//!   so a decode step reads back only the chosen token ids.

mod cache;
mod config;
mod model;
mod sample;
mod weights;

pub use cache::KvCache;
pub use config::LlamaConfig;
pub use model::Llama;
pub use sample::{Sampling, sample};
