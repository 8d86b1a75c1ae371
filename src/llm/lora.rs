//! LoRA adapters on a Llama's projections, in the layout and names of Hugging Face's peft, so
//! adapters move between the two: `adapter_model.safetensors` (`lora_A` [rank, in] and
//! `lora_B` [out, rank] of each adapted projection) and `adapter_config.json`.
//!
//! An adapted projection computes `x W^T + s (x A^T) B^T`, with `s = alpha / rank` (or
//! `alpha / sqrt(rank)` with rsLoRA). New adapters start as peft's do: A uniform in
//! +-1/sqrt(in) (Kaiming uniform with a = sqrt(5)), B zero, so the model is unchanged until
//! training moves B. Dropout on the adapter's input applies while the graph is recorded
//! (training), not in inference.

use super::config::LlamaConfig;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// The projections an adapter can sit on, with their (input, output) sizes.
fn projection(cfg: &LlamaConfig, name: &str) -> Option<(&'static str, usize, usize)> {
    let (h, q, kv, i) = (
        cfg.hidden,
        cfg.heads * cfg.head_dim,
        cfg.kv_heads * cfg.head_dim,
        cfg.intermediate,
    );
    Some(match name {
        "q_proj" => ("self_attn", h, q),
        "k_proj" => ("self_attn", h, kv),
        "v_proj" => ("self_attn", h, kv),
        "o_proj" => ("self_attn", q, h),
        "gate_proj" => ("mlp", h, i),
        "up_proj" => ("mlp", h, i),
        "down_proj" => ("mlp", i, h),
        _ => return None,
    })
}

/// What adapters to add (peft's `LoraConfig`, the fields wgrad reads).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank of A and B.
    pub rank: usize,
    /// The scale's numerator: the update is multiplied by `alpha / rank`.
    pub alpha: f32,
    /// Dropout on the adapter's input in training.
    pub dropout: f32,
    /// The projections adapted in every block, by Hugging Face's names (`q_proj`, `v_proj`,
    /// ... `down_proj`).
    pub targets: Vec<String>,
    /// rsLoRA: scale `alpha / sqrt(rank)`.
    pub rslora: bool,
}

impl LoraConfig {
    /// Rank, alpha and targets; no dropout.
    pub fn new(rank: usize, alpha: f32, targets: &[&str]) -> LoraConfig {
        LoraConfig {
            rank,
            alpha,
            dropout: 0.0,
            targets: targets.iter().map(|t| t.to_string()).collect(),
            rslora: false,
        }
    }

    fn scale(&self) -> f32 {
        if self.rslora {
            self.alpha / (self.rank as f32).sqrt()
        } else {
            self.alpha / self.rank as f32
        }
    }
}

/// One adapter: A [rank, in], B [out, rank].
struct Adapter {
    a: Tensor,
    b: Tensor,
}

/// A model's adapters: per block, per projection name.
pub(crate) struct Lora {
    config: LoraConfig,
    blocks: Vec<HashMap<String, Adapter>>,
}

/// peft's name of an adapter tensor.
fn peft_name(layer: usize, group: &str, target: &str, which: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{group}.{target}.lora_{which}.weight")
}

impl Lora {
    /// New adapters (see the module docs for their start).
    pub fn new(dev: &Device, cfg: &LlamaConfig, config: LoraConfig, dtype: DType) -> Result<Lora> {
        let op = "Llama::add_lora";
        if config.rank == 0 || !(config.alpha.is_finite()) || !(0.0..1.0).contains(&config.dropout)
        {
            return Err(Error::invalid(
                op,
                format!(
                    "rank {}, alpha {}, dropout {}: want rank > 0, a finite alpha, dropout in [0, 1)",
                    config.rank, config.alpha, config.dropout
                ),
            ));
        }
        let mut blocks = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            let mut m = HashMap::new();
            for t in &config.targets {
                let (_, fan_in, out) = projection(cfg, t).ok_or_else(|| {
                    Error::invalid(op, format!("no projection named {t:?} to adapt"))
                })?;
                let bound = 1.0 / (fan_in as f32).sqrt();
                let a = Tensor::rand(dev, &[config.rank, fan_in], -bound, bound, dtype)?.variable();
                let b = Tensor::zeros(dev, &[out, config.rank], dtype)?.variable();
                m.insert(t.clone(), Adapter { a, b });
            }
            blocks.push(m);
        }
        Ok(Lora { config, blocks })
    }

    /// The update of projection `target` of block `layer` for its input `x`, if adapted,
    /// with the configured dropout on `x` when `train`.
    pub fn delta(
        &self,
        layer: usize,
        target: &str,
        x: &Tensor,
        train: bool,
    ) -> Result<Option<Tensor>> {
        let Some(ad) = self.blocks.get(layer).and_then(|m| m.get(target)) else {
            return Ok(None);
        };
        let x = if self.config.dropout > 0.0 && train {
            x.dropout(self.config.dropout)?
        } else {
            x.clone()
        };
        let y = x.linear(&ad.a, None)?.linear(&ad.b, None)?;
        Ok(Some(y.mul_scalar(self.config.scale())?))
    }

    /// The adapters' tensors under peft's names, in a stable order.
    pub fn params(&self, cfg: &LlamaConfig) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for (l, m) in self.blocks.iter().enumerate() {
            let mut names: Vec<&String> = m.keys().collect();
            names.sort();
            for t in names {
                let (group, _, _) = projection(cfg, t).unwrap_or(("self_attn", 0, 0));
                let ad = &m[t];
                v.push((peft_name(l, group, t, "A"), ad.a.clone()));
                v.push((peft_name(l, group, t, "B"), ad.b.clone()));
            }
        }
        v
    }

    /// Writes `adapter_model.safetensors` and `adapter_config.json` into `dir` (made if
    /// missing), as peft's `save_pretrained` does.
    pub fn save(&self, cfg: &LlamaConfig, dir: &Path, base: &str) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let tensors: Vec<(String, Tensor)> = self
            .params(cfg)
            .into_iter()
            .map(|(n, t)| Ok((n, crate::autograd::no_grad(|| t.to_dtype(DType::F32))?)))
            .collect::<Result<_>>()?;
        crate::nn::save(dir.join("adapter_model.safetensors"), &tensors)?;
        let c = &self.config;
        let json = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": c.rank,
            "lora_alpha": c.alpha,
            "lora_dropout": c.dropout,
            "target_modules": c.targets,
            "use_rslora": c.rslora,
            "use_dora": false,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
        });
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| Error::invalid("Llama::save_lora", e.to_string()))?;
        std::fs::write(dir.join("adapter_config.json"), text)?;
        Ok(())
    }

    /// Reads adapters that peft (or [`Lora::save`]) wrote into `dir`, checking every shape
    /// against the model's.
    pub fn load(dev: &Device, cfg: &LlamaConfig, dir: &Path, dtype: DType) -> Result<Lora> {
        let cpath = dir.join("adapter_config.json");
        let name = cpath.display().to_string();
        let text = std::fs::read_to_string(&cpath)?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(&name, format!("not JSON: {e}")))?;
        let field = |k: &str| v.get(k).filter(|x| !x.is_null());
        if let Some(t) = field("peft_type").and_then(|t| t.as_str())
            && t != "LORA"
        {
            return Err(Error::format(&name, format!("peft_type {t:?} is not LORA")));
        }
        for (k, ok) in [
            ("use_dora", serde_json::Value::Bool(false)),
            ("fan_in_fan_out", serde_json::Value::Bool(false)),
            ("bias", serde_json::Value::String("none".into())),
            ("lora_bias", serde_json::Value::Bool(false)),
        ] {
            if let Some(x) = field(k)
                && *x != ok
            {
                return Err(Error::format(&name, format!("{k} = {x} is not supported")));
            }
        }
        for k in [
            "modules_to_save",
            "layers_to_transform",
            "rank_pattern",
            "alpha_pattern",
        ] {
            let empty = field(k).is_none_or(|x| {
                x.as_array().is_some_and(|a| a.is_empty())
                    || x.as_object().is_some_and(|o| o.is_empty())
            });
            if !empty {
                return Err(Error::format(&name, format!("{k} is not supported")));
            }
        }
        let rank = field("r")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| Error::format(&name, "r is missing"))? as usize;
        let alpha = field("lora_alpha")
            .and_then(|x| x.as_f64())
            .ok_or_else(|| Error::format(&name, "lora_alpha is missing"))?
            as f32;
        let targets: Vec<String> = match field("target_modules") {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::format(&name, "target_modules holds a non-string"))?,
            Some(serde_json::Value::String(s)) => vec![s.clone()],
            _ => return Err(Error::format(&name, "target_modules is missing")),
        };
        let config = LoraConfig {
            rank,
            alpha,
            dropout: field("lora_dropout")
                .and_then(|x| x.as_f64())
                .unwrap_or(0.0) as f32,
            targets,
            rslora: field("use_rslora")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
        };
        let mut lora = Lora::new(dev, cfg, config, dtype)?;
        let wpath = dir.join("adapter_model.safetensors");
        let wname = wpath.display().to_string();
        let mut stored: HashMap<String, Tensor> = crate::nn::load_as(dev, &wpath, dtype)?
            .into_iter()
            .collect();
        for (l, m) in lora.blocks.iter_mut().enumerate() {
            // In name order, so the first error is the same on every run.
            let mut adapters: Vec<(&String, &mut Adapter)> = m.iter_mut().collect();
            adapters.sort_by(|a, b| a.0.cmp(b.0));
            for (t, ad) in adapters {
                let (group, _, _) = projection(cfg, t).unwrap_or(("self_attn", 0, 0));
                for (which, slot) in [("A", &mut ad.a), ("B", &mut ad.b)] {
                    let key = peft_name(l, group, t, which);
                    let got = stored
                        .remove(&key)
                        .ok_or_else(|| Error::format(&wname, format!("{key} is missing")))?;
                    if got.shape() != slot.shape() {
                        return Err(Error::format(
                            &wname,
                            format!(
                                "{key} has shape {:?}, the model's layer takes {:?}",
                                got.shape(),
                                slot.shape()
                            ),
                        ));
                    }
                    *slot = got.variable();
                }
            }
        }
        if let Some(extra) = stored.keys().next() {
            return Err(Error::format(
                &wname,
                format!("{extra} is not an adapter of the configured targets"),
            ));
        }
        Ok(lora)
    }
}
