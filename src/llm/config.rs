//! The shape of a Llama-family model, read from a GGUF file's metadata or a Hugging Face
//! `config.json`.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use std::path::Path;

/// Architectures this module runs: Llama and the models that share its layers (SmolLM2 is
/// published as `llama`; Mistral's layers are Llama's).
const SUPPORTED: &[&str] = &["llama", "mistral"];

/// Sizes and constants of a Llama-family decoder: RMSNorm, rotary embeddings on half-split
/// head dimensions, grouped-query attention, a SwiGLU MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The architecture's name as the file gives it (`llama`).
    pub architecture: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (fewer than `heads` for grouped-query attention; a divisor of it).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate: usize,
    /// RMSNorm's epsilon.
    pub rms_eps: f32,
    /// Base of the rotary embedding's frequencies.
    pub rope_theta: f32,
    /// Longest context the model was trained for.
    pub max_position: usize,
    /// The output head is the token embedding's transpose.
    pub tie_embeddings: bool,
}

fn bad(path: &str, detail: impl Into<String>) -> Error {
    Error::format(path, detail)
}

/// An error naming `arch` unless this module runs it.
fn supported(path: &str, arch: &str) -> Result<()> {
    if SUPPORTED.contains(&arch) {
        return Ok(());
    }
    Err(bad(
        path,
        format!(
            "architecture {arch:?} is not supported (wgrad runs {})",
            SUPPORTED.join(", ")
        ),
    ))
}

impl LlamaConfig {
    /// Checks that the sizes fit together (heads divide the width, kv heads divide heads).
    pub fn validate(&self, path: &str) -> Result<()> {
        supported(path, &self.architecture)?;
        let positive = [
            ("vocabulary", self.vocab),
            ("hidden size", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("key/value heads", self.kv_heads),
            ("head dimension", self.head_dim),
            ("intermediate size", self.intermediate),
            ("context length", self.max_position),
        ];
        if let Some((what, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(bad(path, format!("{what} is 0")));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(bad(
                path,
                format!(
                    "{} key/value heads do not divide {} heads",
                    self.kv_heads, self.heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                path,
                format!(
                    "head dimension {} is odd (rotary embeddings rotate pairs)",
                    self.head_dim
                ),
            ));
        }
        Ok(())
    }

    /// From a GGUF file's metadata (`general.architecture`, then `<arch>.block_count` and the
    /// rest). A key the model needs and the file lacks is an error naming it.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaConfig> {
        let path = file.path().to_string();
        let arch = file.get_str("general.architecture")?.to_string();
        // Named before any key is read: another architecture's keys differ.
        supported(&path, &arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        let size = |k: &str| -> Result<usize> { Ok(file.get_u64(&key(k))? as usize) };
        let hidden = size("embedding_length")?;
        let heads = size("attention.head_count")?;
        let kv_heads = match file.get(&key("attention.head_count_kv")) {
            Some(_) => size("attention.head_count_kv")?,
            None => heads,
        };
        let head_dim = match file.get(&key("attention.key_length")) {
            Some(_) => size("attention.key_length")?,
            None if heads > 0 => hidden / heads,
            None => 0,
        };
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| bad(&path, "tensor token_embd.weight is missing"))?;
        let vocab = match file.get(&key("vocab_size")) {
            Some(_) => size("vocab_size")?,
            None => embd.shape().first().copied().unwrap_or(0),
        };
        let rope_theta = match file.get(&key("rope.freq_base")) {
            Some(_) => file.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let c = LlamaConfig {
            architecture: arch.clone(),
            vocab,
            hidden,
            layers: size("block_count")?,
            heads,
            kv_heads,
            head_dim,
            intermediate: size("feed_forward_length")?,
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            max_position: size("context_length")?,
            tie_embeddings: file.tensor("output.weight").is_none(),
        };
        c.validate(&path)?;
        Ok(c)
    }

    /// From a Hugging Face `config.json` (`model_type`, `hidden_size`, ...).
    pub fn from_hf_json(path: impl AsRef<Path>) -> Result<LlamaConfig> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&name, format!("not JSON: {e}")))?;
        let arch = v
            .get("model_type")
            .and_then(|x| x.as_str())
            .ok_or_else(|| bad(&name, "model_type is missing"))?
            .to_string();
        let size = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| bad(&name, format!("{k} is missing or not a count")))
        };
        let float = |k: &str, default: f64| -> Result<f32> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(default as f32),
                Some(x) => x
                    .as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| bad(&name, format!("{k} is not a number"))),
            }
        };
        if v.get("rope_scaling").is_some_and(|r| !r.is_null()) {
            return Err(bad(
                &name,
                "rope_scaling is set; scaled rotary embeddings are not supported",
            ));
        }
        // What this model does not implement is refused rather than ignored.
        if let Some(act) = v.get("hidden_act").and_then(|a| a.as_str())
            && act != "silu"
        {
            return Err(bad(
                &name,
                format!("hidden_act {act:?} is not supported (silu)"),
            ));
        }
        for flag in ["attention_bias", "mlp_bias"] {
            if v.get(flag).and_then(|b| b.as_bool()) == Some(true) {
                return Err(bad(
                    &name,
                    format!("{flag} is true; biases are not supported"),
                ));
            }
        }
        // transformers 5 writes the rotary settings under rope_parameters; earlier files
        // have a top-level rope_theta.
        let rope = v.get("rope_parameters").filter(|r| !r.is_null());
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(|t| t.as_str())
            && kind != "default"
        {
            return Err(bad(
                &name,
                format!("rope_type {kind:?} is not supported (only the default rotary embedding)"),
            ));
        }
        let rope_theta = match rope.and_then(|r| r.get("rope_theta")) {
            Some(t) => t
                .as_f64()
                .map(|t| t as f32)
                .ok_or_else(|| bad(&name, "rope_parameters.rope_theta is not a number"))?,
            None => float("rope_theta", 10_000.0)?,
        };
        let hidden = size("hidden_size")?;
        let heads = size("num_attention_heads")?;
        let kv_heads = if v.get("num_key_value_heads").is_some() {
            size("num_key_value_heads")?
        } else {
            heads
        };
        let head_dim = match v.get("head_dim") {
            Some(x) if !x.is_null() => size("head_dim")?,
            _ if heads > 0 => hidden / heads,
            _ => 0,
        };
        let c = LlamaConfig {
            architecture: arch,
            vocab: size("vocab_size")?,
            hidden,
            layers: size("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            intermediate: size("intermediate_size")?,
            rms_eps: float("rms_norm_eps", 1e-6)?,
            rope_theta,
            max_position: size("max_position_embeddings")?,
            tie_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
        };
        c.validate(&name)?;
        Ok(c)
    }
}
