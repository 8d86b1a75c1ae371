//! Choosing between kernel variants by measuring them, once per shape and adapter. Off by
//! default: where measured it has never beaten the size rules on the GPT's products (every
//! f32 shape class kept `reg`; f16 products run `wide`, which nothing measured came near),
//! and a first run pays up to the budget compiling the pipelines of the variants that lose
//! (a fraction of a second; next to nothing once every shape is in the file:
//! docs/performance.md, the host path). `WGRAD_AUTOTUNE=on` turns it on.
//!
//! Policy, when on:
//! - Where the size rules leave two kernels that both take a product's operands (the
//!   tensor-core `main` and `direct` products where `wide` does not run; the f32 `reg` and
//!   64 x 64 tiled products), the first product of that shape class on a device runs each
//!   variant on its own operands (every variant computes the same product, and the winner's
//!   run is the one that stands) and keeps the faster. The rules' choice stays unless the other is at least 5% faster,
//!   so timing noise does not flip choices.
//! - Choices are written to a file per adapter, driver and wgrad version, under
//!   `WGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/wgrad`, else `$HOME/.cache/wgrad`, and read on
//!   the first product of the next run: shapes found there are not measured again. A cache
//!   that cannot be read or written only costs the measurement again.
//! - Measuring stays within [`BUDGET`] a device: no new measurement starts past half of it,
//!   and one that reaches it between variants stops, leaving the rules' choice (the rules
//!   decide from then on; the next run measures the rest). Compiling the variants' pipelines
//!   is most of the cost, so only one variant's compile can run past the budget.
//! - Products below [`MIN_FLOPS`] and CPU adapters are not measured (timings there are noise
//!   or the rules are already right). `WGRAD_AUTOTUNE=all` also measures those (tests).
//!
//! Measuring needs the device idle, so a trial waits for the work queued before it.

use crate::device::Device;
use crate::error::Result;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Time one device may spend measuring, in total.
pub const BUDGET: Duration = Duration::from_secs(1);
/// Products with fewer floating-point operations are not measured.
pub const MIN_FLOPS: f64 = 2e9;
/// How long the repeated runs of one variant should last, to rise above the cost of a sync.
const TRIAL_TARGET: Duration = Duration::from_millis(2);
/// A variant replaces the rules' choice only when it is this much faster.
const MARGIN: f64 = 0.95;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Off,
    On,
    All,
}

fn mode() -> Mode {
    match std::env::var("WGRAD_AUTOTUNE").as_deref() {
        Ok("on") | Ok("1") => Mode::On,
        Ok("all") => Mode::All,
        _ => Mode::Off,
    }
}

/// What the tuner of one device did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AutotuneStats {
    /// Shape classes measured in this process.
    pub measured: u64,
    /// Choices taken from the cache file or from an earlier measurement in this process.
    pub hits: u64,
    /// Choices read from the cache file when it was loaded.
    pub loaded: u64,
    /// Host time spent choosing: reading the file, measuring, writing the file.
    pub spent: Duration,
}

impl std::fmt::Display for AutotuneStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} product shapes measured, {} choices reused (from the cache file or earlier), {:.1} ms spent choosing",
            self.measured,
            self.hits,
            self.spent.as_secs_f64() * 1e3
        )
    }
}

/// The per-device tuner (kept in the kernels layer's device state).
#[derive(Default)]
pub(crate) struct Tuner {
    inner: Mutex<Inner>,
    /// `WGRAD_AUTOTUNE`, read at the device's first product: every product asks, and reading
    /// the environment each time was 1% of the host's time a training step.
    mode: OnceLock<Mode>,
}

#[derive(Default)]
struct Inner {
    /// The cache file was looked for.
    opened: bool,
    path: Option<PathBuf>,
    choices: HashMap<String, String>,
    stats: AutotuneStats,
}

/// A name for the file that keeps `what` for the adapter and driver of `dev`: FNV-1a of
/// their description and wgrad's version, so another driver or version starts afresh.
pub(crate) fn file_name(dev: &Device, what: &str) -> String {
    let i = dev.info();
    let desc = format!(
        "{}|{}|{}|{}",
        i.name,
        i.backend,
        i.driver,
        env!("CARGO_PKG_VERSION")
    );
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in desc.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{what}-{h:016x}.txt")
}

/// Where measurements are kept: `WGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/wgrad`, else
/// `$HOME/.cache/wgrad`.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("WGRAD_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("wgrad")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("wgrad")))
}

impl Inner {
    fn open(&mut self, dev: &Device) {
        self.opened = true;
        let Some(dir) = cache_dir() else { return };
        let path = dir.join(file_name(dev, "autotune"));
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                if let Some((k, v)) = line.split_once('\t') {
                    self.choices.insert(k.to_string(), v.to_string());
                }
            }
            self.stats.loaded = self.choices.len() as u64;
        }
        self.path = Some(path);
    }

    /// Appends one choice to the file (creating it with a header naming the adapter).
    fn save(&self, dev: &Device, key: &str, choice: &str) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let fresh = !path.exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if fresh {
            let i = dev.info();
            writeln!(
                f,
                "# wgrad {} kernel choices for {} ({}, {})",
                env!("CARGO_PKG_VERSION"),
                i.name,
                i.backend,
                i.driver
            )?;
        }
        writeln!(f, "{key}\t{choice}")
    }
}

/// Whether a product of `flops` on `dev` is worth measuring under the current mode.
pub(crate) fn wanted(dev: &Device, tuner: &Tuner, flops: f64) -> bool {
    match *tuner.mode.get_or_init(mode) {
        Mode::Off => false,
        Mode::All => true,
        Mode::On => !dev.info().is_cpu() && flops >= MIN_FLOPS,
    }
}

/// Wall time of `reps` runs of `run`, the device idle before and after.
pub(crate) fn time(
    dev: &Device,
    reps: usize,
    run: &mut dyn FnMut() -> Result<()>,
) -> Result<Duration> {
    dev.sync()?;
    let t = Instant::now();
    for _ in 0..reps {
        run()?;
    }
    dev.sync()?;
    Ok(t.elapsed())
}

/// The variant for shape class `key` among `variants` (the rules' choice first; each with a
/// name that is stable across runs), measuring them with `run` on first sight. The returned
/// variant has not run for this call unless `ran` is set: then its last run's output stands.
pub(crate) fn choose<C: Copy>(
    dev: &Device,
    tuner: &Tuner,
    key: &str,
    variants: &[(C, String)],
    run: &mut dyn FnMut(C) -> Result<()>,
) -> Result<(C, bool)> {
    let Some(&(rules, _)) = variants.first() else {
        return Err(crate::error::Error::Internal(
            "autotune with no variants".into(),
        ));
    };
    let mut s = tuner.inner.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    if !s.opened {
        s.open(dev);
    }
    let kept = s
        .choices
        .get(key)
        .and_then(|name| variants.iter().find(|(_, n)| n == name));
    if let Some(&(c, _)) = kept {
        s.stats.hits += 1;
        s.stats.spent += t0.elapsed();
        return Ok((c, false));
    }
    if s.stats.spent >= BUDGET / 2 {
        return Ok((rules, false));
    }
    // Each variant: one run to build its pipeline, one timed to size the trial, then enough
    // runs to last about TRIAL_TARGET. The rules' variant runs last, so its output stands
    // unless another wins (then that one runs again).
    let mut best: Option<(usize, f64)> = None;
    let order: Vec<usize> = (1..variants.len()).chain([0]).collect();
    for &i in &order {
        if s.stats.spent + t0.elapsed() >= BUDGET {
            // Out of time (compiles cost more than the trials): the rules decide, and a later
            // run measures this shape.
            s.stats.spent += t0.elapsed();
            return Ok((rules, false));
        }
        let c = variants[i].0;
        let mut go = || run(c);
        time(dev, 1, &mut go)?;
        let once = time(dev, 1, &mut go)?;
        let reps = (TRIAL_TARGET.as_secs_f64() / once.as_secs_f64().max(1e-6)).ceil();
        let reps = reps.clamp(1.0, 20.0) as usize;
        let per = time(dev, reps, &mut go)?.as_secs_f64() / reps as f64;
        let per = if i == 0 { per * MARGIN } else { per };
        if best.is_none_or(|(_, b)| per < b) {
            best = Some((i, per));
        }
    }
    let winner = best.map_or(0, |(i, _)| i);
    let (choice, name) = &variants[winner];
    s.choices.insert(key.to_string(), name.clone());
    // A cache that cannot be written costs only the measurement next time.
    let _ = s.save(dev, key, name);
    s.stats.measured += 1;
    s.stats.spent += t0.elapsed();
    Ok((*choice, winner == 0))
}

/// The choice kept for `key`, if any (without reading the cache file).
pub(crate) fn lookup(tuner: &Tuner, key: &str) -> Option<String> {
    let s = tuner.inner.lock().unwrap_or_else(|e| e.into_inner());
    s.choices.get(key).cloned()
}

/// What `tuner` did so far.
pub(crate) fn stats(tuner: &Tuner) -> AutotuneStats {
    tuner.inner.lock().unwrap_or_else(|e| e.into_inner()).stats
}
