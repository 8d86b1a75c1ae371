//! A GPT (a decoder-only transformer) over token ids, as nanoGPT builds it.
//!
//! ```text
//! ids [batch, seq] -> token embedding + position embedding -> dropout
//!     -> blocks: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))
//!     -> LayerNorm -> head (the token embedding's weights, transposed) -> logits [batch * seq, vocab]
//! ```
//!
//! Each block is wgrad's pre-norm [`TransformerBlock`]: causal multi-head attention in one
//! fused kernel (dropout on the attention weights inside it), then a 4x-wide MLP with GELU;
//! each branch's dropout is applied in the same pass as its residual add. The head shares the
//! token embedding's weights, so a vocabulary costs one matrix.
//!
//! Weights start as nanoGPT's: N(0, 0.02), biases zero, and the two projections that write
//! into the residual stream (attention output, MLP output) at 0.02 / sqrt(2 * layers), so the
//! stream's variance does not grow with depth (GPT-2's scheme). The logits are f32 whatever the
//! storage dtype, so the loss and sampling read full precision.
//!
//! `--checkpoint` wraps each block in [`Checkpointed`]: its activations are recomputed in the
//! backward pass instead of kept, trading compute for memory.

use wgrad::nn::{Checkpointed, Dropout, Embedding, LayerNorm, Linear, Module, TransformerBlock};
use wgrad::{DType, Device, Result, Tensor};

/// The shape of a GPT and how it stores and trains its weights.
#[derive(Clone, Debug)]
pub struct GptConfig {
    /// Distinct token ids.
    pub vocab: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block (divides `width`).
    pub heads: usize,
    /// Model width: embedding size and the residual stream's.
    pub width: usize,
    /// Longest sequence: rows of the position embedding.
    pub context: usize,
    /// Dropout probability on the embeddings, the attention weights and both residual branches.
    pub dropout: f32,
    /// Storage dtype of every weight.
    pub dtype: DType,
    /// Recompute each block's activations in the backward pass (less memory).
    pub checkpoint: bool,
}

/// The model; see the module documentation.
pub struct Gpt {
    tok: Embedding,
    pos: Embedding,
    /// Dropout on the summed embeddings.
    drop: Dropout,
    /// The blocks, each wrapped in `Checkpointed` where the config asks.
    blocks: Vec<Box<dyn Module>>,
    ln: LayerNorm,
    /// Longest sequence the position embedding covers.
    pub context: usize,
}

/// N(0, std) weights, as nanoGPT initialises them.
fn normal(dev: &Device, shape: &[usize], std: f32, dt: DType) -> Result<Tensor> {
    Ok(Tensor::randn(dev, shape, 0.0, std, dt)?.variable())
}

/// Redraws a linear layer's weights from N(0, std) and zeroes its bias.
fn reinit(dev: &Device, l: &mut Linear, std: f32) -> Result<()> {
    l.weight = normal(dev, l.weight.shape(), std, l.weight.dtype())?;
    if let Some(b) = &mut l.bias {
        *b = Tensor::zeros(dev, b.shape(), b.dtype())?.variable();
    }
    Ok(())
}

impl Gpt {
    /// A GPT with fresh weights drawn from `dev`'s generator (seed it first for a
    /// reproducible start).
    pub fn new(dev: &Device, c: &GptConfig) -> Result<Gpt> {
        let dt = c.dtype;
        let mut blocks = Vec::with_capacity(c.layers);
        // The residual projections' smaller std keeps the residual stream from growing with
        // depth.
        let proj = 0.02 / (2.0 * c.layers as f32).sqrt();
        for _ in 0..c.layers {
            let mut b = TransformerBlock::new(dev, c.width, c.heads, true, c.dropout, dt)?;
            reinit(dev, &mut b.attn.qkv, 0.02)?;
            reinit(dev, &mut b.attn.out, proj)?;
            reinit(dev, &mut b.fc1, 0.02)?;
            reinit(dev, &mut b.fc2, proj)?;
            blocks.push(if c.checkpoint {
                Box::new(Checkpointed::new(b)) as Box<dyn Module>
            } else {
                Box::new(b)
            });
        }
        Ok(Gpt {
            tok: Embedding {
                weight: normal(dev, &[c.vocab, c.width], 0.02, dt)?,
            },
            pos: Embedding {
                weight: normal(dev, &[c.context, c.width], 0.02, dt)?,
            },
            drop: Dropout::new(c.dropout),
            blocks,
            ln: LayerNorm::new(dev, c.width, dt)?,
            context: c.context,
        })
    }

    /// Logits [batch * seq, vocab] (f32) of token ids [batch, seq], seq <= context: row
    /// `i * seq + t` scores the token after position t of sequence i.
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor> {
        let (b, s) = (idx.shape()[0], idx.shape()[1]);
        let dev = idx.device();
        let positions: Vec<u32> = (0..s as u32).collect();
        let pos = self
            .pos
            .lookup(&Tensor::from_slice(dev, &positions, &[s])?)?;
        let mut x = self.drop.forward(&self.tok.lookup(idx)?.add(&pos)?)?;
        for blk in &self.blocks {
            x = blk.forward(&x)?;
        }
        let x = self.ln.forward(&x)?;
        // The head shares the token embedding's weights.
        let logits = x
            .reshape(&[b * s, x.shape()[2]])?
            .linear(&self.tok.weight, None)?;
        logits.to_dtype(DType::F32)
    }

    /// The mean cross-entropy of predicting `targets` (the next token of every position,
    /// [batch * seq] ids) from `idx` ([batch, seq] ids).
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.logits(idx)?.cross_entropy(targets)
    }
}

impl Module for Gpt {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.logits(idx)
    }

    /// `tok`, `pos`, `block{i}.<the block's names>`, `ln.<weight, bias>`: the names
    /// checkpoints store.
    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![
            ("tok".to_string(), self.tok.weight.clone()),
            ("pos".to_string(), self.pos.weight.clone()),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(
                b.params()
                    .into_iter()
                    .map(|(n, t)| (format!("block{i}.{n}"), t)),
            );
        }
        v.extend(
            self.ln
                .params()
                .into_iter()
                .map(|(n, t)| (format!("ln.{n}"), t)),
        );
        v
    }

    /// Dropout on in training, off in evaluation and sampling.
    fn train(&self, on: bool) {
        self.drop.train(on);
        self.blocks.iter().for_each(|b| b.train(on));
    }
}
