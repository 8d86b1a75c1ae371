//! Kernel benchmark: one table (or JSON) of time, GFLOP/s or GB/s per kernel and size, with a
//! spot check of every result against an f64 CPU computation.
//!
//! ```text
//! cargo run --release --example bench -- [--json] [--quick]
//!     [--matmul 4096x4096x4096,...] [--attn 4x16x2048x64,...] [--conv 32x64x56x56x64x3,...]
//!     [--rows 4096x4096,...] [--elems 67108864] [--dtypes f32,f16,bf16] [--ms 300]
//!     [--warm-ms 250] [--profile] [--rounds 1]
//! ```
//!
//! Every size is given as a flag, so the same binary measures lavapipe (`--quick`) and a
//! datacenter GPU. Times are medians of 5 runs of a loop sized to take about `--ms`
//! milliseconds, synchronised before the clock stops, after `--warm-ms` of untimed runs. The
//! `copy` row is the driver's buffer-to-buffer copy of the same device: the memory-bandwidth
//! ceiling for the GB/s rows.

use std::time::Instant;
use wgrad::kernels::matmul::{Config, Operands, chosen, forced, plan};
use wgrad::ops::{Conv2dOpts, MatmulOpts};
use wgrad::{DType, Device, MatmulPrecision, Result, Tensor};

struct Row {
    name: String,
    shape: String,
    dtype: DType,
    ms: f64,
    rate: f64,
    unit: &'static str,
    check: String,
}

/// Kernel benchmark: time, GFLOP/s or GB/s per kernel and size, each result spot-checked
/// against an f64 CPU computation. Sizes are lists like 4096x4096x4096,1024x1024x1024.
#[derive(clap::Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Small sizes for CPU adapters (lavapipe); sizes given as options still win.
    #[arg(long)]
    quick: bool,
    /// Matrix products MxNxK [default: 1024x1024x1024,4096x4096x4096].
    #[arg(long, value_parser = dims)]
    matmul: Option<Sizes>,
    /// Attention BxHxSxD [default: 4x16x1024x64,2x16x4096x128].
    #[arg(long, value_parser = dims)]
    attn: Option<Sizes>,
    /// Convolutions NxCxHxWxOxK [default: 32x64x56x56x64x3].
    #[arg(long, value_parser = dims)]
    conv: Option<Sizes>,
    /// Row ops (softmax, column sums, norms) RxC [default: 4096x4096].
    #[arg(long, value_parser = dims)]
    rows: Option<Sizes>,
    /// Elements for the elementwise and copy rows [default: 67108864].
    #[arg(long)]
    elems: Option<usize>,
    /// Dtypes to measure: f32, f16, bf16.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    dtypes: Vec<DType>,
    /// Milliseconds each measurement loops for [default: 300].
    #[arg(long)]
    ms: Option<f64>,
    /// Milliseconds each measurement runs untimed first, for the GPU's clocks [default: 250;
    /// 0 with --quick].
    #[arg(long)]
    warm_ms: Option<f64>,
    /// Also print, on stderr, the GPU time of every kernel of one convolution forward and
    /// backward, and of one A^T B product (where the time goes).
    #[arg(long)]
    profile: bool,
    /// Rounds of the forced tensor-core tiling rows, each round starting one tiling later in
    /// the list, every round's rows printed: under sustained load the GPU's clocks fall, so a
    /// tiling's place in one round can decide a comparison of a few percent [default: 1].
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

/// A list of sizes, each a list of dimensions.
#[derive(Clone, Debug)]
struct Sizes(Vec<Vec<usize>>);

fn dims(s: &str) -> std::result::Result<Sizes, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split('x')
                .map(|d| d.parse().map_err(|_| format!("{p:?}: {d:?} is not a size")))
                .collect()
        })
        .collect::<std::result::Result<_, _>>()
        .map(Sizes)
}

/// The sizes to run: defaults (or --quick's), then what the command line gave.
struct Plan {
    json: bool,
    matmul: Vec<Vec<usize>>,
    attn: Vec<Vec<usize>>,
    conv: Vec<Vec<usize>>,
    rows: Vec<Vec<usize>>,
    elems: usize,
    dtypes: Vec<DType>,
    ms: Budget,
    profile: bool,
    rounds: usize,
}

/// How long each measurement is timed for, and how long it runs untimed first.
#[derive(Clone, Copy)]
struct Budget {
    ms: f64,
    warm_ms: f64,
}

fn parse() -> Plan {
    let a = <Args as clap::Parser>::parse();
    let d = |s: &str| dims(s).map(|x| x.0).unwrap_or_default();
    let (matmul, attn, conv, rows, elems, ms, warm_ms) = if a.quick {
        (
            d("256x256x256,255x257x129"),
            d("1x4x256x64"),
            d("4x16x28x28x16x3"),
            d("256x1000"),
            1 << 23,
            150.0,
            0.0,
        )
    } else {
        (
            d("1024x1024x1024,4096x4096x4096"),
            d("4x16x1024x64,2x16x4096x128"),
            d("32x64x56x56x64x3"),
            d("4096x4096"),
            1 << 26,
            300.0,
            250.0,
        )
    };
    Plan {
        json: a.json,
        matmul: a.matmul.map_or(matmul, |s| s.0),
        attn: a.attn.map_or(attn, |s| s.0),
        conv: a.conv.map_or(conv, |s| s.0),
        rows: a.rows.map_or(rows, |s| s.0),
        elems: a.elems.unwrap_or(elems),
        dtypes: a.dtypes,
        ms: Budget {
            ms: a.ms.unwrap_or(ms),
            warm_ms: a.warm_ms.unwrap_or(warm_ms),
        },
        profile: a.profile,
        rounds: a.rounds.max(1),
    }
}

/// A row for a product of (m, n, k): its rate in GFLOP/s.
fn gemm_row(
    name: impl Into<String>,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    ms: f64,
    check: String,
) -> Row {
    Row {
        name: name.into(),
        shape: format!("{m}x{n}x{k}"),
        dtype,
        ms,
        rate: 2.0 * (m * n * k) as f64 / ms / 1e6,
        unit: "GFLOP/s",
        check,
    }
}

/// Median milliseconds of one call of `f`, timed in 5 loops of about `b.ms / 5` each after
/// `b.warm_ms` of untimed calls.
///
/// The untimed runs are for the GPU's clocks, which fall while the host works without it and
/// rise again only under load. Compiling the attention backward's kernels with the driver's
/// shader cache empty can keep a GPU idle long enough that its next row, timed at once, runs
/// every kernel well below speed, its clock not yet back up.
fn time(dev: &Device, b: Budget, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    // Milliseconds of `k` calls, synchronised.
    let mut run = |k: usize| -> Result<f64> {
        let t0 = Instant::now();
        for _ in 0..k {
            f()?;
        }
        dev.sync()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    run(1)?;
    let mut one = run(1)?;
    if b.warm_ms > 0.0 {
        let chunk = ((b.warm_ms / 4.0 / one.max(1e-3)) as usize).clamp(1, 10_000);
        let mut warmed = 0.0;
        while warmed < b.warm_ms {
            warmed += run(chunk)?;
        }
        one = run(1)?;
    }
    let n = ((b.ms / 5.0 / one.max(1e-3)) as usize).clamp(1, 10_000);
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(run(n)? / n as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    Ok(runs[2])
}

/// [`time`] with convolutions on the column-matrix path.
fn time_with_im2col(dev: &Device, b: Budget, f: impl FnMut() -> Result<()>) -> Result<f64> {
    wgrad::ops::conv::with_im2col(|| time(dev, b, f))
}

/// Deterministic inputs in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn to_dtype(v: &[f32], dt: DType) -> Vec<f64> {
    v.iter()
        .map(|&x| {
            if dt == DType::F16 {
                half::f16::from_f32(x).to_f64()
            } else {
                x as f64
            }
        })
        .collect()
}

fn max_rel(pairs: impl Iterator<Item = (f64, f64)>) -> String {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in pairs {
        if !g.is_finite() {
            return "NaN!".into();
        }
        num = num.max((g - w).abs());
        den = den.max(w.abs());
    }
    format!("{:.1e}", num / den.max(1e-30))
}

fn emit(rows: &mut Vec<Row>, r: Row) {
    eprintln!(
        "{:<28} {:<26} {:<5} {:>10.4} ms {:>12.1} {:<8} {:>9}",
        r.name, r.shape, r.dtype, r.ms, r.rate, r.unit, r.check
    );
    rows.push(r);
}

/// Runs one measurement; a failure becomes a row saying so instead of ending the run.
fn guarded(
    rows: &mut Vec<Row>,
    name: &str,
    shape: String,
    dtype: DType,
    f: impl FnOnce(&mut Vec<Row>) -> Result<()>,
) {
    if let Err(e) = f(rows) {
        let msg: String = e.to_string().chars().take(120).collect();
        emit(
            rows,
            Row {
                name: name.into(),
                shape,
                dtype,
                ms: f64::NAN,
                rate: f64::NAN,
                unit: "",
                check: format!("ERROR {msg}"),
            },
        );
    }
}

fn main() -> Result<()> {
    let a = parse();
    let dev = Device::new()?;
    if !a.json {
        println!("{}\n", dev.info());
    }
    let mut rows: Vec<Row> = Vec::new();

    // Memory-bandwidth ceiling: the driver's copy of the same bytes. Tensors of 10 MiB or more
    // get pages of their own, which a buffer-to-buffer copy needs.
    for &dt in &a.dtypes {
        guarded(&mut rows, "copy/add", format!("{}", a.elems), dt, |rows| {
            let n = a.elems.max((10 << 20) / dt.size());
            dev.empty_cache();
            let x = Tensor::zeros(&dev, &[n], dt)?;
            let y = Tensor::zeros(&dev, &[n], dt)?;
            let bytes = 2.0 * x.nbytes() as f64;
            let ms = time(&dev, a.ms, || wgrad::testing::raw_copy(&x, &y))?;
            emit(
                rows,
                Row {
                    name: "copy".into(),
                    shape: format!("{n}"),
                    dtype: dt,
                    ms,
                    rate: bytes / ms / 1e6,
                    unit: "GB/s",
                    check: "-".into(),
                },
            );
            // The same bytes through a compute kernel (wgpu's buffer copy is not always the
            // fastest way to move memory on a GPU).
            let kms = time(&dev, a.ms, || x.copy().map(drop))?;
            let k = Row {
                name: "copy (kernel)".into(),
                shape: format!("{n}"),
                dtype: dt,
                ms: kms,
                rate: bytes / kms / 1e6,
                unit: "GB/s",
                check: "-".into(),
            };
            emit(rows, k);

            let xv = data(n, 1);
            let x = Tensor::from_f32(&dev, &xv, &[n], dt)?;
            let yv = data(n, 2);
            let y = Tensor::from_f32(&dev, &yv, &[n], dt)?;
            let ms = time(&dev, a.ms, || x.add(&y).map(drop))?;
            let z = x.add(&y)?.to_f32_vec()?;
            let (rx, ry) = (to_dtype(&xv, dt), to_dtype(&yv, dt));
            let check = max_rel((0..n).step_by(997).map(|i| (z[i] as f64, rx[i] + ry[i])));
            emit(
                rows,
                Row {
                    name: "add".into(),
                    shape: format!("{n}"),
                    dtype: dt,
                    ms,
                    rate: 3.0 * x.nbytes() as f64 / ms / 1e6,
                    unit: "GB/s",
                    check,
                },
            );
            Ok(())
        });
    }

    for &dt in &a.dtypes {
        for s in &a.rows {
            guarded(&mut rows, "softmax", format!("{s:?}"), dt, |rows| {
                let (r, l) = (s[0], s[1]);
                let xv = data(r * l, 3);
                let x = Tensor::from_f32(&dev, &xv, &[r, l], dt)?;
                let ms = time(&dev, a.ms, || x.softmax().map(drop))?;
                let y = x.softmax()?.to_f32_vec()?;
                let rx = to_dtype(&xv, dt);
                let check_rows = [0, r / 2, r - 1];
                let mut pairs = Vec::new();
                for &ri in &check_rows {
                    let want = wgrad::reference::softmax(&rx[ri * l..(ri + 1) * l], 1, l, false);
                    pairs.extend((0..l).map(|i| (y[ri * l + i] as f64, want[i])));
                }
                let check = max_rel(pairs.into_iter());
                emit(
                    rows,
                    Row {
                        name: "softmax".into(),
                        shape: format!("{r}x{l}"),
                        dtype: dt,
                        ms,
                        rate: 2.0 * x.nbytes() as f64 / ms / 1e6,
                        unit: "GB/s",
                        check,
                    },
                );

                // Column sums (a bias gradient's reduction: rows summed per column), checked
                // on three columns.
                let ms = time(&dev, a.ms, || x.sum(0, false).map(drop))?;
                let y = x.sum(0, false)?.to_f32_vec()?;
                let check = max_rel(
                    [0, l / 2, l - 1]
                        .into_iter()
                        .map(|c| (y[c] as f64, (0..r).map(|ri| rx[ri * l + c]).sum::<f64>())),
                );
                emit(
                    rows,
                    Row {
                        name: "column sum".into(),
                        shape: format!("{r}x{l}"),
                        dtype: dt,
                        ms,
                        rate: x.nbytes() as f64 / ms / 1e6,
                        unit: "GB/s",
                        check,
                    },
                );

                let g = Tensor::ones(&dev, &[l], dt)?;
                let b = Tensor::zeros(&dev, &[l], dt)?;
                let ms = time(&dev, a.ms, || x.layer_norm(&g, &b, 1e-5).map(drop))?;
                emit(
                    rows,
                    Row {
                        name: "layer_norm".into(),
                        shape: format!("{r}x{l}"),
                        dtype: dt,
                        ms,
                        rate: 2.0 * x.nbytes() as f64 / ms / 1e6,
                        unit: "GB/s",
                        check: "-".into(),
                    },
                );
                Ok(())
            });
        }
    }

    for &dt in &a.dtypes {
        for s in &a.matmul {
            guarded(&mut rows, "matmul", format!("{s:?}"), dt, |rows| {
                let (m, n, k) = (s[0], s[1], s[2]);
                let (av, bv) = (data(m * k, 4), data(k * n, 5));
                let ta = Tensor::from_f32(&dev, &av, &[m, k], dt)?;
                let tb = Tensor::from_f32(&dev, &bv, &[k, n], dt)?;
                let ms = time(&dev, a.ms, || ta.matmul(&tb).map(drop))?;
                let (ra, rb) = (to_dtype(&av, dt), to_dtype(&bv, dt));
                // The largest error of 64 sampled outputs against f64 sums.
                let checked = |c: &[f32]| {
                    max_rel((0..64).map(|t| {
                        let (i, j) = ((t * 7919) % m, (t * 104_729) % n);
                        (
                            c[i * n + j] as f64,
                            (0..k).map(|p| ra[i * k + p] * rb[p * n + j]).sum(),
                        )
                    }))
                };
                let check = checked(&ta.matmul(&tb)?.to_f32_vec()?);
                // The kernel that ran: the size rules' choice, or the tuner's where it measured.
                let cfg = match chosen(&dev, dt, (m, n, k), &Operands::dense(m, n, k, false, false))
                {
                    Config::CoopTiled => "matmul (tensor cores, tiled)".to_string(),
                    Config::CoopWide => "matmul (tensor cores, tiled, 16-byte runs)".to_string(),
                    Config::CoopWideTall => "matmul (tensor cores, 256x128 tiles)".to_string(),
                    Config::CoopWideFlat => "matmul (tensor cores, 128x256 tiles)".to_string(),
                    Config::CoopWideMid => "matmul (tensor cores, 128x192 tiles)".to_string(),
                    Config::CoopDirect => "matmul (tensor cores, direct)".to_string(),
                    Config::Coop => "matmul (tensor cores, any shape)".to_string(),
                    Config::Tiled(bm, bn, ..) => format!("matmul (tiled {bm}x{bn})"),
                    Config::Simt(tm, tn) => format!("matmul (simt {tm}x{tn})"),
                    Config::SimtN4(tm, tn4) => format!("matmul (simt {tm}x{}, 4-wide N)", 4 * tn4),
                    Config::SimtK4(tm, tn) => format!("matmul (simt {tm}x{tn}, 4-wide K)"),
                    Config::Reg => "matmul (tiled 128x128, 8x8 a thread)".to_string(),
                };
                // Where `reg` runs, the 64 x 64 tiles it replaced, timed beside it; where
                // the tensor cores run, each of their kernels (`main` stages tiles in
                // workgroup memory, `wide` stages them in 16-byte runs through wgrad's own
                // SPIR-V, `direct` loads fragments from the buffers) on each layout.
                let plain = plan(&dev, dt, (m, n, k), &Operands::dense(m, n, k, false, false));
                let tc = matches!(
                    plain,
                    Config::CoopTiled
                        | Config::CoopWide
                        | Config::CoopWideTall
                        | Config::CoopWideFlat
                        | Config::CoopWideMid
                        | Config::CoopDirect
                );
                let side = |rows: &mut Vec<Row>,
                            name: &str,
                            config: Config,
                            f: &dyn Fn() -> Result<()>|
                 -> Result<()> {
                    let ms = forced(config, || time(&dev, a.ms, f))??;
                    emit(rows, gemm_row(name, (m, n, k), dt, ms, "-".into()));
                    Ok(())
                };
                // Every tensor-core kernel and tiling forced in turn, as "<what> (forced ...)",
                // in `--rounds` rounds each starting one later in the list.
                let forced_tc =
                    |rows: &mut Vec<Row>, what: &str, f: &dyn Fn() -> Result<()>| -> Result<()> {
                        let all = [
                            ("main", Config::CoopTiled),
                            ("wide", Config::CoopWide),
                            ("wide 256x128", Config::CoopWideTall),
                            ("wide 128x256", Config::CoopWideFlat),
                            ("wide 128x192", Config::CoopWideMid),
                            ("direct", Config::CoopDirect),
                        ];
                        for round in 0..a.rounds {
                            for j in 0..all.len() {
                                let (tiling, config) = all[(j + round) % all.len()];
                                side(rows, &format!("{what} (forced {tiling})"), config, f)?;
                            }
                        }
                        Ok(())
                    };
                if tc {
                    forced_tc(rows, "matmul", &|| ta.matmul(&tb).map(drop))?;
                }
                // A thin f32 product (M <= 64) runs 64 x 64 tiles; `reg`'s 64-row tiles,
                // which the f32 convolutions' implicit products take, timed beside it.
                if !tc && plain != Config::Reg && m <= 64 && dt == DType::F32 {
                    side(rows, "matmul (forced reg)", Config::Reg, &|| {
                        ta.matmul(&tb).map(drop)
                    })?;
                }
                if plain == Config::Reg {
                    let old = Config::Tiled(64, 64, 16, 4, 4);
                    let ms = forced(old, || time(&dev, a.ms, || ta.matmul(&tb).map(drop)))??;
                    emit(
                        rows,
                        gemm_row(
                            "matmul (tiled 64x64, as before reg)",
                            (m, n, k),
                            dt,
                            ms,
                            "-".into(),
                        ),
                    );
                }
                emit(rows, gemm_row(cfg, (m, n, k), dt, ms, check));

                let w = Tensor::from_f32(&dev, &data(n * k, 6), &[n, k], dt)?;
                let x = Tensor::from_f32(&dev, &data(m * k, 7), &[m, k], dt)?;
                let bias = Tensor::zeros(&dev, &[n], dt)?;
                let lin = || {
                    x.matmul_with(
                        &w,
                        MatmulOpts {
                            trans_b: true,
                            bias: Some(&bias),
                            act: Some(wgrad::Activation::Relu),
                            ..Default::default()
                        },
                    )
                    .map(drop)
                };
                let ms = time(&dev, a.ms, lin)?;
                if tc {
                    // What a linear layer's forward costs beyond A B: W read transposed, and the
                    // bias in the epilogue, each alone.
                    let xwt = || {
                        x.matmul_with(
                            &w,
                            MatmulOpts {
                                trans_b: true,
                                ..Default::default()
                            },
                        )
                        .map(drop)
                    };
                    side(rows, "linear (x W^T alone, wide)", Config::CoopWide, &xwt)?;
                    let ab_bias = || {
                        ta.matmul_with(
                            &tb,
                            MatmulOpts {
                                bias: Some(&bias),
                                ..Default::default()
                            },
                        )
                        .map(drop)
                    };
                    side(
                        rows,
                        "linear (A B + bias, wide)",
                        Config::CoopWide,
                        &ab_bias,
                    )?;
                    forced_tc(rows, "linear", &lin)?;
                }
                emit(
                    rows,
                    gemm_row("linear+bias+relu", (m, n, k), dt, ms, "-".into()),
                );
                // A weight gradient's shape: op(A) = A^T (A stored K x M).
                let at = Tensor::from_f32(&dev, &data(k * m, 8), &[k, m], dt)?;
                let atb = || {
                    at.matmul_with(
                        &tb,
                        MatmulOpts {
                            trans_a: true,
                            ..Default::default()
                        },
                    )
                    .map(drop)
                };
                let ms = time(&dev, a.ms, atb)?;
                if a.profile {
                    dev.start_profiling()?;
                    atb()?;
                    eprintln!("matmul A^T B {m}x{n}x{k} {dt}:\n{}", dev.stop_profiling()?);
                }
                if tc {
                    forced_tc(rows, "matmul A^T B", &atb)?;
                }
                emit(
                    rows,
                    gemm_row("matmul A^T B", (m, n, k), dt, ms, "-".into()),
                );
                // f32 on f16 tensor cores (`MatmulPrecision::High`): the same three products
                // as three f16 products of split operands, with the same check.
                let f16_tc = matches!(
                    plan(
                        &dev,
                        DType::F16,
                        (m, n, k),
                        &Operands::dense(m, n, k, false, false)
                    ),
                    Config::CoopTiled
                        | Config::CoopWide
                        | Config::CoopWideTall
                        | Config::CoopWideFlat
                        | Config::CoopWideMid
                        | Config::CoopDirect
                );
                if dt == DType::F32 && f16_tc {
                    dev.set_matmul_precision(MatmulPrecision::High);
                    let high = (|| -> Result<()> {
                        let ms = time(&dev, a.ms, || ta.matmul(&tb).map(drop))?;
                        let check = checked(&ta.matmul(&tb)?.to_f32_vec()?);
                        let name = "matmul High (split f32)";
                        emit(rows, gemm_row(name, (m, n, k), dt, ms, check));
                        let ms = time(&dev, a.ms, lin)?;
                        let name = "linear+bias+relu High (split f32)";
                        emit(rows, gemm_row(name, (m, n, k), dt, ms, "-".into()));
                        let ms = time(&dev, a.ms, atb)?;
                        let name = "matmul A^T B High (split f32)";
                        emit(rows, gemm_row(name, (m, n, k), dt, ms, "-".into()));
                        Ok(())
                    })();
                    dev.set_matmul_precision(MatmulPrecision::Highest);
                    high?;
                }
                Ok(())
            });
        }
    }

    for &dt in &a.dtypes {
        for s in &a.conv {
            guarded(&mut rows, "conv2d", format!("{s:?}"), dt, |rows| {
                let (n, c, h, w, o, k) = (s[0], s[1], s[2], s[3], s[4], s[5]);
                let xv = data(n * c * h * w, 8);
                let wv = data(o * c * k * k, 9);
                let x = Tensor::from_f32(&dev, &xv, &[n, c, h, w], dt)?;
                let wt = Tensor::from_f32(&dev, &wv, &[o, c, k, k], dt)?;
                let opts = Conv2dOpts {
                    padding: (k / 2, k / 2),
                    ..Default::default()
                };
                // The column-matrix path timed beside the chosen one (the same where no
                // implicit product applies).
                let cols = time_with_im2col(&dev, a.ms, || x.conv2d(&wt, None, opts).map(drop))?;
                let ms = time(&dev, a.ms, || x.conv2d(&wt, None, opts).map(drop))?;
                let y = x.conv2d(&wt, None, opts)?;
                let (ho, wo) = (y.shape()[2], y.shape()[3]);
                let yv = y.to_f32_vec()?;
                let (rx, rw) = (to_dtype(&xv, dt), to_dtype(&wv, dt));
                let check = max_rel((0..32).map(|t| {
                    let (ni, oi, yi, xi) = (t % n, (t * 7) % o, (t * 13) % ho, (t * 29) % wo);
                    let mut s = 0.0;
                    for ci in 0..c {
                        for ki in 0..k {
                            for kj in 0..k {
                                let (ih, iw) = (
                                    yi as isize + ki as isize - (k / 2) as isize,
                                    xi as isize + kj as isize - (k / 2) as isize,
                                );
                                if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < w {
                                    s += rx[((ni * c + ci) * h + ih as usize) * w + iw as usize]
                                        * rw[((oi * c + ci) * k + ki) * k + kj];
                                }
                            }
                        }
                    }
                    (yv[((ni * o + oi) * ho + yi) * wo + xi] as f64, s)
                }));
                let flops = 2.0 * (n * o * ho * wo * c * k * k) as f64;
                let shape = format!("{n}x{c}x{h}x{w} -> {o}, {k}x{k}");
                emit(
                    rows,
                    Row {
                        name: "conv2d (im2col)".into(),
                        shape: shape.clone(),
                        dtype: dt,
                        ms: cols,
                        rate: flops / cols / 1e6,
                        unit: "GFLOP/s",
                        check: "-".into(),
                    },
                );
                emit(
                    rows,
                    Row {
                        name: "conv2d".into(),
                        shape: shape.clone(),
                        dtype: dt,
                        ms,
                        rate: flops / ms / 1e6,
                        unit: "GFLOP/s",
                        check,
                    },
                );
                // A training step's share: forward, then the gradients of input and weight
                // (each a product of the forward's size, so 3x its operations).
                let (xg, wg) = (x.variable(), wt.variable());
                let dy = Tensor::ones(&dev, &[n, o, ho, wo], dt)?;
                let step = || {
                    xg.conv2d(&wg, None, opts)?.backward_with(&dy)?;
                    xg.zero_grad();
                    wg.zero_grad();
                    Ok(())
                };
                let cols = time_with_im2col(&dev, a.ms, step)?;
                let ms = time(&dev, a.ms, step)?;
                if a.profile {
                    dev.start_profiling()?;
                    wgrad::ops::conv::with_im2col(step)?;
                    eprintln!(
                        "conv2d fwd+bwd (im2col) {shape} {dt}:\n{}",
                        dev.stop_profiling()?
                    );
                    dev.start_profiling()?;
                    step()?;
                    let prof = dev.stop_profiling()?;
                    eprintln!("conv2d fwd+bwd {shape} {dt}:\n{prof}");
                    // The dispatches in order (the forward's product, then the gradients').
                    for e in &prof.events {
                        eprintln!("  {:<28} {:9.1} us", e.kernel, e.dur_us);
                    }
                }
                emit(
                    rows,
                    Row {
                        name: "conv2d fwd+bwd (im2col)".into(),
                        shape: shape.clone(),
                        dtype: dt,
                        ms: cols,
                        rate: 3.0 * flops / cols / 1e6,
                        unit: "GFLOP/s",
                        check: "-".into(),
                    },
                );
                emit(
                    rows,
                    Row {
                        name: "conv2d fwd+bwd".into(),
                        shape,
                        dtype: dt,
                        ms,
                        rate: 3.0 * flops / ms / 1e6,
                        unit: "GFLOP/s",
                        check: "-".into(),
                    },
                );
                Ok(())
            });
        }
    }

    for &dt in &a.dtypes {
        for s in &a.attn {
            guarded(&mut rows, "attention", format!("{s:?}"), dt, |rows| {
                let (b, h, sl, d) = (s[0], s[1], s[2], s[3]);
                let sz = b * h * sl * d;
                let (qv, kv, vv) = (data(sz, 10), data(sz, 11), data(sz, 12));
                let q = Tensor::from_f32(&dev, &qv, &[b, h, sl, d], dt)?;
                let kt = Tensor::from_f32(&dev, &kv, &[b, h, sl, d], dt)?;
                let v = Tensor::from_f32(&dev, &vv, &[b, h, sl, d], dt)?;
                for causal in [false, true] {
                    let ms = time(&dev, a.ms, || {
                        Tensor::attention(&q, &kt, &v, causal, None).map(drop)
                    })?;
                    let o = Tensor::attention(&q, &kt, &v, causal, None)?.to_f32_vec()?;
                    // Check two query rows of the first head against the reference.
                    let (rq, rk, rv) = (
                        to_dtype(&qv[..sl * d], dt),
                        to_dtype(&kv[..sl * d], dt),
                        to_dtype(&vv[..sl * d], dt),
                    );
                    let mut pairs = Vec::new();
                    for &i in &[0, sl - 1] {
                        let qi = &rq[i * d..(i + 1) * d];
                        // A causal query sees keys 0..=i; otherwise all of them.
                        let nk = if causal { i + 1 } else { sl };
                        let want = wgrad::reference::attention(
                            qi,
                            &rk[..nk * d],
                            &rv[..nk * d],
                            1,
                            1,
                            nk,
                            d,
                            false,
                            1.0 / (d as f64).sqrt(),
                        );
                        pairs.extend((0..d).map(|t| (o[i * d + t] as f64, want[t])));
                    }
                    let check = max_rel(pairs.into_iter());
                    let flops = 4.0 * (b * h * sl * sl * d) as f64 * if causal { 0.5 } else { 1.0 };
                    emit(
                        rows,
                        Row {
                            name: format!(
                                "attention fwd{}{}",
                                if causal { " causal" } else { "" },
                                if wgrad::kernels::attention::uses_tensor_cores(&dev, dt, sl, sl, d)
                                {
                                    " (tc)"
                                } else {
                                    ""
                                }
                            ),
                            shape: format!("{b}x{h}x{sl}x{d}"),
                            dtype: dt,
                            ms,
                            rate: flops / ms / 1e6,
                            unit: "GFLOP/s",
                            check,
                        },
                    );
                }
                // Forward + backward (recomputing scores), causal.
                let (qg, kg, vg) = (q.variable(), kt.variable(), v.variable());
                let dout = Tensor::ones(&dev, &[b, h, sl, d], dt)?;
                let step = || {
                    let o = Tensor::attention(&qg, &kg, &vg, true, None)?;
                    o.backward_with(&dout)?;
                    qg.zero_grad();
                    kg.zero_grad();
                    vg.zero_grad();
                    Ok(())
                };
                let ms = time(&dev, a.ms, step)?;
                if a.profile {
                    dev.start_profiling()?;
                    step()?;
                    eprintln!(
                        "attention fwd+bwd causal {b}x{h}x{sl}x{d} {dt}:\n{}",
                        dev.stop_profiling()?
                    );
                }
                let flops = 4.0 * (b * h * sl * sl * d) as f64 * 0.5 * 3.5;
                emit(
                    rows,
                    Row {
                        name: "attention fwd+bwd causal".into(),
                        shape: format!("{b}x{h}x{sl}x{d}"),
                        dtype: dt,
                        ms,
                        rate: flops / ms / 1e6,
                        unit: "GFLOP/s",
                        check: "-".into(),
                    },
                );
                Ok(())
            });
        }
    }

    if a.json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "shape": r.shape,
                    "dtype": r.dtype.to_string(),
                    "ms": r.ms,
                    "rate": r.rate,
                    "unit": r.unit,
                    "check": r.check,
                })
            })
            .collect();
        let out = serde_json::json!({
            "adapter": dev.info().name,
            "backend": dev.info().backend,
            "driver": dev.info().driver,
            "rows": rows,
        });
        println!("{out}");
    } else {
        println!(
            "{:<28} {:<26} {:<5} {:>10} {:>12} {:<8} {:>9}",
            "kernel", "size", "dtype", "ms", "rate", "", "rel.err"
        );
        for r in &rows {
            println!(
                "{:<28} {:<26} {:<5} {:>10.4} {:>12.1} {:<8} {:>9}",
                r.name, r.shape, r.dtype, r.ms, r.rate, r.unit, r.check
            );
        }
        println!("\n{}", dev.memory_report());
    }
    // Time spent choosing kernels (measuring new shapes, or reading the cache file).
    eprintln!("autotune: {}", wgrad::kernels::autotune_stats(&dev)?);
    Ok(())
}
