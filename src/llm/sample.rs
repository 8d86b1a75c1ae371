//! Choosing the next token from logits, on the device: only the chosen ids are read back.
//!
//! Greedy decoding takes the arg-max. Otherwise, as Hugging Face's `generate` does: the
//! logits are divided by the temperature, cut to the `top_k` largest, turned into
//! probabilities, cut to the smallest prefix (by probability) whose mass reaches `top_p`,
//! and one token is drawn from what is left with a uniform number from the device's random
//! stream ([`Device::manual_seed`](crate::Device::manual_seed) makes it repeatable).

use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How to choose a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy decoding; else the logits are divided by it.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (`None`: every token).
    pub top_k: Option<usize>,
    /// Keep the most likely tokens whose probabilities add up to at least this (in (0, 1];
    /// `None` or 1: no cut).
    pub top_p: Option<f32>,
}

impl Sampling {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        }
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::greedy()
    }
}

/// One token id (u32) for each row of `logits` ([n, vocab], float), chosen on the device.
///
/// ```
/// # fn main() -> wgrad::Result<()> {
/// use wgrad::llm::{Sampling, sample};
/// let dev = wgrad::Device::new()?;
/// let logits = dev.tensor(&[0.0f32, 5.0, 1.0, 9.0, 0.5, 0.0], &[2, 3])?;
/// let ids = sample(&logits, &Sampling::greedy())?;
/// assert_eq!(ids.to_vec::<u32>()?, vec![1, 0]);
/// // Top-k of 1 is greedy whatever the temperature.
/// let s = Sampling { temperature: 2.0, top_k: Some(1), top_p: None };
/// assert_eq!(sample(&logits, &s)?.to_vec::<u32>()?, vec![1, 0]);
/// # Ok(())
/// # }
/// ```
pub fn sample(logits: &Tensor, s: &Sampling) -> Result<Tensor> {
    let op = "sample";
    if logits.rank() != 2 || !logits.dtype().is_float() {
        return Err(Error::shape(
            op,
            format!(
                "logits {:?} {}: want float [rows, vocab]",
                logits.shape(),
                logits.dtype()
            ),
        ));
    }
    let (n, vocab) = (logits.shape()[0], logits.shape()[1]);
    if !(s.temperature >= 0.0 && s.temperature.is_finite()) {
        return Err(Error::invalid(op, format!("temperature {}", s.temperature)));
    }
    if let Some(p) = s.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(Error::invalid(op, format!("top_p {p} is not in (0, 1]")));
    }
    if vocab > 1 << 24 {
        return Err(Error::invalid(
            op,
            format!(
                "a vocabulary of {vocab} is past 2^24, where token ids stop being exact in f32"
            ),
        ));
    }
    if s.top_k == Some(0) {
        return Err(Error::invalid(op, "top_k 0 keeps no token"));
    }
    no_grad(|| {
        let logits = logits.to_dtype(DType::F32)?;
        if s.temperature == 0.0 || s.top_k == Some(1) {
            return logits.argmax(-1, false);
        }
        let k = s.top_k.unwrap_or(vocab).min(vocab);
        // The k largest, sorted, and their ids.
        let (top, ids) = logits.affine(1.0 / s.temperature, 0.0)?.topk(k, -1, true)?;
        let mut probs = top.softmax()?;
        if let Some(p) = s.top_p.filter(|&p| p < 1.0) {
            // Keep a token while the mass before it is below p (so the first always stays).
            let before = probs.cumsum(-1)?.sub(&probs)?;
            let limit = Tensor::full(probs.device(), &[1], p, DType::F32)?;
            probs = probs.mul(&before.lt(&limit)?)?;
        }
        // Inverse transform: the first token whose running mass passes u * total.
        let running = probs.cumsum(-1)?;
        let total = running.narrow(1, k - 1, 1)?;
        let u = Tensor::rand(probs.device(), &[n, 1], 0.0, 1.0, DType::F32)?.mul(&total)?;
        let passed = running.le(&u)?.sum(-1, true)?;
        // A draw at the very top of the range counts every token: keep it in range.
        let last = Tensor::full(probs.device(), &[1], (k - 1) as f32, DType::F32)?;
        let pick = passed.minimum(&last)?.to_dtype(DType::U32)?;
        // Ids pass through f32 for the gather (float-only), exact below 2^24 (checked above).
        ids.to_dtype(DType::F32)?
            .gather(-1, &pick)?
            .to_dtype(DType::U32)?
            .reshape(&[n])
    })
}
