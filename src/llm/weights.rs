//! Where a model's weights come from: a GGUF file (decoded from its block formats) or a
//! Hugging Face checkpoint (`model.safetensors`, or shards listed in
//! `model.safetensors.index.json`), under Hugging Face's tensor names.
//!
//! GGUF files written by llama.cpp's converter store the query and key projections with the
//! rows of each head interleaved (the pairs a rotary embedding rotates are adjacent rows);
//! Hugging Face keeps the two halves of a head apart. Loading from GGUF restores Hugging
//! Face's order, so one model (rotating half-split head dimensions) runs both.

use super::config::LlamaConfig;
use super::model::Matrix;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::nn::safetensors::{open, our_dtype, parse};
use crate::quant::{QuantFormat, QuantMatrix};
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// A source of named weights.
pub(crate) enum Weights {
    /// A GGUF file; with `quantized`, matrices in a format [`QuantMatrix`] keeps stay in it.
    Gguf { file: GgufFile, quantized: bool },
    Hf {
        /// Each tensor name's shard.
        shards: Vec<PathBuf>,
        index: std::collections::HashMap<String, usize>,
    },
}

/// The GGUF name of a Hugging Face tensor name of a Llama.
fn gguf_name(hf: &str) -> Option<String> {
    if hf == "model.embed_tokens.weight" {
        return Some("token_embd.weight".into());
    }
    if hf == "model.norm.weight" {
        return Some("output_norm.weight".into());
    }
    if hf == "lm_head.weight" {
        return Some("output.weight".into());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (n, part) = rest.split_once('.')?;
    let g = match part {
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}"))
}

/// Rows of a [heads * head_dim, in] projection reordered from GGUF's interleaved pairs to
/// Hugging Face's halves: within each head, row `j` comes from row `2 (j mod h/2) + j / (h/2)`.
/// A row is `row_len` consecutive elements (values, or a quantized row's bytes).
fn unpermute<T: Copy + Default>(
    data: &[T],
    heads: usize,
    head_dim: usize,
    row_len: usize,
) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for j in 0..head_dim {
            let from = h * head_dim + 2 * (j % half) + j / half;
            let to = h * head_dim + j;
            out[to * row_len..(to + 1) * row_len]
                .copy_from_slice(&data[from * row_len..(from + 1) * row_len]);
        }
    }
    out
}

/// The heads whose rows GGUF interleaves in tensor `name` (Hugging Face's name), if any.
fn interleaved_heads(name: &str, cfg: &LlamaConfig) -> Option<usize> {
    if name.ends_with("q_proj.weight") {
        Some(cfg.heads)
    } else if name.ends_with("k_proj.weight") {
        Some(cfg.kv_heads)
    } else {
        None
    }
}

impl Weights {
    pub fn gguf(file: GgufFile, quantized: bool) -> Weights {
        Weights::Gguf { file, quantized }
    }

    /// A Hugging Face checkpoint directory: one `model.safetensors`, or the shards its
    /// `model.safetensors.index.json` lists.
    pub fn hf(dir: &Path) -> Result<Weights> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let mut shards = Vec::new();
        let mut index = std::collections::HashMap::new();
        if index_path.exists() {
            let name = index_path.display().to_string();
            let text = std::fs::read_to_string(&index_path)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::format(&name, format!("not JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::format(&name, "weight_map is missing"))?;
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    Error::format(&name, format!("{tensor}: shard is not a name"))
                })?;
                if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                    return Err(Error::format(
                        &name,
                        format!("{tensor}: shard {file:?} is outside the directory"),
                    ));
                }
                let path = dir.join(file);
                let at = match shards.iter().position(|p| *p == path) {
                    Some(i) => i,
                    None => {
                        shards.push(path);
                        shards.len() - 1
                    }
                };
                index.insert(tensor.clone(), at);
            }
        } else if single.exists() {
            let map = open(&single)?;
            let st = parse(&single, &map)?;
            for n in st.names() {
                index.insert(n.to_string(), 0);
            }
            shards.push(single);
        } else {
            return Err(Error::format(
                dir.display().to_string(),
                "neither model.safetensors nor model.safetensors.index.json is here",
            ));
        }
        Ok(Weights::Hf { shards, index })
    }

    /// Whether the source holds tensor `name` (Hugging Face's name).
    pub fn has(&self, name: &str) -> bool {
        match self {
            Weights::Gguf { file, .. } => {
                gguf_name(name).is_some_and(|g| file.tensor(&g).is_some())
            }
            Weights::Hf { index, .. } => index.contains_key(name),
        }
    }

    fn path(&self) -> String {
        match self {
            Weights::Gguf { file, .. } => file.path().to_string(),
            Weights::Hf { shards, .. } => shards
                .first()
                .and_then(|p| p.parent())
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        }
    }

    /// Tensor `name` (Hugging Face's name) of `shape`, on `dev` in `dtype`. A missing tensor
    /// or another shape is an error naming both.
    pub fn load(
        &self,
        dev: &Device,
        name: &str,
        shape: &[usize],
        dtype: DType,
        cfg: &LlamaConfig,
    ) -> Result<Tensor> {
        let file = self.path();
        let wrong = |got: &[usize]| {
            Error::format(
                &file,
                format!("tensor {name} has shape {got:?}, the model expects {shape:?}"),
            )
        };
        match self {
            Weights::Gguf { file: f, .. } => {
                let g = gguf_name(name)
                    .ok_or_else(|| Error::format(&file, format!("no GGUF name for {name}")))?;
                let info = f.tensor(&g).ok_or_else(|| {
                    Error::format(&file, format!("tensor {g} ({name}) is missing"))
                })?;
                if info.shape() != shape {
                    return Err(wrong(&info.shape()));
                }
                let mut data = f.dequantize(&g)?;
                if let Some(heads) = interleaved_heads(name, cfg) {
                    data = unpermute(&data, heads, cfg.head_dim, cfg.hidden);
                }
                Tensor::from_f32(dev, &data, shape, dtype)
            }
            Weights::Hf { shards, index } => {
                let at = *index
                    .get(name)
                    .ok_or_else(|| Error::format(&file, format!("tensor {name} is missing")))?;
                let path = &shards[at];
                let map = open(path)?;
                let st = parse(path, &map)?;
                let view = st.tensor(name).map_err(|e| {
                    Error::format(path.display().to_string(), format!("tensor {name}: {e}"))
                })?;
                if view.shape() != shape {
                    return Err(wrong(view.shape()));
                }
                let stored = our_dtype(path, name, view.dtype())?;
                if !stored.is_float() {
                    return Err(Error::format(
                        path.display().to_string(),
                        format!("tensor {name} is {stored}, not a float weight"),
                    ));
                }
                let t = Tensor::uninit(dev, shape, stored)?;
                t.write_bytes(view.data())?;
                crate::autograd::no_grad(|| t.to_dtype(dtype))
            }
        }
    }
}

impl Weights {
    /// The matrices `parts` ((name, rows) each, all of `cols` columns) stacked by rows into
    /// one, [sum of rows, cols]. Kept in its block format where the source is a GGUF file read
    /// `quantized` and every part is in one format [`QuantMatrix`] keeps; else decoded to
    /// `dtype` as [`load`](Weights::load) gives each part.
    pub fn load_matrix(
        &self,
        dev: &Device,
        parts: &[(&str, usize)],
        cols: usize,
        dtype: DType,
        cfg: &LlamaConfig,
    ) -> Result<Matrix> {
        let rows: usize = parts.iter().map(|p| p.1).sum();
        if let Weights::Gguf {
            file,
            quantized: true,
        } = self
        {
            let infos: Vec<_> = parts
                .iter()
                .map(|(name, _)| gguf_name(name).and_then(|g| file.tensor(&g)))
                .collect();
            let formats: Vec<_> = infos
                .iter()
                .map(|i| i.and_then(|i| QuantFormat::from_ggml(i.ggml_type())))
                .collect();
            if let Some(&Some(format)) = formats.first()
                && formats.iter().all(|f| *f == Some(format))
            {
                let mut bytes = Vec::new();
                for (&(name, r), info) in parts.iter().zip(&infos) {
                    let Some(info) = info else { continue };
                    if info.shape() != [r, cols] {
                        return Err(Error::format(
                            file.path(),
                            format!(
                                "tensor {name} has shape {:?}, the model expects {:?}",
                                info.shape(),
                                [r, cols]
                            ),
                        ));
                    }
                    let data = file.tensor_bytes(info)?;
                    match interleaved_heads(name, cfg) {
                        Some(heads) => {
                            let row = cols / crate::quant::BLOCK * format.block_bytes();
                            bytes.extend(unpermute(data, heads, cfg.head_dim, row));
                        }
                        None => bytes.extend_from_slice(data),
                    }
                }
                return Ok(Matrix::Quant(QuantMatrix::from_blocks(
                    dev, format, &bytes, rows, cols,
                )?));
            }
        }
        let dense = parts
            .iter()
            .map(|&(name, r)| self.load(dev, name, &[r, cols], dtype, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(Matrix::Dense(match dense.as_slice() {
            [one] => one.clone(),
            many => Tensor::cat(&many.iter().collect::<Vec<_>>(), 0)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_restores_halves() {
        // One head of 4 rows of 1 column: GGUF holds rows in the order 0, 2, 1, 3 of HF's.
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute(&gguf, 1, 4, 1), vec![0.0, 1.0, 2.0, 3.0]);
        // Rows of two elements (a quantized row's bytes) move whole.
        let bytes = [0u8, 0, 2, 2, 1, 1, 3, 3];
        assert_eq!(unpermute(&bytes, 1, 4, 2), vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn names_map() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.k_proj.weight").as_deref(),
            Some("blk.3.attn_k.weight")
        );
        assert_eq!(gguf_name("model.layers.3.rotary.inv_freq"), None);
    }
}
