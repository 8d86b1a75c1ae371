//! Resumable training: a checkpoint holds everything a run needs to continue exactly where it
//! stopped, so that 20 steps straight and 10 steps, a restart and 10 more give the same losses.
//!
//! One safetensors file (readable by any safetensors tool):
//! * tensors `model.<name>`: the parameters;
//! * tensors `optim.<name>`: the optimizer's state ([`Optimizer::state`]: moments, f32 master
//!   weights of f16 parameters);
//! * header metadata: the format version, the training step, the optimizer's step count, the
//!   loss scaler, the device's random-number state (dropout masks), the caller's data
//!   position and notes, and `checksum`: the xxh3-64 hash of every byte of the file except
//!   the 16 hex digits of that value itself (header, metadata and tensor data alike).
//!
//! Saving writes `<path>.tmp`, flushes it to disk and renames it over `path`, so a crash while
//! saving leaves the previous checkpoint whole. Loading checks the whole file (it is a wgrad
//! checkpoint of this format, the checksum matches, it parses, every number in its metadata
//! reads, every tensor the model and the optimizer hold is present with the same shape and
//! dtype) before it writes anything, so a refused file changes nothing: not the parameters,
//! the optimizer's state, the loss scaler nor the device's random state. An error names the
//! file and what is wrong.
//!
//! Files of the earlier format `wgrad-train-1`, whose checksum covered only the tensors, are
//! refused with a message that says so: their header could have been edited unnoticed.

use crate::error::{Error, Result};
use crate::nn::safetensors::{open, parse, serialize, write_named};
use crate::optim::{GradScaler, Optimizer};
use crate::tensor::Tensor;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

const FORMAT: &str = "wgrad-train-2";

/// The metadata key of the checksum, and the text that stands for its value while the file's
/// hash is taken: 16 hex digits, so writing the real value moves no other byte.
const CHECKSUM_KEY: &str = "checksum";
const CHECKSUM_DIGITS: usize = 16;

/// Where a run stands, besides its tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Training steps completed.
    pub step: u64,
    /// The caller's position in its data (a sampler's state, a batch index): restored as saved.
    pub data_position: u64,
    /// Anything else the caller wants back (configuration, best validation loss).
    pub notes: BTreeMap<String, String>,
}

/// Writes a training checkpoint of `model`'s parameters, `opt`'s state, the loss scaler (if
/// any) and `progress` to `path`, atomically (see the module docs).
///
/// ```
/// use wgrad::nn::{Linear, Module};
/// use wgrad::optim::{Adam, Optimizer};
/// use wgrad::train::{Progress, load_checkpoint, save_checkpoint};
/// use wgrad::DType;
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let name = format!("wgrad-doc-ckpt-{}.safetensors", std::process::id());
/// let path = std::env::temp_dir().join(name);
/// let model = Linear::new(&dev, 2, 1, true, DType::F32)?;
/// let mut opt = Adam::new(model.params(), 1e-2)?;
/// model.forward(&dev.randn(&[4, 2], DType::F32)?)?.sum_all()?.backward()?;
/// opt.step()?;
/// let progress = Progress { step: 1, data_position: 4, ..Default::default() };
/// save_checkpoint(&path, &model.params(), &opt, None, &progress)?;
///
/// // Later, in a new process: build the same model and optimizer, then restore.
/// let model2 = Linear::new(&dev, 2, 1, true, DType::F32)?;
/// let mut opt2 = Adam::new(model2.params(), 1e-2)?;
/// let resumed = load_checkpoint(&path, &model2.params(), &mut opt2, None)?;
/// assert_eq!(resumed, progress);
/// assert_eq!(opt2.steps(), 1); // Adam's bias correction continues from here
/// assert_eq!(model2.weight.to_vec::<f32>()?, model.weight.to_vec::<f32>()?);
/// std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
pub fn save_checkpoint(
    path: impl AsRef<Path>,
    model: &[(String, Tensor)],
    opt: &dyn Optimizer,
    scaler: Option<&GradScaler>,
    progress: &Progress,
) -> Result<()> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let Some((_, first)) = model.first() else {
        return Err(Error::invalid(
            "save_checkpoint",
            "the model has no parameters",
        ));
    };
    let tensors = file_tensors(model, opt);
    let mut meta: HashMap<String, String> = HashMap::new();
    meta.insert("format".into(), FORMAT.into());
    meta.insert("step".into(), progress.step.to_string());
    // The scaler's state as the device has it; a skipped step the host has not yet heard
    // of (a deferred step's report) is not one of the optimizer's steps.
    let scaler = match scaler {
        Some(s) => Some((s, s.snapshot()?)),
        None => None,
    };
    let untaken = scaler.map_or(0, |(_, (_, _, _, u))| u);
    meta.insert(
        "optimizer_steps".into(),
        opt.steps().saturating_sub(untaken).to_string(),
    );
    meta.insert("seed_state".into(), first.device().seed_state().to_string());
    meta.insert("data_position".into(), progress.data_position.to_string());
    if let Some((s, (scale, clean, skipped, _))) = scaler {
        // Display of a float is the shortest text that parses back to the same value.
        meta.insert(
            "scaler".into(),
            format!(
                "{scale} {} {} {} {clean} {skipped}",
                s.growth, s.backoff, s.growth_interval
            ),
        );
    }
    for (k, v) in &progress.notes {
        meta.insert(format!("note.{k}"), v.clone());
    }
    // The file is serialized once with zeros for the checksum's digits; the hash of every
    // other byte then takes their place.
    meta.insert(CHECKSUM_KEY.into(), "0".repeat(CHECKSUM_DIGITS));
    let mut bytes = serialize(path, &tensors, Some(meta))?;
    let at = checksum_field(path, &bytes)?;
    let digits = format!("{:016x}", file_hash(&bytes, at));
    bytes[at..at + CHECKSUM_DIGITS].copy_from_slice(digits.as_bytes());
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| Error::format(file, format!("could not write the checkpoint: {e}")))
}

/// Restores a checkpoint written by [`save_checkpoint`] into `model`'s parameters, `opt`'s
/// state and step count, the loss scaler and the device's random-number state; returns the
/// saved [`Progress`]. The model and optimizer must be built as they were when it was saved.
pub fn load_checkpoint(
    path: impl AsRef<Path>,
    model: &[(String, Tensor)],
    opt: &mut dyn Optimizer,
    scaler: Option<&mut GradScaler>,
) -> Result<Progress> {
    let path = path.as_ref();
    let map = open(path)?;
    let (st, meta) = checked(path, &map)?;
    let num = |key: &str| -> Result<u64> {
        let v = meta
            .get(key)
            .ok_or_else(|| bad(path, format!("metadata {key} is missing")))?;
        v.parse()
            .map_err(|_| bad(path, format!("metadata {key} = {v:?} is not a number")))
    };
    let (step, opt_steps, seed, data_position) = (
        num("step")?,
        num("optimizer_steps")?,
        num("seed_state")?,
        num("data_position")?,
    );
    let restored_scaler = match (&scaler, meta.get("scaler")) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(bad(
                path,
                "the run uses a loss scaler but the checkpoint has none",
            ));
        }
        (Some(_), Some(text)) => Some(parse_scaler(path, text)?),
    };
    let targets = file_tensors(model, &*opt);
    // Everything is checked; now write.
    write_named(path, &st, &targets, false)?;
    opt.set_steps(opt_steps);
    if let (Some(s), Some(r)) = (scaler, restored_scaler) {
        *s = r;
    }
    if let Some((_, first)) = model.first() {
        first.device().set_seed_state(seed);
    }
    let notes = meta
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("note.")?.to_string(), v.clone())))
        .collect();
    Ok(Progress {
        step,
        data_position,
        notes,
    })
}

/// Loads only the model's parameters from a training checkpoint (for inference: no optimizer
/// needed). The file is checked as [`load_checkpoint`] checks it.
pub fn load_weights(path: impl AsRef<Path>, model: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let map = open(path)?;
    let (st, _) = checked(path, &map)?;
    let targets = prefixed("model", model);
    write_named(path, &st, &targets, false)
}

/// The tensors a checkpoint file holds, under their names there: `model.<name>` and
/// `optim.<name>`.
fn file_tensors(model: &[(String, Tensor)], opt: &dyn Optimizer) -> Vec<(String, Tensor)> {
    let mut v = prefixed("model", model);
    v.extend(prefixed("optim", &opt.state()));
    v
}

fn prefixed(prefix: &str, named: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    named
        .iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t.clone()))
        .collect()
}

fn bad(path: &Path, detail: impl Into<String>) -> Error {
    Error::format(path.display().to_string(), detail)
}

/// The parsed file and its metadata, once the format and the checksum are verified.
fn checked<'a>(path: &Path, bytes: &'a [u8]) -> Result<(SafeTensors<'a>, HashMap<String, String>)> {
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| bad(path, format!("not a readable safetensors file: {e}")))?;
    let meta = header.metadata().clone().unwrap_or_default();
    match meta.get("format").map(String::as_str) {
        Some(FORMAT) => {}
        Some("wgrad-train-1") => {
            return Err(bad(
                path,
                format!(
                    "checkpoint format \"wgrad-train-1\" cannot be verified (its checksum does \
                     not cover the header); this wgrad reads {FORMAT:?}: resume with the wgrad \
                     that wrote it and save again"
                ),
            ));
        }
        Some(other) => {
            return Err(bad(
                path,
                format!("checkpoint format {other:?}, expected {FORMAT:?}"),
            ));
        }
        None => {
            return Err(bad(
                path,
                "not a wgrad training checkpoint (no format in its header)",
            ));
        }
    }
    let want = meta
        .get(CHECKSUM_KEY)
        .ok_or_else(|| bad(path, "metadata checksum is missing"))?;
    let at = checksum_field(path, bytes)?;
    let got = format!("{:016x}", file_hash(bytes, at));
    if *want != got || bytes[at..at + CHECKSUM_DIGITS] != *got.as_bytes() {
        return Err(bad(
            path,
            format!(
                "checksum mismatch (header {want}, file {got}): the file was changed after it was written"
            ),
        ));
    }
    let st = parse(path, bytes)?;
    Ok((st, meta))
}

/// Where the checksum's digits start: the one `"checksum":"` of the JSON header, followed by
/// 16 digits and a closing quote. A key or value of the header cannot hold that text
/// unescaped, so there is exactly one in a file this module wrote.
fn checksum_field(path: &Path, bytes: &[u8]) -> Result<usize> {
    let header_len = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| bad(path, "shorter than a safetensors header"))?;
    let end = usize::try_from(header_len)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            bad(
                path,
                format!("header length {header_len} runs past the file"),
            )
        })?;
    let needle = format!("\"{CHECKSUM_KEY}\":\"");
    let header = &bytes[8..end];
    let mut found = header
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_bytes())
        .map(|(i, _)| 8 + i + needle.len());
    let (Some(at), None) = (found.next(), found.next()) else {
        return Err(bad(
            path,
            "metadata checksum is not in the header exactly once",
        ));
    };
    if bytes.get(at + CHECKSUM_DIGITS) != Some(&b'"') {
        return Err(bad(path, "metadata checksum is not 16 hex digits"));
    }
    Ok(at)
}

/// xxh3-64 of every byte of the file but the checksum's digits.
fn file_hash(bytes: &[u8], at: usize) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&bytes[..at]);
    h.update(&bytes[at + CHECKSUM_DIGITS..]);
    h.digest()
}

fn parse_scaler(path: &Path, text: &str) -> Result<GradScaler> {
    let f: Vec<&str> = text.split(' ').collect();
    let err = || bad(path, format!("metadata scaler = {text:?} is malformed"));
    if f.len() != 6 {
        return Err(err());
    }
    let mut s = GradScaler::restored(
        f[0].parse().map_err(|_| err())?,
        f[4].parse().map_err(|_| err())?,
        f[5].parse().map_err(|_| err())?,
    );
    s.growth = f[1].parse().map_err(|_| err())?;
    s.backoff = f[2].parse().map_err(|_| err())?;
    s.growth_interval = f[3].parse().map_err(|_| err())?;
    Ok(s)
}
