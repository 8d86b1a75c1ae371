//! Indexing along an axis: gather, scatter-add, index-select and top-k, with gradients.
//!
//! Gather's gradient is a scatter-add of the output gradient into zeros, and scatter-add's
//! gradient for its source is a gather of the output gradient: the two kernels are each
//! other's backward. Top-k finds indices with its own kernel and takes its values with
//! gather, so its gradient is gather's. Scatter-add is deterministic (each output element is
//! summed by one thread in index order), unlike atomic scatters, so training runs repeat.

use super::elementwise::{float_only, same_device};
use super::embedding::check_indices;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::index::{self as ki, Axis};
use crate::ops::reduce::split3;
use crate::tensor::Tensor;
use crate::tensor::graph::record;

/// The checks every indexing op makes: float data, u32 indices, one device.
fn index_args(op: &'static str, x: &Tensor, index: &Tensor) -> Result<()> {
    float_only(op, x)?;
    if index.dtype() != DType::U32 {
        return Err(Error::DType {
            op,
            expected: DType::U32,
            got: index.dtype(),
        });
    }
    same_device(op, x, index)
}

/// `shape` seen as [outer, len, inner] around `axis`, indexed by `klen` positions.
fn axis_of(shape: &[usize], axis: usize, klen: usize, flat: bool) -> Axis {
    let (outer, len, inner) = split3(shape, axis);
    Axis {
        outer,
        len,
        klen,
        inner,
        flat,
    }
}

/// `dst` [outer, len, inner] = (`base` or zeros) + `src` [outer, klen, inner] summed into the
/// positions `idx` names along the middle axis; `shape` is the output's shape.
fn scatter_into(
    base: Option<&Tensor>,
    idx: &Tensor,
    src: &Tensor,
    shape: &[usize],
    ax: Axis,
) -> Result<Tensor> {
    let op = "scatter_add";
    let src = src.contiguous()?;
    let base = base.map(Tensor::contiguous).transpose()?;
    let out = Tensor::uninit(src.device(), shape, src.dtype())?;
    if out.numel() > 0 {
        ki::scatter_add(
            src.device(),
            base.as_ref().map(|b| b.dense_block(op)).transpose()?,
            idx.dense_block(op)?,
            src.dense_block(op)?,
            out.dense_block(op)?,
            src.dtype(),
            ax,
        )?;
    }
    Ok(out)
}

/// `x` [outer, len, inner] read at `idx` along the middle axis into `shape`.
fn gather_from(x: &Tensor, idx: &Tensor, shape: &[usize], ax: Axis) -> Result<Tensor> {
    let op = "gather";
    let x = x.contiguous()?;
    let out = Tensor::uninit(x.device(), shape, x.dtype())?;
    if out.numel() > 0 {
        ki::gather(
            x.device(),
            x.dense_block(op)?,
            idx.dense_block(op)?,
            out.dense_block(op)?,
            x.dtype(),
            ax,
        )?;
    }
    Ok(out)
}

impl Tensor {
    /// Elements picked along `axis` by a u32 `index` of the same rank, as PyTorch's
    /// `gather`: `out[i][j][k] = self[i][index[i][j][k]][k]` for axis 1. The result has
    /// `index`'s shape; along the other axes `index` may be shorter than `self`. An index past
    /// the axis reads as NaN, or is an error on a checked device.
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let op = "gather";
        index_args(op, self, index)?;
        let a = self.axis(axis, op)?;
        if index.rank() != self.rank()
            || (0..self.rank()).any(|d| d != a && index.shape()[d] > self.shape()[d])
        {
            return Err(Error::shape(
                op,
                format!(
                    "index {:?} must have the rank of {:?} and be no longer along the other axes",
                    index.shape(),
                    self.shape()
                ),
            ));
        }
        if self.device().is_checked() {
            check_indices(op, index, self.shape()[a])?;
        }
        // Cut self down to the index's extent along the other axes (a free view).
        let mut x = self.clone();
        for d in 0..self.rank() {
            if d != a && index.shape()[d] < self.shape()[d] {
                x = x.narrow(d as isize, 0, index.shape()[d])?;
            }
        }
        let ax = axis_of(x.shape(), a, index.shape()[a], false);
        let idx = index.contiguous()?;
        let out = gather_from(&x, &idx, index.shape(), ax)?;
        let node = record("gather", &[&x], || {
            move |xs: &[Tensor], _: &Tensor, g: Tensor| {
                Ok(vec![Some(scatter_into(None, &idx, &g, xs[0].shape(), ax)?)])
            }
        });
        Ok(out.with_node(node))
    }

    /// `self` with `src` added at the positions a u32 `index` names along `axis`, as
    /// PyTorch's out-of-place `scatter_add`: for axis 1,
    /// `out[i][index[i][j][k]][k] += src[i][j][k]`. `index` and `src` have one shape, which
    /// equals `self`'s except along `axis`. Repeated indices add up, in index order
    /// (deterministic); indices past the axis are skipped, or an error on a checked device.
    pub fn scatter_add(&self, axis: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = "scatter_add";
        index_args(op, self, index)?;
        same_device(op, self, src)?;
        if src.dtype() != self.dtype() {
            return Err(Error::DType {
                op,
                expected: self.dtype(),
                got: src.dtype(),
            });
        }
        let a = self.axis(axis, op)?;
        if index.shape() != src.shape()
            || index.rank() != self.rank()
            || (0..self.rank()).any(|d| d != a && index.shape()[d] != self.shape()[d])
        {
            return Err(Error::shape(
                op,
                format!(
                    "index {:?} and src {:?} must have one shape, equal to {:?} except along axis {a}",
                    index.shape(),
                    src.shape(),
                    self.shape()
                ),
            ));
        }
        if self.device().is_checked() {
            check_indices(op, index, self.shape()[a])?;
        }
        let ax = axis_of(self.shape(), a, index.shape()[a], false);
        let idx = index.contiguous()?;
        let out = scatter_into(Some(self), &idx, src, self.shape(), ax)?;
        let node = record("scatter_add", &[self, src], || {
            move |xs: &[Tensor], _: &Tensor, g: Tensor| {
                let gs = if xs[1].requires_grad() {
                    Some(gather_from(&g, &idx, xs[1].shape(), ax)?)
                } else {
                    None
                };
                Ok(vec![Some(g), gs])
            }
        });
        Ok(out.with_node(node))
    }

    /// The slices at u32 `indices` (one dimension) along `axis`, in that order, as
    /// PyTorch's `index_select`: the result has `self`'s shape with `axis` as long as
    /// `indices`. Indices may repeat (their gradients add up).
    pub fn index_select(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        let op = "index_select";
        index_args(op, self, indices)?;
        if indices.rank() != 1 {
            return Err(Error::shape(
                op,
                format!("indices {:?} must be one-dimensional", indices.shape()),
            ));
        }
        let a = self.axis(axis, op)?;
        if self.device().is_checked() {
            check_indices(op, indices, self.shape()[a])?;
        }
        let ax = axis_of(self.shape(), a, indices.numel(), true);
        let mut shape = self.shape().to_vec();
        shape[a] = indices.numel();
        let idx = indices.contiguous()?;
        let out = gather_from(self, &idx, &shape, ax)?;
        let node = record("index_select", &[self], || {
            move |xs: &[Tensor], _: &Tensor, g: Tensor| {
                Ok(vec![Some(scatter_into(None, &idx, &g, xs[0].shape(), ax)?)])
            }
        });
        Ok(out.with_node(node))
    }

    /// The `k` largest (or, with `largest` false, smallest) elements along `axis`, sorted,
    /// and their positions (u32), as PyTorch's `topk`. NaN counts as larger than every
    /// number; equal values come in their original order. The values carry gradients (to
    /// the chosen positions).
    pub fn topk(&self, k: usize, axis: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let op = "topk";
        float_only(op, self)?;
        let a = self.axis(axis, op)?;
        let len = self.shape()[a];
        if k > len {
            return Err(Error::invalid(
                op,
                format!("k = {k} is more than the {len} elements along axis {a}"),
            ));
        }
        // Rows along the last axis: move `axis` there (a copy when it is not already).
        let last = self.rank() - 1;
        let moved = if a == last {
            self.clone()
        } else {
            self.transpose(a as isize, last as isize)?
        };
        let rows_x = moved.contiguous()?;
        let rows = rows_x.numel() / len.max(1);
        let mut shape = moved.shape().to_vec();
        shape[last] = k;
        let idx = Tensor::uninit(self.device(), &shape, DType::U32)?;
        if rows * k > 0 {
            ki::topk_indices(
                self.device(),
                rows_x.dense_block(op)?,
                self.dtype(),
                idx.dense_block(op)?,
                rows,
                len,
                k,
                largest,
            )?;
        }
        let vals = moved.gather(last as isize, &idx)?;
        if a == last {
            Ok((vals, idx))
        } else {
            Ok((
                vals.transpose(a as isize, last as isize)?,
                idx.transpose(a as isize, last as isize)?.contiguous()?,
            ))
        }
    }
}

/// f64 references, checked against the kernels on random inputs at awkward sizes, on a
/// poisoned device, in f32, f16 and bf16, past the loop budget, and by finite differences.
#[cfg(test)]
mod tests {
    use crate::{DType, Device, DeviceOptions, Tensor};

    /// Gather along the middle axis of [outer, len, inner] by [outer, klen, inner].
    fn gather_ref(
        x: &[f64],
        idx: &[u32],
        (o, len, inner): (usize, usize, usize),
        klen: usize,
    ) -> Vec<f64> {
        let mut y = vec![0.0; o * klen * inner];
        for a in 0..o {
            for k in 0..klen {
                for i in 0..inner {
                    let t = (a * klen + k) * inner + i;
                    y[t] = x[(a * len + idx[t] as usize) * inner + i];
                }
            }
        }
        y
    }

    /// Scatter-add of [outer, klen, inner] into base [outer, len, inner].
    fn scatter_ref(
        base: &[f64],
        idx: &[u32],
        src: &[f64],
        (o, len, inner): (usize, usize, usize),
        klen: usize,
    ) -> Vec<f64> {
        let mut y = base.to_vec();
        for a in 0..o {
            for k in 0..klen {
                for i in 0..inner {
                    let t = (a * klen + k) * inner + i;
                    y[(a * len + idx[t] as usize) * inner + i] += src[t];
                }
            }
        }
        y
    }

    fn device() -> Device {
        let mut o = DeviceOptions::from_env().expect("WGRAD_* variables");
        o.poison = true;
        Device::with_options(o).expect("a wgpu adapter")
    }

    /// Deterministic xorshift stream.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn uniform(&mut self, n: usize) -> Vec<f32> {
            (0..n)
                .map(|_| (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
                .collect()
        }
        fn below(&mut self, n: usize, bound: usize) -> Vec<u32> {
            (0..n)
                .map(|_| (self.next() % bound as u64) as u32)
                .collect()
        }
    }

    fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
    }

    fn tol(dt: DType) -> f64 {
        match dt {
            DType::F32 => 1e-6,
            DType::F16 => 2e-3,
            _ => 1.6e-2,
        }
    }

    /// The values the device holds for `x` in `dt`.
    fn held(dev: &Device, x: &[f32], shape: &[usize], dt: DType) -> (Tensor, Vec<f64>) {
        let t = Tensor::from_f32(dev, x, shape, dt).expect("upload");
        let v = t
            .to_f32_vec()
            .expect("read")
            .iter()
            .map(|&v| v as f64)
            .collect();
        (t, v)
    }

    #[test]
    fn gather_and_scatter_match_reference() {
        let dev = device();
        let mut rng = Rng(0x5eed);
        // (outer, len, klen, inner): awkward sizes, and an index axis past the loop budget
        // (scatter loops over it in chunks).
        let cases = [
            (1, 1, 1, 1),
            (3, 17, 5, 1),
            (2, 3, 127, 3),
            (1, 1000, 17, 2),
            (1, 3, 20_001, 1),
        ];
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for &(o, len, klen, inner) in &cases {
                let what = format!("{dt} outer {o} len {len} klen {klen} inner {inner}");
                let (x, xv) = held(&dev, &rng.uniform(o * len * inner), &[o, len, inner], dt);
                let iv = rng.below(o * klen * inner, len);
                let idx = Tensor::from_slice(&dev, &iv, &[o, klen, inner]).expect("upload");
                let got = x.gather(1, &idx).expect("gather");
                assert_eq!(got.shape(), &[o, klen, inner]);
                // A gather copies values: exact in every dtype.
                close(
                    &got.to_f32_vec().expect("read"),
                    &gather_ref(&xv, &iv, (o, len, inner), klen),
                    0.0,
                    &what,
                );
                let (src, sv) = held(&dev, &rng.uniform(o * klen * inner), &[o, klen, inner], dt);
                let got = x.scatter_add(1, &idx, &src).expect("scatter_add");
                let want = scatter_ref(&xv, &iv, &sv, (o, len, inner), klen);
                // Sums of up to klen / len terms, rounded once to the dtype at the end.
                let terms = (klen / len).max(1) as f64;
                close(
                    &got.to_f32_vec().expect("read"),
                    &want,
                    tol(dt) + 1e-7 * terms,
                    &what,
                );
                // index_select by a list: a gather with the list repeated.
                let list = rng.below(klen, len);
                let li = Tensor::from_slice(&dev, &list, &[klen]).expect("upload");
                let got = x.index_select(1, &li).expect("index_select");
                let rep: Vec<u32> = (0..o * klen * inner)
                    .map(|t| list[(t / inner) % klen])
                    .collect();
                close(
                    &got.to_f32_vec().expect("read"),
                    &gather_ref(&xv, &rep, (o, len, inner), klen),
                    0.0,
                    &what,
                );
            }
        }
    }

    #[test]
    fn gather_with_a_shorter_index_and_negative_axis() {
        let dev = device();
        // PyTorch's example: gather(t, 1, [[0, 0], [1, 0]]) on [[1, 2], [3, 4]].
        let t = Tensor::from_slice(&dev, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).expect("upload");
        let i = Tensor::from_slice(&dev, &[0u32, 0, 1, 0], &[2, 2]).expect("upload");
        assert_eq!(
            t.gather(-1, &i)
                .expect("gather")
                .to_vec::<f32>()
                .expect("read"),
            [1.0, 1.0, 4.0, 3.0]
        );
        // An index shorter along the other axis reads the leading rows only.
        let i = Tensor::from_slice(&dev, &[1u32, 0, 1], &[1, 3]).expect("upload");
        let x =
            Tensor::from_slice(&dev, &[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).expect("upload");
        let y = x.transpose(0, 1).expect("view"); // [[0, 2, 4], [1, 3, 5]]
        assert_eq!(
            y.gather(0, &i)
                .expect("gather")
                .to_vec::<f32>()
                .expect("read"),
            [1.0, 2.0, 5.0]
        );
        // Shape and dtype errors.
        assert!(
            t.gather(1, &Tensor::from_slice(&dev, &[0u32], &[1]).expect("upload"))
                .is_err()
        );
        assert!(t.gather(1, &t).is_err());
        assert!(t.index_select(0, &i).is_err(), "a 2-D list");
        assert!(t.scatter_add(1, &i, &t).is_err());
        // A checked device names an index out of range.
        let mut o = DeviceOptions::from_env().expect("env");
        o.checked = true;
        let cdev = Device::with_options(o).expect("adapter");
        let t = Tensor::from_slice(&cdev, &[1.0f32, 2.0], &[2]).expect("upload");
        let bad = Tensor::from_slice(&cdev, &[2u32], &[1]).expect("upload");
        let e = t.gather(0, &bad).expect_err("out of range");
        assert!(e.to_string().contains("index 2"), "{e}");
        assert_eq!(t.to_vec::<f32>().expect("still readable"), [1.0, 2.0]);
    }

    #[test]
    fn topk_matches_a_sort() {
        let dev = device();
        let mut rng = Rng(77);
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for &(rows, len, k) in &[
                (1, 1, 1),
                (3, 17, 5),
                (2, 127, 127),
                (1, 1000, 3),
                (1, 9001, 4),
            ] {
                // Values on a coarse grid, so that ties occur.
                let x: Vec<f32> = rng
                    .uniform(rows * len)
                    .iter()
                    .map(|v| (v * 8.0).round())
                    .collect();
                let (t, xv) = held(&dev, &x, &[rows, len], dt);
                for largest in [true, false] {
                    let (v, i) = t.topk(k, -1, largest).expect("topk");
                    let (v, i) = (
                        v.to_f32_vec().expect("read"),
                        i.to_vec::<u32>().expect("read"),
                    );
                    for r in 0..rows {
                        let mut order: Vec<usize> = (0..len).collect();
                        let row = &xv[r * len..(r + 1) * len];
                        // A stable sort: equal values (-0 and 0 among them) keep their order.
                        order.sort_by(|&a, &b| {
                            let c = row[a].partial_cmp(&row[b]).expect("no NaN");
                            if largest { c.reverse() } else { c }
                        });
                        for j in 0..k {
                            let what = format!(
                                "{dt} rows {rows} len {len} k {k} largest {largest} row {r} #{j}"
                            );
                            assert_eq!(i[r * k + j] as usize, order[j], "{what}");
                            assert_eq!(v[r * k + j] as f64, row[order[j]], "{what}");
                        }
                    }
                }
            }
        }
        // NaN is the largest; topk along a leading axis; k past the length is an error.
        let nan = f32::from_bits(0x7fc0_0000);
        let t = Tensor::from_slice(&dev, &[1.0f32, nan, 3.0, -1.0], &[4, 1]).expect("upload");
        let (v, i) = t.topk(2, 0, true).expect("topk");
        assert_eq!(v.shape(), &[2, 1]);
        let v = v.to_vec::<f32>().expect("read");
        assert!(v[0].is_nan() && v[1] == 3.0);
        assert_eq!(i.to_vec::<u32>().expect("read"), [1, 2]);
        let (v, _) = t.topk(2, 0, false).expect("topk");
        assert_eq!(v.to_vec::<f32>().expect("read"), [-1.0, 1.0]);
        assert!(t.topk(5, 0, true).is_err());
    }

    /// Gradients of gather, scatter_add (both inputs), index_select and topk by finite
    /// differences of the device's forward pass.
    #[test]
    fn gradients_by_finite_differences() {
        let dev = device();
        let mut rng = Rng(9);
        let (o, len, klen, inner) = (2usize, 5usize, 7usize, 3usize);
        let x = rng.uniform(o * len * inner);
        let src = rng.uniform(o * klen * inner);
        let iv = rng.below(o * klen * inner, len);
        let list = rng.below(klen, len);
        let idx = Tensor::from_slice(&dev, &iv, &[o, klen, inner]).expect("upload");
        let li = Tensor::from_slice(&dev, &list, &[klen]).expect("upload");
        type Op = fn(&Tensor, &Tensor, &Tensor, &Tensor) -> Tensor;
        let ops: [(&str, Op, usize); 5] = [
            (
                "gather",
                |x, _, i, _| x.gather(1, i).expect("gather"),
                o * klen * inner,
            ),
            (
                "scatter_add self",
                |x, s, i, _| x.scatter_add(1, i, s).expect("scatter"),
                o * len * inner,
            ),
            (
                "scatter_add src",
                |x, s, i, _| s.scatter_add(1, i, x).expect("scatter"),
                o * len * inner,
            ),
            (
                "index_select",
                |x, _, _, l| x.index_select(1, l).expect("select"),
                o * klen * inner,
            ),
            (
                "topk",
                |x, _, _, _| x.topk(3, 1, true).expect("topk").0,
                o * 3 * inner,
            ),
        ];
        for (name, f, nout) in ops {
            // For "scatter_add src" the differentiated input is the source ([o, klen, inner])
            // and the fixed one the base.
            let (mut xv, xs, other, os) = if name == "scatter_add src" {
                (src.clone(), [o, klen, inner], x.clone(), [o, len, inner])
            } else {
                (x.clone(), [o, len, inner], src.clone(), [o, klen, inner])
            };
            if name == "topk" {
                // Values 0.1 apart, so the steps below never change the order.
                let n = xv.len();
                xv = (0..n).map(|e| ((e * 7) % n) as f32 * 0.1).collect();
            }
            let ot = Tensor::from_slice(&dev, &other, &os).expect("upload");
            let w = rng.uniform(nout);
            let loss = |v: &[f32]| -> f64 {
                let t = Tensor::from_slice(&dev, v, &xs).expect("upload");
                let y = f(&t, &ot, &idx, &li).to_f32_vec().expect("read");
                y.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let tv = Tensor::from_slice(&dev, &xv, &xs)
                .expect("upload")
                .variable();
            let y = f(&tv, &ot, &idx, &li);
            let wt = Tensor::from_slice(&dev, &w, y.shape()).expect("upload");
            y.mul(&wt)
                .expect("mul")
                .sum_all()
                .expect("sum")
                .backward()
                .expect("backward");
            let g = tv.grad().expect("gradient").to_f32_vec().expect("read");
            let h = 1e-2f32;
            for e in 0..xv.len() {
                let (mut up, mut down) = (xv.clone(), xv.clone());
                up[e] += h;
                down[e] -= h;
                let fd = (loss(&up) - loss(&down)) / (2.0 * h as f64);
                assert!(
                    (g[e] as f64 - fd).abs() < 2e-3,
                    "{name}: d/dx[{e}]: got {}, fd {fd}",
                    g[e]
                );
            }
        }
    }
}
