//! A Llama-family decoder: token embedding, blocks of (RMSNorm, grouped-query attention
//! with rotary embeddings, RMSNorm, SwiGLU MLP) with residual connections, a final RMSNorm
//! and the output head (the embedding's transpose when tied), run over a [`KvCache`].
//!
//! Every step appends tokens to some rows of the cache: a prompt's prefill appends all its
//! tokens to its row, a decode step one token to every row. Positions come from each row's
//! length, so prompts of different lengths decode together.

use super::cache::KvCache;
use super::config::LlamaConfig;
use super::lora::Lora;
use super::weights::Weights;
use crate::autograd::no_grad;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kernels::decode::{self as kd, Step};
use crate::quant::{Fusion, QuantMatrix};
use crate::tensor::Tensor;
use std::path::Path;
use std::sync::Arc;

/// A [out, in] weight of a product: dense, or in its quantized block format.
pub(crate) enum Matrix {
    Dense(Tensor),
    Quant(QuantMatrix),
}

impl Matrix {
    /// `x W^T`.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => x.linear(w, None),
            Matrix::Quant(q) => q.forward(x),
        }
    }

    /// `res + x W^T`.
    fn apply_add(&self, x: &Tensor, res: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => res.add(&x.linear(w, None)?),
            Matrix::Quant(q) => q.forward_add(x, res),
        }
    }

    /// `rms_norm(x, gain, eps) W^T`, one kernel for a quantized matrix and a few rows.
    fn apply_norm(&self, x: &Tensor, gain: &Tensor, eps: f32) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => x.rms_norm(gain, eps)?.linear(w, None),
            Matrix::Quant(q) => q.forward_with(
                x,
                Fusion {
                    norm: Some((gain, eps)),
                    ..Fusion::default()
                },
            ),
        }
    }

    /// SwiGLU of the normalised x through the [gate; up] rows: `silu(n G^T) * (n U^T)` with
    /// `n = rms_norm(x, gain, eps)`.
    fn apply_swiglu(&self, x: &Tensor, gain: &Tensor, eps: f32) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => x.rms_norm(gain, eps)?.linear(w, None)?.swiglu_halves(),
            Matrix::Quant(q) => q.forward_with(
                x,
                Fusion {
                    norm: Some((gain, eps)),
                    glu: true,
                    ..Fusion::default()
                },
            ),
        }
    }

    /// Rows `ids` (an embedding lookup), in `dtype`.
    fn rows(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => w.embedding(ids),
            Matrix::Quant(q) => q.embedding(ids, dtype),
        }
    }

    fn nbytes(&self) -> u64 {
        match self {
            Matrix::Dense(w) => w.nbytes(),
            Matrix::Quant(q) => q.nbytes(),
        }
    }
}

/// One decoder block's weights. The query, key and value projections are one matrix (their
/// rows stacked in that order), and so are the gate and up projections: one product each.
struct Block {
    attn_norm: Tensor,
    qkv: Matrix,
    o: Matrix,
    mlp_norm: Tensor,
    gate_up: Matrix,
    down: Matrix,
}

/// A Llama-family model on a device, ready to run.
pub struct Llama {
    config: LlamaConfig,
    dtype: DType,
    embed: Matrix,
    blocks: Vec<Arc<Block>>,
    norm: Tensor,
    /// `None` when tied to the embedding.
    head: Option<Matrix>,
    /// LoRA adapters on some projections ([`Llama::add_lora`]).
    lora: Option<Arc<Lora>>,
    /// Whether [`Llama::forward_train`] recomputes each block in the backward pass.
    checkpointing: bool,
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

/// One decoder block on `x` [n, t, hidden] (at rotation angles `cos`, `sin`), with layer
/// `l`'s adapters when there are any (their dropout on when `train`); `attend` runs
/// attention on the rotated heads.
#[allow(clippy::too_many_arguments)]
fn block_pass(
    c: &LlamaConfig,
    lora: Option<&Lora>,
    train: bool,
    l: usize,
    b: &Block,
    x: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    attend: &mut dyn FnMut(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (n, t) = (x.shape()[0], x.shape()[1]);
    let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    // A projection's slice of a stacked product, plus its adapter's update.
    let part = |y: &Tensor, at: usize, len: usize, input: &Tensor, name: &str| -> Result<Tensor> {
        let y = y.narrow(-1, at, len)?;
        match lora
            .map(|a| a.delta(l, name, input, train))
            .transpose()?
            .flatten()
        {
            Some(d) => y.add(&d),
            None => Ok(y),
        }
    };
    let (q, k, v) = match lora {
        None => {
            let qkv = b.qkv.apply_norm(x, &b.attn_norm, c.rms_eps)?;
            (
                qkv.narrow(-1, 0, qd)?,
                qkv.narrow(-1, qd, kvd)?,
                qkv.narrow(-1, qd + kvd, kvd)?,
            )
        }
        Some(_) => {
            let hn = x.rms_norm(&b.attn_norm, c.rms_eps)?;
            let qkv = b.qkv.apply(&hn)?;
            (
                part(&qkv, 0, qd, &hn, "q_proj")?,
                part(&qkv, qd, kvd, &hn, "k_proj")?,
                part(&qkv, qd + kvd, kvd, &hn, "v_proj")?,
            )
        }
    };
    let heads = |y: &Tensor, heads: usize| -> Result<Tensor> {
        y.reshape(&[n, t, heads, c.head_dim])?
            .permute(&[0, 2, 1, 3])
    };
    let q = rotate(&heads(&q, c.heads)?, cos, sin)?;
    let k = rotate(&heads(&k, c.kv_heads)?, cos, sin)?;
    let v = heads(&v, c.kv_heads)?;
    let att = attend(&q, &k, &v)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[n, t, qd])?;
    let Some(_) = lora else {
        let x = b.o.apply_add(&att, x)?;
        let act = b.gate_up.apply_swiglu(&x, &b.mlp_norm, c.rms_eps)?;
        return b.down.apply_add(&act, &x);
    };
    let x = x.add(&part(&b.o.apply(&att)?, 0, c.hidden, &att, "o_proj")?)?;
    let hn = x.rms_norm(&b.mlp_norm, c.rms_eps)?;
    let gu = b.gate_up.apply(&hn)?;
    let i = c.intermediate;
    let gate = part(&gu, 0, i, &hn, "gate_proj")?;
    let up = part(&gu, i, i, &hn, "up_proj")?;
    let act = gate.silu()?.mul(&up)?;
    x.add(&part(&b.down.apply(&act)?, 0, c.hidden, &act, "down_proj")?)
}

impl Llama {
    /// Loads a model from a GGUF file, activations in `dtype` (f32, f16 or bf16). Matrices
    /// in Q4_0, Q4_1 or Q8_0 stay in their block format on the device
    /// ([`QuantMatrix`]); the others, and the norms, are decoded to `dtype`.
    pub fn from_gguf(dev: &Device, path: impl AsRef<Path>, dtype: DType) -> Result<Llama> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        Llama::load(dev, config, &Weights::gguf(file, true), dtype)
    }

    /// [`from_gguf`](Llama::from_gguf) with every weight decoded to `dtype`: more memory,
    /// the dense products' speed for long prompts.
    pub fn from_gguf_decoded(dev: &Device, path: impl AsRef<Path>, dtype: DType) -> Result<Llama> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        Llama::load(dev, config, &Weights::gguf(file, false), dtype)
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
        let mat = |name: &str, shape: &[usize]| {
            w.load_matrix(dev, &[(name, shape[0])], shape[1], dtype, c)
        };
        let blocks = (0..c.layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}.weight");
                let (q, k, v) = (
                    p("self_attn.q_proj"),
                    p("self_attn.k_proj"),
                    p("self_attn.v_proj"),
                );
                let (gate, up) = (p("mlp.gate_proj"), p("mlp.up_proj"));
                Ok(Arc::new(Block {
                    attn_norm: get(&p("input_layernorm"), &[h])?,
                    qkv: w.load_matrix(
                        dev,
                        &[(&q, q_out), (&k, kv_out), (&v, kv_out)],
                        h,
                        dtype,
                        c,
                    )?,
                    o: mat(&p("self_attn.o_proj"), &[h, q_out])?,
                    mlp_norm: get(&p("post_attention_layernorm"), &[h])?,
                    gate_up: w.load_matrix(
                        dev,
                        &[(&gate, c.intermediate), (&up, c.intermediate)],
                        h,
                        dtype,
                        c,
                    )?,
                    down: mat(&p("mlp.down_proj"), &[h, c.intermediate])?,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = mat("model.embed_tokens.weight", &[c.vocab, h])?;
        let head = if c.tie_embeddings && !w.has("lm_head.weight") {
            None
        } else {
            Some(mat("lm_head.weight", &[c.vocab, h])?)
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
            lora: None,
            checkpointing: false,
            cos,
            sin,
        })
    }

    /// Adds new LoRA adapters (replacing any): see [`LoraConfig`](super::LoraConfig). The
    /// decode step then takes the unfused path, which applies them.
    pub fn add_lora(&mut self, config: super::LoraConfig) -> Result<()> {
        self.lora = Some(Arc::new(Lora::new(
            self.device(),
            &self.config,
            config,
            self.dtype,
        )?));
        Ok(())
    }

    /// Loads adapters that Hugging Face's peft saved (`adapter_config.json` and
    /// `adapter_model.safetensors` in `dir`), replacing any. A shape that does not fit the
    /// model is an error naming the tensor and both shapes.
    pub fn load_lora(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        self.lora = Some(Arc::new(Lora::load(
            self.device(),
            &self.config,
            dir.as_ref(),
            self.dtype,
        )?));
        Ok(())
    }

    /// Saves the adapters as peft does, for `PeftModel.from_pretrained` (`base` is written
    /// as the base model's name).
    pub fn save_lora(&self, dir: impl AsRef<Path>, base: &str) -> Result<()> {
        match &self.lora {
            Some(l) => l.save(&self.config, dir.as_ref(), base),
            None => Err(Error::invalid(
                "Llama::save_lora",
                "the model has no adapters",
            )),
        }
    }

    /// The adapters' parameters under peft's names (empty without adapters): what an
    /// optimizer trains.
    pub fn lora_params(&self) -> Vec<(String, Tensor)> {
        self.lora
            .as_ref()
            .map_or_else(Vec::new, |l| l.params(&self.config))
    }

    /// Removes the adapters.
    pub fn remove_lora(&mut self) {
        self.lora = None;
    }

    /// Keeps the first `blocks` decoder blocks and drops the rest, whose weights are freed:
    /// a shallower model over the same embedding, norm and head (for quick fine-tuning runs
    /// and tests on a CPU adapter). Adapters must be added after it.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_llama");
    /// let mut model = wgrad::llm::Llama::from_hf(&dev, dir, wgrad::DType::F32)?;
    /// let before = model.weight_bytes();
    /// model.truncate(1)?;
    /// assert_eq!(model.config().layers, 1);
    /// assert!(model.weight_bytes() < before);
    /// # Ok(())
    /// # }
    /// ```
    pub fn truncate(&mut self, blocks: usize) -> Result<()> {
        let op = "Llama::truncate";
        if blocks == 0 || blocks > self.blocks.len() {
            return Err(Error::invalid(
                op,
                format!("{blocks} blocks of a model of {}", self.blocks.len()),
            ));
        }
        if self.lora.is_some() {
            return Err(Error::invalid(
                op,
                "the model has adapters: truncate it before adding them",
            ));
        }
        self.blocks.truncate(blocks);
        self.config.layers = blocks;
        Ok(())
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
        self.norm.device()
    }

    /// Bytes of the weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        let mut n = self.embed.nbytes() + self.norm.nbytes();
        n += self.head.as_ref().map_or(0, Matrix::nbytes);
        for b in &self.blocks {
            n += b.attn_norm.nbytes() + b.mlp_norm.nbytes();
            for m in [&b.qkv, &b.o, &b.gate_up, &b.down] {
                n += m.nbytes();
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

    /// One decode step: one new token in each of `rows`, the logits [n, vocab] (f32). Six
    /// launches a block: the norm fused into the q/k/v product, the rotary embedding with the
    /// cache write, attention over the cache, the output product with the residual, the norm
    /// fused into the gate/up product with SwiGLU, the down product with the residual.
    fn step(&self, tokens: &Tensor, cache: &mut KvCache, rows: &[usize]) -> Result<Tensor> {
        let op = "Llama decode step";
        let (c, dev, dtype) = (&self.config, self.device(), self.dtype);
        let n = rows.len();
        // Each row's position (its length before the step), then its cache row.
        let mut ps: Vec<u32> = rows.iter().map(|&r| cache.len(r) as u32).collect();
        ps.extend(rows.iter().map(|&r| r as u32));
        let max_len = rows.iter().map(|&r| cache.len(r) + 1).max().unwrap_or(1);
        let ps = Tensor::from_slice(dev, &ps, &[2 * n])?;
        let st = Step {
            n,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            cap: cache.capacity(),
        };
        let width = c.heads * c.head_dim;
        let mut x = self.embed.rows(tokens, dtype)?;
        for (l, b) in self.blocks.iter().enumerate() {
            let qkv = b
                .qkv
                .apply_norm(&x, &b.attn_norm, c.rms_eps)?
                .contiguous()?;
            let q = Tensor::uninit(dev, &[n, width], dtype)?;
            let (keys, values) = (&cache.keys[l], &cache.values[l]);
            kd::rope_write(
                dev,
                st,
                qkv.dense_block(op)?,
                self.cos.dense_block(op)?,
                self.sin.dense_block(op)?,
                ps.dense_block(op)?,
                q.dense_block(op)?,
                keys.dense_block(op)?,
                values.dense_block(op)?,
                dtype,
            )?;
            let att = Tensor::uninit(dev, &[n, 1, width], dtype)?;
            kd::attend(
                dev,
                st,
                q.dense_block(op)?,
                keys.dense_block(op)?,
                values.dense_block(op)?,
                ps.dense_block(op)?,
                att.dense_block(op)?,
                dtype,
                max_len,
            )?;
            x = b.o.apply_add(&att, &x)?;
            let act = b.gate_up.apply_swiglu(&x, &b.mlp_norm, c.rms_eps)?;
            x = b.down.apply_add(&act, &x)?;
        }
        cache.advance(rows, 1);
        let head = self.head.as_ref().unwrap_or(&self.embed);
        head.apply_norm(&x.reshape(&[n, c.hidden])?, &self.norm, c.rms_eps)?
            .to_dtype(DType::F32)
    }

    /// One block over `x` [n, t, hidden]: attention through `attend` (q [n, heads, t, d], k
    /// and v [n, kv_heads, t, d], rotated; it returns [n, heads, t, d]), the MLP, the
    /// residuals, and the LoRA adapters where the model has them.
    /// Logits (f32, [n, t, vocab]) of `tokens` (u32 [n, t]) from position 0, without a cache
    /// and with the graph recorded: the training pass. Gradients flow to the LoRA adapters
    /// ([`Llama::add_lora`]); the base weights are constants. For training,
    /// [`Llama::loss`] gives the same loss without holding every position's logits.
    pub fn forward_train(&self, tokens: &Tensor) -> Result<Tensor> {
        let x = self.hidden_train("Llama::forward_train", tokens)?;
        self.head_matrix().apply(&x)?.to_dtype(DType::F32)
    }

    /// Mean next-token cross-entropy of `tokens` (u32 [n, t]) against `targets` (u32 [n, t],
    /// each position's next token), recorded for the backward pass like
    /// [`forward_train`](Llama::forward_train). The output layer and the loss run as one
    /// chunked op ([`Tensor::linear_cross_entropy`]): the f32 logits of every position, and
    /// their gradient, are never held (for SmolLM2's vocabulary of 49,152, 96 MiB each at
    /// 512 positions).
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// use wgrad::llm::{Llama, LoraConfig};
    /// use wgrad::{DType, Device, Tensor};
    /// let dev = Device::new()?;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_llama");
    /// let mut model = Llama::from_hf(&dev, dir, DType::F32)?;
    /// model.add_lora(LoraConfig::new(4, 8.0, &["q_proj", "v_proj"]))?;
    /// let x = Tensor::from_slice(&dev, &[1u32, 5, 9, 2], &[1, 4])?;
    /// let y = Tensor::from_slice(&dev, &[5u32, 9, 2, 7], &[1, 4])?;
    /// let loss = model.loss(&x, &y)?;
    /// loss.backward()?; // gradients reach the adapters
    /// assert!(model.lora_params().iter().all(|(_, p)| p.grad().is_some()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let op = "Llama::loss";
        if targets.dtype() != DType::U32 || targets.shape() != tokens.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "targets {:?} {} for tokens {:?}: want u32 of the tokens' shape",
                    targets.shape(),
                    targets.dtype(),
                    tokens.shape()
                ),
            ));
        }
        let x = self.hidden_train(op, tokens)?;
        let rows = tokens.numel();
        let x = x.reshape(&[rows, self.config.hidden])?;
        let targets = targets.reshape(&[rows])?;
        match self.head_matrix() {
            Matrix::Dense(w) => x.linear_cross_entropy(w, &targets),
            // Decoded for the one op and dropped after it: the op's forward pass makes the
            // input gradient, so the backward pass needs no matrix.
            Matrix::Quant(q) => x.linear_cross_entropy(&q.dequantize(self.dtype)?, &targets),
        }
    }

    /// Whether [`forward_train`](Llama::forward_train) and [`loss`](Llama::loss) keep only
    /// each block's input and recompute the block in the backward pass (gradient
    /// checkpointing): the activations of one block at a time instead of all of them, for
    /// about one more forward pass of compute.
    pub fn set_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// The output layer: the head, or the embedding when they are tied.
    fn head_matrix(&self) -> &Matrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    /// The final-normalised hidden states [n, t, hidden] of `tokens` from position 0, with
    /// the graph recorded: the training pass up to the output layer.
    fn hidden_train(&self, op: &'static str, tokens: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        if tokens.dtype() != DType::U32 || tokens.rank() != 2 {
            return Err(Error::shape(
                op,
                format!(
                    "tokens {:?} {}: want u32 [sequences, positions]",
                    tokens.shape(),
                    tokens.dtype()
                ),
            ));
        }
        let t = tokens.shape()[1];
        if t == 0 || t > c.max_position {
            return Err(Error::shape(
                op,
                format!("{t} positions for a context of {}", c.max_position),
            ));
        }
        let half = c.head_dim / 2;
        let angles = |table: &Tensor| -> Result<Tensor> {
            table
                .narrow(0, 0, t)?
                .reshape(&[1, 1, t, half])?
                .to_dtype(self.dtype)
        };
        let (cos, sin) = (angles(&self.cos)?, angles(&self.sin)?);
        let mut x = self.embed.rows(tokens, self.dtype)?;
        // Decided once: a checkpointed block runs first without recording, then again with.
        let train = crate::autograd::is_grad_enabled();
        for (l, b) in self.blocks.iter().enumerate() {
            let (cfg, lora, b) = (self.config.clone(), self.lora.clone(), b.clone());
            let (cos, sin) = (cos.clone(), sin.clone());
            let segment = move |x: &Tensor| {
                block_pass(
                    &cfg,
                    lora.as_deref(),
                    train,
                    l,
                    &b,
                    x,
                    (&cos, &sin),
                    &mut |q, k, v| Tensor::attention(q, k, v, true, None),
                )
            };
            x = if self.checkpointing {
                crate::autograd::checkpoint(Arc::new(segment), &x)?
            } else {
                segment(&x)?
            };
        }
        x.rms_norm(&self.norm, c.rms_eps)
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
        if rows.iter().enumerate().any(|(i, r)| rows[..i].contains(r)) {
            return Err(Error::invalid(
                op,
                format!("rows {rows:?} name a cache row twice"),
            ));
        }
        let want = [c.kv_heads, cache.capacity(), c.head_dim];
        let Some(k0) = cache.keys.first() else {
            return Err(Error::invalid(op, "the cache has no layers"));
        };
        if k0.dtype() != self.dtype || k0.shape()[1..] != want {
            return Err(Error::invalid(
                op,
                format!(
                    "a cache of {:?} {} for a model of {} key/value heads of {} in {}",
                    k0.shape(),
                    k0.dtype(),
                    c.kv_heads,
                    c.head_dim,
                    self.dtype
                ),
            ));
        }
        if t == 1 && kd::supports(c.heads, c.kv_heads, c.head_dim) && self.lora.is_none() {
            return no_grad(|| {
                let logits = self.step(tokens, cache, rows)?;
                if last_only {
                    Ok(logits)
                } else {
                    logits.reshape(&[n, 1, c.vocab])
                }
            });
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
            let mut x = self.embed.rows(tokens, self.dtype)?;
            for (l, b) in self.blocks.iter().enumerate() {
                let mut attend = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
                    let mut outs = Vec::with_capacity(n);
                    for (i, &r) in rows.iter().enumerate() {
                        let one = |x: &Tensor| x.narrow(0, i, 1)?.squeeze(0);
                        cache.write(l, r, &one(k)?, &one(v)?)?;
                        let (kc, vc) = cache.prefix(l, r, cache.len(r) + t)?;
                        outs.push(Tensor::attention(
                            &q.narrow(0, i, 1)?,
                            &kc,
                            &vc,
                            true,
                            None,
                        )?);
                    }
                    if n == 1 {
                        Ok(outs.remove(0))
                    } else {
                        Tensor::cat(&outs.iter().collect::<Vec<_>>(), 0)
                    }
                };
                x = block_pass(
                    &self.config,
                    self.lora.as_deref(),
                    false,
                    l,
                    b,
                    &x,
                    (&cos, &sin),
                    &mut attend,
                )?;
            }
            cache.advance(rows, t);
            let x = if last_only {
                x.narrow(1, t - 1, 1)?.squeeze(1)?
            } else {
                x
            };
            let head = self.head.as_ref().unwrap_or(&self.embed);
            head.apply_norm(&x, &self.norm, c.rms_eps)?
                .to_dtype(DType::F32)
        })
    }
}
