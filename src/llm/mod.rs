//! Published language models: load a Llama-family model from a GGUF file or a Hugging Face
//! checkpoint, run it over a key/value cache on the device, and sample from it.
//!
//! * [`LlamaConfig`]: the model's sizes, from GGUF metadata or `config.json`;
//! * [`Llama`]: the weights on the device and the forward pass over a [`KvCache`]. A GGUF
//!   file's Q4_0, Q4_1 and Q8_0 matrices stay in their block formats
//!   ([`QuantMatrix`](crate::quant::QuantMatrix)), and a decode step (one new token a
//!   sequence) runs in six launches a block: the norms, SwiGLU and residuals fused into the
//!   products, the rotary embedding with the cache write, attention over the cache split
//!   along it;
//! * [`LoraConfig`], [`Llama::add_lora`], [`Llama::load_lora`], [`Llama::save_lora`],
//!   [`Llama::loss`] and [`Llama::forward_train`]: LoRA adapters in peft's layout, trained on
//!   the model's frozen (and possibly quantized) weights, the output layer and loss in chunks,
//!   blocks optionally checkpointed ([`Llama::set_checkpointing`]);
//! * [`Sampling`] and [`sample`]: greedy, temperature, top-k and top-p sampling on the device,
//!   so a decode step reads back only the chosen token ids.
//! * [`Tokenizer`]: text to token ids and back, as transformers tokenizes for the same model
//!   (cargo feature `tokenizers`), and [`TextStream`] for text generated one id at a time;
//! * [`ChatTemplate`] and [`Message`]: a conversation rendered as the model's prompt text.

mod cache;
pub mod chat;
mod config;
mod lora;
mod model;
mod sample;
pub mod tokenizer;
mod weights;

pub use cache::KvCache;
pub use chat::{ChatTemplate, Message};
pub use config::LlamaConfig;
pub use lora::LoraConfig;
pub use model::Llama;
pub use sample::{Sampling, sample};
pub use tokenizer::{TextStream, Tokenizer};
