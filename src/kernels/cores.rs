//! Counting a GPU's cores by timing products, where the driver does not report them.
//!
//! The rules that fill waves of workgroups (`matmul_plan`: tilings, splits of K) need the
//! compute-unit count. NVIDIA's and AMD's Vulkan drivers report it
//! ([`DeviceProfile::cores`](crate::device::DeviceProfile::cores)); `WGRAD_CORES=N` gives it
//! by hand, `WGRAD_CORES=none` withholds it. Elsewhere (Metal, DX12, other drivers) the first
//! product on a GPU measures it once, and the count is kept in a file per adapter, driver and
//! wgrad version beside the tuner's (`WGRAD_CACHE_DIR`, see [`autotune`]), so later runs read
//! it instead. CPU adapters are not measured: their threads share work out in time.
//!
//! Method. A batch of T identical product tiles reads the same operands, so the batch costs
//! only its T outputs in memory: `wide`'s 256 x 128 tiles where `wide` runs, else `reg`'s f32
//! 128 x 128 tiles. Each tile keeps a core busy, so while T is at most the core count the
//! batch takes about one tile's time, and one tile more puts two on a core, which then takes
//! about twice as long, whether it holds both at once (`reg`, two a core) or one after the
//! other (`wide`'s eight subgroups). The count is the last T before that step, found by
//! doubling T and then bisecting. It is taken only where the step is sharp (T + 1 tiles take
//! at least [`STEP`] times T's time): an adapter whose time grows smoothly with T gives no
//! count, and the rules stand aside as they do without one. A failed measurement gives no
//! count either: it costs speed, never a result. On a GPU where two `reg` tiles share a core
//! without slowing each other the step comes at twice the cores, and the count is that: the
//! `reg` tiles that run at full speed at once (on the H200 both tilings find its 132 SMs).
//!
//! Measuring waits for the work queued before it and takes 0.1-0.6 s on an H200 (most
//! of it compiling the pipeline the first time); its operands take 4-6 MiB and its outputs
//! 64 KiB a tile, up to twice the count.

use super::matmul::{Act, Config, Gemm, run_on};
use super::matmul_plan::{self as mp};
use super::{autotune, state};
use crate::device::{Device, DeviceProfile};
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;
use std::io::Write;
use std::time::Duration;

/// A second wave shows as a time at least this many times the one before it: a core with two
/// `reg` tiles held at once took 1.5-1.6x one tile's time on the H200 (`wide`'s, one after
/// the other, 1.9-2x), and trials of one count vary by up to 12%.
pub const STEP: f64 = 1.25;
/// The most workgroups a measurement launches at once; a GPU that holds more gets no count.
pub const MAX_COUNT: usize = 2048;
/// The contraction of each timed tile: long enough that one tile's time is far above a
/// launch's cost, short enough that the operands stay a few MiB (`wide`, `reg`).
const K_WIDE: usize = 8192;
const K_REG: usize = 4096;
/// The time one trial should last, to rise above the cost of a sync.
const TRIAL: Duration = Duration::from_millis(2);
/// The tiling timed where `wide` runs.
const TILING: Config = Config::CoopWideTall;

/// The last count of workgroups that runs in one wave, searched up to `max` with `time(t)`,
/// the time of a batch of `t` workgroups: doubling until a time reaches [`STEP`] times one
/// workgroup's, then bisecting. `None` where no step shows up to `max`, or where it is not
/// sharp (the time at count + 1 under [`STEP`] times the count's).
///
/// ```
/// use wgrad::kernels::cores::last_count_in_one_wave;
/// // 96 cores: up to 96 workgroups take one workgroup's time, up to 192 twice that.
/// let mut waves = |t: usize| Ok(1e-3 * t.div_ceil(96) as f64);
/// assert_eq!(last_count_in_one_wave(2048, &mut waves)?, Some(96));
/// // A time that grows by 20% with every workgroup has no sharp step: no count.
/// let mut shared = |t: usize| Ok(1e-4 * (1.0 + 0.2 * (t - 1) as f64));
/// assert_eq!(last_count_in_one_wave(2048, &mut shared)?, None);
/// # Ok::<(), wgrad::Error>(())
/// ```
pub fn last_count_in_one_wave(
    max: usize,
    time: &mut dyn FnMut(usize) -> Result<f64>,
) -> Result<Option<usize>> {
    let one = time(1)?;
    let later_wave = |t: f64| t >= STEP * one;
    let (mut lo, mut hi) = (1, 2);
    loop {
        if hi > max {
            return Ok(None);
        }
        if later_wave(time(hi)?) {
            break;
        }
        lo = hi;
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if later_wave(time(mid)?) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let (at, past) = (time(lo)?, time(hi)?);
    Ok((past >= STEP * at).then_some(lo))
}

/// Measures the core count of `dev` now (no file is read or written): `None` on CPU adapters
/// or where no sharp step shows.
///
/// ```
/// let dev = wgrad::Device::new()?;
/// let counted = wgrad::kernels::cores::measure(&dev)?;
/// // lavapipe runs on the CPU: nothing to time.
/// if !dev.info().is_cpu() {
///     println!("{counted:?} cores measured, {:?} reported", dev.hardware().cores);
/// }
/// # assert!(!dev.info().is_cpu() || counted.is_none());
/// # Ok::<(), wgrad::Error>(())
/// ```
pub fn measure(dev: &Device) -> Result<Option<usize>> {
    let Some(mut clock) = WaveClock::new(dev)? else {
        return Ok(None);
    };
    last_count_in_one_wave(MAX_COUNT, &mut |t| clock.time(t))
}

/// The times [`measure`] takes, in seconds, of batches of `counts` tiles, and the tiling
/// timed: the curve its step is found on (`None` on CPU adapters).
///
/// ```
/// let dev = wgrad::Device::new()?;
/// if let Some((tiling, times)) = wgrad::kernels::cores::wave_times(&dev, &[1, 64, 65])? {
///     println!("{tiling:?}: {times:?} s");
/// }
/// # Ok::<(), wgrad::Error>(())
/// ```
pub fn wave_times(dev: &Device, counts: &[usize]) -> Result<Option<(Config, Vec<f64>)>> {
    let Some(mut clock) = WaveClock::new(dev)? else {
        return Ok(None);
    };
    let times = counts
        .iter()
        .map(|&t| clock.time(t))
        .collect::<Result<_>>()?;
    Ok(Some((clock.tiling, times)))
}

/// Times batches of identical product tiles on one device.
struct WaveClock<'a> {
    dev: &'a Device,
    tiling: Config,
    dtype: DType,
    k: usize,
    a: Block,
    b: Block,
    reps: usize,
    /// The device's profile without a core count: tiles planned so, K is never split.
    uncounted: DeviceProfile,
}

impl<'a> WaveClock<'a> {
    /// `None` on CPU adapters.
    fn new(dev: &'a Device) -> Result<Option<Self>> {
        let hw = dev.hardware();
        if hw.cpu {
            return Ok(None);
        }
        let (tiling, dtype, k) = if mp::wide_runs(hw, DType::F16) {
            (TILING, DType::F16, K_WIDE)
        } else {
            (Config::Reg, DType::F32, K_REG)
        };
        let (m, n) = tiling.tile();
        let size = dtype.size();
        let mut clock = WaveClock {
            dev,
            tiling,
            dtype,
            k,
            a: dev.alloc((m * k * size) as u64)?,
            b: dev.alloc((k * n * size) as u64)?,
            reps: 1,
            uncounted: DeviceProfile {
                cores: None,
                ..hw.clone()
            },
        };
        // The first launch compiles the pipeline; then enough repeats that a trial lasts
        // TRIAL.
        clock.trial(1)?;
        clock.reps = 4;
        let single = clock.trial(1)?.max(1e-6);
        clock.reps = ((TRIAL.as_secs_f64() / single).ceil() as usize).clamp(1, 64);
        Ok(Some(clock))
    }

    /// Seconds a batch of `batch` tiles takes: the best of two trials (a stall makes one
    /// trial slower, never faster).
    fn time(&mut self, batch: usize) -> Result<f64> {
        Ok(self.trial(batch)?.min(self.trial(batch)?))
    }

    fn trial(&self, batch: usize) -> Result<f64> {
        let (m, n) = self.tiling.tile();
        let k = self.k;
        let c = self.dev.alloc((batch * m * n * self.dtype.size()) as u64)?;
        let g = Gemm {
            a: &self.a,
            b: &self.b,
            c: &c,
            bias: None,
            dtype: self.dtype,
            c_dtype: self.dtype,
            m,
            n,
            k,
            batch,
            a_strides: (k, 1),
            b_strides: (n, 1),
            a_bs: 0,
            b_bs: 0,
            a_mod: 1,
            b_mod: 1,
            act: Act::None,
            offsets: (0, 0, 0),
            bias_rows: false,
            bias_bs: 0,
            gather: None,
            row_sums: None,
        };
        let took = autotune::time(self.dev, self.reps, &mut || {
            run_on(self.dev, &g, self.tiling, &self.uncounted).map(drop)
        })?;
        Ok(took.as_secs_f64() / self.reps as f64)
    }
}

/// Gives the planning rules of `dev` a core count where they have none and it is a GPU:
/// from the file of an earlier run, else measured now and written there. Called before a
/// product is planned; quick once the count is settled (or known to be unknowable).
pub(crate) fn ensure(dev: &Device) -> Result<()> {
    let hw = dev.hardware();
    if hw.cores.is_some() || hw.cpu || super::matmul::forced_config().is_some() {
        return Ok(());
    }
    let cell = &state(dev)?.cores;
    let cores = *cell.get_or_init(|| {
        if crate::device::cores_from_env() == crate::device::CoresFromEnv::Unknown {
            return None;
        }
        let path = autotune::cache_dir().map(|d| d.join(autotune::file_name(dev, "cores")));
        if let Some(kept) = path.as_ref().and_then(|p| read_kept(p)) {
            return kept;
        }
        match measure(dev) {
            Ok(measured) => {
                // A file that cannot be written costs only the measurement next time.
                if let Some(p) = &path {
                    let _ = write_kept(dev, p, measured);
                }
                measured
            }
            // A failed measurement (short of memory, say) leaves the rules without a count,
            // as before it, and no file: the next run measures again.
            Err(_) => None,
        }
    });
    if let Some(c) = cores {
        dev.set_measured_cores(c);
    }
    Ok(())
}

/// The count in a file `write_kept` wrote: `Some(Some(n))`, `Some(None)` for a measurement
/// that found none, `None` for a file that is missing or damaged (measured again).
fn read_kept(path: &std::path::Path) -> Option<Option<usize>> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_kept(&text)
}

fn parse_kept(text: &str) -> Option<Option<usize>> {
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let value = lines.next()?.trim();
    if lines.next().is_some() {
        return None;
    }
    if value == "none" {
        return Some(None);
    }
    let n: usize = value.parse().ok()?;
    (1..=MAX_COUNT).contains(&n).then_some(Some(n))
}

fn write_kept(dev: &Device, path: &std::path::Path, cores: Option<usize>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let i = dev.info();
    // Written whole under another name, then renamed: a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(
        f,
        "# wgrad {} cores measured on {} ({}, {})",
        env!("CARGO_PKG_VERSION"),
        i.name,
        i.backend,
        i.driver
    )?;
    match cores {
        Some(n) => writeln!(f, "{n}")?,
        None => writeln!(f, "none")?,
    }
    drop(f);
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times of `slots` workgroups a wave, `one` seconds a wave where each later wave adds
    /// `later` of it (1.0: one after the other; `reg` on the H200, two held at once: 0.55),
    /// with a slope inside a wave (clocks falling as more cores run), a launch cost and a
    /// jitter of up to 4% either way.
    fn waves(slots: usize, one: f64, later: f64) -> impl FnMut(usize) -> Result<f64> {
        move |t| {
            let waves = t.div_ceil(slots) as f64;
            let slope = 1.0 + 0.1 * ((t - 1) % slots) as f64 / slots as f64;
            let jitter = 1.0 + 0.08 * (((t * 7919) % 13) as f64 / 12.0 - 0.5);
            Ok(20e-6 + (1.0 + (waves - 1.0) * later) * one * slope * jitter)
        }
    }

    #[test]
    fn finds_the_last_count_of_the_first_wave() {
        for later in [1.0, 0.55] {
            for slots in [1, 2, 3, 28, 60, 96, 128, 132, 264, 1000, MAX_COUNT] {
                let mut time = waves(slots, 150e-6, later);
                let mut calls = 0;
                let mut counted = |t: usize| {
                    calls += 1;
                    time(t)
                };
                let found = last_count_in_one_wave(MAX_COUNT, &mut counted).expect("search");
                if slots == MAX_COUNT {
                    // The step at MAX_COUNT + 1 is past the search.
                    assert_eq!(found, None);
                } else {
                    assert_eq!(found, Some(slots), "{slots} a wave, later waves {later}");
                }
                assert!(calls <= 2 * 12 + 3, "{calls} trials for {slots}");
            }
        }
    }

    #[test]
    fn a_smooth_time_gives_no_count() {
        // Each workgroup adds 20% (an adapter sharing its cores out in time): no step.
        let mut slope = |t: usize| Ok(100e-6 * (1.0 + 0.2 * (t - 1) as f64));
        assert_eq!(
            last_count_in_one_wave(MAX_COUNT, &mut slope).expect("search"),
            None
        );
        // Flat, then a ramp that crosses STEP gradually (2% a workgroup past 64): no count.
        let mut ramp = |t: usize| Ok(100e-6 * (1.0 + 0.02 * t.saturating_sub(64) as f64));
        assert_eq!(
            last_count_in_one_wave(MAX_COUNT, &mut ramp).expect("search"),
            None
        );
    }

    #[test]
    fn errors_from_timing_pass_through() {
        let mut failing = |t: usize| {
            if t > 8 {
                Err(crate::Error::DeviceLost("gone".into()))
            } else {
                Ok(1.0)
            }
        };
        assert!(last_count_in_one_wave(MAX_COUNT, &mut failing).is_err());
    }

    #[test]
    fn timed_tiles_cover_all_of_k_in_one_workgroup() {
        // One tile with a counted GPU would be split along K to fill the cores; timed on the
        // profile without a count, each workgroup covers all of K.
        let counted = DeviceProfile {
            cpu: false,
            cores: Some(132),
            subgroups: Some((32, 32)),
            f16: true,
            coop_f16_16: true,
            coop_bf16_16: false,
            spirv: true,
            workgroup_storage: 49152,
        };
        let (m, n) = TILING.tile();
        let p = mp::Problem::dense(DType::F16, (m, n, K_WIDE), (false, false));
        assert!(mp::launch(&p, &counted, TILING).splits > 1);
        let uncounted = DeviceProfile {
            cores: None,
            ..counted
        };
        assert!(mp::wide_runs(&uncounted, DType::F16));
        let plan = mp::launch(&p, &uncounted, TILING);
        assert_eq!((plan.splits, plan.tile), (1, (m, n)));
        // `reg`'s f32 tiles where `wide` does not run, likewise.
        let (m, n) = Config::Reg.tile();
        let p = mp::Problem::dense(DType::F32, (m, n, K_REG), (false, false));
        assert!(mp::launch(&p, &counted, Config::Reg).splits > 1);
        let plan = mp::launch(&p, &uncounted, Config::Reg);
        assert_eq!((plan.splits, plan.tile), (1, (m, n)));
    }

    #[test]
    fn kept_counts_read_back_and_damage_is_refused() {
        assert_eq!(parse_kept("# header\n132\n"), Some(Some(132)));
        assert_eq!(parse_kept("# header\nnone\n"), Some(None));
        for damaged in [
            "",
            "# header\n",
            "13x\n",
            "0\n",
            "132\n7\n",
            "99999999999999999999\n",
        ] {
            assert_eq!(parse_kept(damaged), None, "{damaged:?}");
        }
        assert_eq!(parse_kept(&format!("{}\n", MAX_COUNT + 1)), None);
    }
}
