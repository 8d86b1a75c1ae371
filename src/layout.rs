//! Where a tensor's elements sit in its storage: a shape, a stride per dimension and an offset,
//! all in elements. Views (permute, transpose, narrow, broadcast, most reshapes) only change
//! the layout; the storage is shared.

use crate::error::{Error, Result};
use std::ops::{Deref, DerefMut};

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    row_major(shape).to_vec()
}

/// Row-major strides of `shape`, inline.
fn row_major(shape: &[usize]) -> Dims {
    let mut s = Dims::filled(1, shape.len());
    // Through one slice: indexing `Dims` matches its variant at every access.
    let out: &mut [usize] = &mut s;
    let mut step = 1usize;
    for (o, &d) in out.iter_mut().zip(shape).rev() {
        *o = step;
        step = step.wrapping_mul(d);
    }
    s
}

/// Extents or strides held inline up to [`Dims::INLINE`] dimensions, on the heap past that.
/// Nearly every op makes and drops layouts; as two vectors each they were about 45% of the
/// host's allocations in a GPT training step (callgrind, BENCHMARKS.md).
#[derive(Clone)]
pub(crate) enum Dims {
    Inline(u8, [usize; Dims::INLINE]),
    Heap(Vec<usize>),
}

impl Dims {
    /// Dimensions kept inline: the kernels' own rank limit, so every layout a kernel takes
    /// stays off the heap.
    const INLINE: usize = 6;

    /// `n` copies of `v`.
    pub(crate) fn filled(v: usize, n: usize) -> Dims {
        if n <= Dims::INLINE {
            Dims::Inline(n as u8, [v; Dims::INLINE])
        } else {
            Dims::Heap(vec![v; n])
        }
    }

    /// A copy of `s`.
    pub(crate) fn from_slice(s: &[usize]) -> Dims {
        let mut d = Dims::filled(0, s.len());
        d.copy_from_slice(s);
        d
    }
}

impl Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline(n, a) => &a[..*n as usize],
            Dims::Heap(v) => v,
        }
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline(n, a) => &mut a[..*n as usize],
            Dims::Heap(v) => v,
        }
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        **self == **other
    }
}

impl Eq for Dims {}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl FromIterator<usize> for Dims {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Dims {
        let mut a = [0; Dims::INLINE];
        let mut n = 0;
        let mut it = iter.into_iter();
        for x in it.by_ref() {
            if n == Dims::INLINE {
                let mut v = a.to_vec();
                v.push(x);
                v.extend(it);
                return Dims::Heap(v);
            }
            a[n] = x;
            n += 1;
        }
        Dims::Inline(n as u8, a)
    }
}

/// Shape, strides and offset (elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

impl Layout {
    /// The row-major layout of `shape` from element 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: Dims::from_slice(shape),
            strides: row_major(shape),
            offset: 0,
        }
    }

    /// A layout from its parts (the caller keeps it inside the storage).
    #[cfg(test)]
    pub(crate) fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Layout {
        Layout::from_parts(&shape, &strides, offset)
    }

    /// A layout from its parts (the caller keeps it inside the storage).
    pub(crate) fn from_parts(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
        Layout {
            shape: Dims::from_slice(shape),
            strides: Dims::from_slice(strides),
            offset,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements between neighbours along each dimension (0 for a broadcast dimension).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element index of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major order with no gaps (size-1 dimensions may have any stride), from any offset.
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1usize;
        for (&d, &s) in self.shape.iter().zip(self.strides.iter()).rev() {
            if d != 1 {
                if s != expect {
                    return false;
                }
                expect = expect.wrapping_mul(d);
            }
        }
        true
    }

    /// Contiguous from element 0: what kernels that take a plain buffer read.
    pub fn is_dense(&self) -> bool {
        self.offset == 0 && self.is_contiguous()
    }

    /// One past the last element this layout reaches (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(self.strides.iter())
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Output dimension `k` is input dimension `perm[k]`. The caller checked `perm`.
    pub(crate) fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// `len` elements of `axis` from `start`. The caller checked the range.
    pub(crate) fn narrow(&self, axis: usize, start: usize, len: usize) -> Layout {
        let mut l = self.clone();
        l.offset += start * self.strides[axis];
        l.shape[axis] = len;
        l
    }

    /// Size-1 (or missing leading) dimensions repeated up to `shape` with stride 0.
    pub(crate) fn broadcast_to(&self, shape: &[usize]) -> Option<Layout> {
        if shape.len() < self.shape.len() {
            return None;
        }
        let lead = shape.len() - self.shape.len();
        let mut strides = Dims::filled(0, shape.len());
        for (k, &d) in shape.iter().enumerate() {
            if k < lead {
                continue;
            }
            let (sd, ss) = (self.shape[k - lead], self.strides[k - lead]);
            if sd == d {
                strides[k] = if d == 1 { 0 } else { ss };
            } else if sd == 1 {
                strides[k] = 0;
            } else {
                return None;
            }
        }
        Some(Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// The same elements in row-major order with a new shape, as a view, when the strides
    /// allow it (dimensions merged must be contiguous with each other; split ones get the
    /// split strides); `None` when only a copy can give that shape.
    pub(crate) fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if self.is_contiguous() || self.numel() == 0 {
            let mut l = Layout::contiguous(shape);
            l.offset = self.offset;
            return Some(l);
        }
        // Group the old dimensions (size-1 ones dropped) into runs that are contiguous with
        // each other, then cut each run into consecutive new dimensions of the same product.
        let kept = || {
            self.shape
                .iter()
                .zip(self.strides.iter())
                .filter(|(d, _)| **d != 1)
        };
        let old_d: Dims = kept().map(|(&d, _)| d).collect();
        let old_s: Dims = kept().map(|(_, &s)| s).collect();
        let mut strides = Dims::filled(0, shape.len());
        let mut ni = 0;
        let mut oi = 0;
        while oi < old_d.len() {
            // A run of old dims oi..oj whose strides chain.
            let mut oj = oi + 1;
            while oj < old_d.len() && old_s[oj - 1] == old_s[oj] * old_d[oj] {
                oj += 1;
            }
            let run: usize = old_d[oi..oj].iter().product();
            let inner_stride = old_s[oj - 1];
            // New dims covering exactly `run` elements.
            let mut prod = 1;
            let start = ni;
            while ni < shape.len() && (prod < run || shape[ni] == 1) {
                if shape[ni] != 1 && prod * shape[ni] > run {
                    return None;
                }
                prod *= shape[ni];
                ni += 1;
                if prod == run {
                    // Take trailing size-1 dims later.
                    break;
                }
            }
            if prod != run {
                return None;
            }
            let mut st = inner_stride;
            for k in (start..ni).rev() {
                strides[k] = st;
                st *= shape[k];
            }
            oi = oj;
        }
        // Remaining new dims must all be 1.
        if shape[ni..].iter().any(|&d| d != 1) {
            return None;
        }
        Some(Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }
}

/// The one stride that walks dimensions `dims` (strides `strides`) as a single run, ignoring
/// size-1 ones: the innermost non-unit dimension's stride when each outer one steps over the
/// whole of the next, 0 when every dimension is 1, `None` when they do not chain. How the
/// product and attention kernels take batch and head dimensions as one index.
pub(crate) fn run_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let mut live = dims.iter().zip(strides).filter(|(d, _)| **d != 1);
    let Some((_, &first)) = live.next() else {
        return Some(0);
    };
    let mut outer = first;
    for (&d, &s) in live {
        if outer != s * d {
            return None;
        }
        outer = s;
    }
    Some(outer)
}

/// Errors unless `shape` has as many elements as `n`.
pub(crate) fn check_numel(op: &'static str, from: &[usize], shape: &[usize]) -> Result<()> {
    let n: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let m: usize = from.iter().product();
    if n != Some(m) {
        return Err(Error::shape(
            op,
            format!("cannot view {from:?} as {shape:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elems(l: &Layout) -> Vec<usize> {
        // Element indices in row-major order of the layout.
        let n = l.numel();
        (0..n)
            .map(|mut i| {
                let mut off = l.offset;
                for k in (0..l.shape.len()).rev() {
                    off += (i % l.shape[k]) * l.strides[k];
                    i /= l.shape[k];
                }
                off
            })
            .collect()
    }

    #[test]
    fn views_address_the_same_elements() {
        let base = Layout::contiguous(&[2, 3, 4]);
        let p = base.permute(&[2, 0, 1]);
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert!(!p.is_contiguous());
        assert_eq!(elems(&p)[..4], [0, 4, 8, 12]);
        let n = base.narrow(1, 1, 2);
        assert_eq!(
            elems(&n),
            vec![4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]
        );
        assert!(!n.is_contiguous());
        // Narrowing the leading axis stays contiguous (with an offset).
        let n0 = base.narrow(0, 1, 1);
        assert!(n0.is_contiguous() && !n0.is_dense() && n0.offset() == 12);
        let b = Layout::contiguous(&[3, 1])
            .broadcast_to(&[2, 3, 4])
            .unwrap_or_else(|| Layout::contiguous(&[0]));
        assert_eq!(b.strides(), &[0, 1, 0]);
        assert!(Layout::contiguous(&[3]).broadcast_to(&[4]).is_none());
        assert_eq!(base.extent(), 24);
        assert_eq!(p.extent(), 24);
    }

    #[test]
    fn dims_inline_and_past_it() {
        for n in [0, 1, Dims::INLINE, Dims::INLINE + 1, 9] {
            let v: Vec<usize> = (10..10 + n).collect();
            let a = Dims::from_slice(&v);
            let b: Dims = v.iter().copied().collect();
            assert_eq!(&*a, &v[..]);
            assert_eq!(&*b, &v[..]);
            assert_eq!(a, b);
            assert_eq!(matches!(a, Dims::Heap(_)), n > Dims::INLINE);
            assert_eq!(&*Dims::filled(7, n), &vec![7; n][..]);
            assert_eq!(format!("{a:?}"), format!("{v:?}"));
        }
        // A rank-8 layout (on the heap) views like a small one.
        let shape = [2, 1, 3, 1, 2, 2, 1, 3];
        let l = Layout::contiguous(&shape);
        assert_eq!(l.strides(), &contiguous_strides(&shape)[..]);
        assert_eq!(l.strides(), &[36, 36, 12, 12, 6, 3, 3, 1]);
        let rev = l.permute(&[7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(rev.shape(), &[3, 1, 2, 2, 1, 3, 1, 2]);
        assert!(
            rev.reshape(&[3, 4, 3, 2]).is_none(),
            "reversed axes do not merge"
        );
        let p = l.permute(&[2, 3, 4, 5, 6, 7, 0, 1]);
        let r = p
            .reshape(&[12, 3, 2])
            .unwrap_or_else(|| Layout::contiguous(&[0]));
        assert_eq!(r.strides(), &[3, 1, 36]);
        assert_eq!(elems(&r), elems(&p));
        assert!(l.reshape(&[6, 12]).is_some_and(|m| elems(&m) == elems(&l)));
    }

    #[test]
    fn run_strides() {
        assert_eq!(run_stride(&[], &[]), Some(0));
        assert_eq!(run_stride(&[1, 1], &[5, 9]), Some(0));
        // [2, 3] over a dense [2, 3, 4, 5]: one run of stride 20.
        assert_eq!(run_stride(&[2, 3], &[60, 20]), Some(20));
        // Size-1 dimensions carry any stride.
        assert_eq!(run_stride(&[2, 1, 3], &[60, 7, 20]), Some(20));
        // Broadcast (stride 0) batches do not chain with a live one.
        assert_eq!(run_stride(&[2, 3], &[0, 20]), None);
        assert_eq!(run_stride(&[2, 3], &[20, 60]), None);
        assert_eq!(run_stride(&[4], &[0]), Some(0));
    }

    #[test]
    fn reshape_views_when_strides_allow() {
        // [B, S, 3, H, D] -> permute -> narrow -> drop the unit axis: a view.
        let l = Layout::contiguous(&[2, 5, 3, 4, 8]).permute(&[2, 0, 3, 1, 4]);
        let q = l.narrow(0, 1, 1);
        let r = q
            .reshape(&[2, 4, 5, 8])
            .unwrap_or_else(|| Layout::contiguous(&[0]));
        assert_eq!(elems(&r), elems(&q));
        // Merging the last two dims of a transposed matrix is impossible.
        let t = Layout::contiguous(&[3, 4]).permute(&[1, 0]);
        assert!(t.reshape(&[12]).is_none());
        // Merging contiguous runs works: [4, 6] viewed from [2, 4, 3] with a gap-free inner pair.
        let g = Layout::new(vec![2, 4, 3], vec![100, 3, 1], 5);
        let m = g
            .reshape(&[2, 12])
            .unwrap_or_else(|| Layout::contiguous(&[0]));
        assert_eq!(m.strides(), &[100, 1]);
        assert_eq!(elems(&m), elems(&g));
        // Splitting a dim, and size-1 dims anywhere.
        let s = g
            .reshape(&[1, 2, 2, 2, 3, 1])
            .unwrap_or_else(|| Layout::contiguous(&[0]));
        assert_eq!(elems(&s), elems(&g));
    }
}
