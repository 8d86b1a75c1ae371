//! A Llama-family decoder: token embedding, blocks of (RMSNorm, grouped-query attention
//! with rotary embeddings, RMSNorm, SwiGLU MLP) with residual connections, a final RMSNorm
//! and the output head (the embedding's transpose when tied), run over a [`KvCache`].
//!
//! Every step appends tokens to some rows of the cache: a prompt's prefill appends all its
//! tokens to its row, a decode step one token to every row. Positions come from each row's
//! length, so prompts of different lengths decode together.

use super::cache::KvCache;
use super::config::LlamaConfig;
use super::weights::Weights;
use crate::autograd::no_grad;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tensor::Tensor;
use std::path::Path;

/// One decoder block's weights, under Hugging Face's names (`q_proj` ...).
struct Block {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    mlp_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A Llama-family model on a device, ready to run.
pub struct Llama {
    config: LlamaConfig,
    dtype: DType,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    /// `None` when tied to the embedding.
    head: Option<Tensor>,
    /// cos and sin of every position's rotation angles, [max_position, head_dim / 2], f32.
    cos: Tensor,
    sin: Tensor,
}

/// The rotary embedding's tables: angle `p * theta^(-2i / d)` for position p and pair i.
fn rope_tables(dev: &Device, cfg: &LlamaConfig) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let n = cfg.max_position;
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for i in 0..half {
            // Computed in f64 and rounded once: the tables are exact to f32 at every position.
            let freq = (cfg.rope_theta as f64).powf(-2.0 * i as f64 / cfg.head_dim as f64);
            let angle = p as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    Ok((
        Tensor::from_slice(dev, &cos, &[n, half])?,
        Tensor::from_slice(dev, &sin, &[n, half])?,
    ))
}

/// `x` [n, heads, t, d] rotated by the angles `cos`, `sin` [n, 1, t, d / 2]: the first and
/// second halves of each head are the pairs (Hugging Face's `rotate_half` convention).
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.shape()[3];
    let (a, b) = (x.narrow(3, 0, d / 2)?, x.narrow(3, d / 2, d / 2)?);
    let first = a.mul(cos)?.sub(&b.mul(sin)?)?;
    let second = b.mul(cos)?.add(&a.mul(sin)?)?;
    Tensor::cat(&[&first, &second], 3)
}

impl Llama {
    /// Loads a model from a GGUF file, its weights decoded to `dtype` (f32, f16 or bf16).
    pub fn from_gguf(dev: &Device, path: impl AsRef<Path>, dtype: DType) -> Result<Llama> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        Llama::load(dev, config, &Weights::gguf(file), dtype)
    }

    /// Loads a Hugging Face checkpoint directory (`config.json` and `model.safetensors` or
    /// its shards), its weights converted to `dtype`.
    pub fn from_hf(dev: &Device, dir: impl AsRef<Path>, dtype: DType) -> Result<Llama> {
        let dir = dir.as_ref();
        let config = LlamaConfig::from_hf_json(dir.join("config.json"))?;
        Llama::load(dev, config, &Weights::hf(dir)?, dtype)
    }

    fn load(dev: &Device, config: LlamaConfig, w: &Weights, dtype: DType) -> Result<Llama> {
        if !dtype.is_float() {
            return Err(Error::invalid(
                "Llama",
                format!("weights run in a float dtype, not {dtype}"),
            ));
        }
        let c = &config;
        let (h, q_out, kv_out) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let get = |name: &str, shape: &[usize]| w.load(dev, name, shape, dtype, c);
        let blocks = (0..c.layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}.weight");
                Ok(Block {
                    attn_norm: get(&p("input_layernorm"), &[h])?,
                    q: get(&p("self_attn.q_proj"), &[q_out, h])?,
                    k: get(&p("self_attn.k_proj"), &[kv_out, h])?,
                    v: get(&p("self_attn.v_proj"), &[kv_out, h])?,
                    o: get(&p("self_attn.o_proj"), &[h, q_out])?,
                    mlp_norm: get(&p("post_attention_layernorm"), &[h])?,
                    gate: get(&p("mlp.gate_proj"), &[c.intermediate, h])?,
                    up: get(&p("mlp.up_proj"), &[c.intermediate, h])?,
                    down: get(&p("mlp.down_proj"), &[h, c.intermediate])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = get("model.embed_tokens.weight", &[c.vocab, h])?;
        let head = if c.tie_embeddings && !w.has("lm_head.weight") {
            None
        } else {
            Some(get("lm_head.weight", &[c.vocab, h])?)
        };
        let norm = get("model.norm.weight", &[h])?;
        let (cos, sin) = rope_tables(dev, c)?;
        Ok(Llama {
            config,
            dtype,
            embed,
            blocks,
            norm,
            head,
            cos,
            sin,
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The dtype the weights and activations run in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights are on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// Bytes of the weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        let mut n = self.embed.nbytes() + self.norm.nbytes();
        n += self.head.as_ref().map_or(0, Tensor::nbytes);
        for b in &self.blocks {
            for t in [
                &b.attn_norm,
                &b.q,
                &b.k,
                &b.v,
                &b.o,
                &b.mlp_norm,
                &b.gate,
                &b.up,
                &b.down,
            ] {
                n += t.nbytes();
            }
        }
        n
    }

    /// A cache for `batch` sequences of up to `capacity` positions (at most the model's
    /// context).
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let c = &self.config;
        if capacity > c.max_position {
            return Err(Error::invalid(
                "Llama::new_cache",
                format!(
                    "{capacity} positions is longer than the model's context of {}",
                    c.max_position
                ),
            ));
        }
        KvCache::new(
            self.device(),
            c.layers,
            batch,
            c.kv_heads,
            capacity,
            c.head_dim,
            self.dtype,
        )
    }

    /// Runs `tokens` (u32 [n, t]) as the next `t` positions of cache rows `rows` (n of
    /// them) and returns the logits (f32): of every new position, [n, t, vocab], or with
    /// `last_only` of the last, [n, vocab]. No gradients are recorded.
    pub fn forward(
        &self,
        tokens: &Tensor,
        cache: &mut KvCache,
        rows: &[usize],
        last_only: bool,
    ) -> Result<Tensor> {
        let op = "Llama::forward";
        let c = &self.config;
        if tokens.dtype() != DType::U32 || tokens.rank() != 2 || tokens.shape()[0] != rows.len() {
            return Err(Error::shape(
                op,
                format!(
                    "tokens {:?} {} for {} rows: want u32 [rows, new positions]",
                    tokens.shape(),
                    tokens.dtype(),
                    rows.len()
                ),
            ));
        }
        let (n, t) = (rows.len(), tokens.shape()[1]);
        if t == 0 {
            return Err(Error::shape(op, "no new positions"));
        }
        cache.check(rows, t)?;
        if cache.batch() > 0 && cache.keys.len() != c.layers {
            return Err(Error::invalid(op, "the cache belongs to another model"));
        }
        no_grad(|| {
            // Positions: each row continues from its own length.
            let starts: Vec<usize> = rows.iter().map(|&r| cache.len(r)).collect();
            let pos: Vec<u32> = starts
                .iter()
                .flat_map(|&s| (0..t).map(move |i| (s + i) as u32))
                .collect();
            let pos = Tensor::from_slice(self.device(), &pos, &[n * t])?;
            let half = c.head_dim / 2;
            let angles = |table: &Tensor| -> Result<Tensor> {
                table
                    .index_select(0, &pos)?
                    .reshape(&[n, 1, t, half])?
                    .to_dtype(self.dtype)
            };
            let (cos, sin) = (angles(&self.cos)?, angles(&self.sin)?);
            let mut x = self.embed.embedding(tokens)?;
            for (l, b) in self.blocks.iter().enumerate() {
                let hn = x.rms_norm(&b.attn_norm, c.rms_eps)?;
                let heads = |w: &Tensor, heads: usize| -> Result<Tensor> {
                    hn.linear(w, None)?
                        .reshape(&[n, t, heads, c.head_dim])?
                        .permute(&[0, 2, 1, 3])
                };
                let q = rotate(&heads(&b.q, c.heads)?, &cos, &sin)?;
                let k = rotate(&heads(&b.k, c.kv_heads)?, &cos, &sin)?;
                let v = heads(&b.v, c.kv_heads)?;
                let mut outs = Vec::with_capacity(n);
                for (i, &r) in rows.iter().enumerate() {
                    let one = |x: &Tensor| x.narrow(0, i, 1)?.squeeze(0);
                    cache.write(l, r, &one(&k)?, &one(&v)?)?;
                    let (kc, vc) = cache.prefix(l, r, cache.len(r) + t)?;
                    outs.push(Tensor::attention(
                        &q.narrow(0, i, 1)?,
                        &kc,
                        &vc,
                        true,
                        None,
                    )?);
                }
                let att = if n == 1 {
                    outs.remove(0)
                } else {
                    let refs: Vec<&Tensor> = outs.iter().collect();
                    Tensor::cat(&refs, 0)?
                };
                let att = att
                    .permute(&[0, 2, 1, 3])?
                    .reshape(&[n, t, c.heads * c.head_dim])?;
                x = x.add(&att.linear(&b.o, None)?)?;
                let hn = x.rms_norm(&b.mlp_norm, c.rms_eps)?;
                let gate = hn.linear(&b.gate, None)?.silu()?;
                let up = hn.linear(&b.up, None)?;
                x = x.add(&gate.mul(&up)?.linear(&b.down, None)?)?;
            }
            cache.advance(rows, t);
            let x = if last_only {
                x.narrow(1, t - 1, 1)?.squeeze(1)?
            } else {
                x
            };
            let x = x.rms_norm(&self.norm, c.rms_eps)?;
            let head = self.head.as_ref().unwrap_or(&self.embed);
            x.linear(head, None)?.to_dtype(DType::F32)
        })
    }
}
