//! Host side of `shaders/coop_layout.wgsl`: where a driver puts the elements of an
//! invocation's share of a 16 x 16 cooperative matrix. SPIR-V leaves that placement to the
//! driver; a kernel that works on an accumulator's rows in registers (the attention
//! forward's softmax, `attention_coop.wgsl` `fwd_reg`) needs it, so it runs only where this
//! measurement found the layout it was written for ([`CoopLayout::quad_rows`]).
//!
//! Measured once per device, on first use, with one read-back.
//!
//! Loop budget: 8 iterations an invocation.

use super::{Arg, Kernel, Launch, launch, state};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;

crate::params! {
    /// `struct Params` of coop_layout.wgsl (unused by its one kernel).
    pub struct LayoutParams {
        n: u32,
    }
}

/// Where each element of a subgroup's 16 x 16 matrix lies: element `e` of lane `l` holds
/// row `x / 16`, column `x % 16` of the matrix, where `x = c[l][e]` for the f32 accumulator
/// and `a[l][e]` for the f16 A operand. Subgroups of 32, 8 elements a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopLayout {
    /// The accumulator (use C, f32).
    pub c: [[u8; 8]; 32],
    /// The A operand (f16).
    pub a: [[u8; 8]; 32],
}

impl CoopLayout {
    /// The layout `fwd_reg` is written for, NVIDIA's (as `measure` finds it), the same for C
    /// and A: lane l holds rows l / 4 and l / 4 + 8, and in each the columns 2 (l % 4),
    /// 2 (l % 4) + 1 and those 8 further; element e is at row l / 4 + 8 (e / 4), column
    /// 2 (l % 4) + e % 2 + 8 ((e / 2) % 2). A row's 16 columns are thus spread over the four
    /// lanes of a quad (lanes 4 i .. 4 i + 3), and the accumulator's elements are the A
    /// operand's at the same places, so a tile of weights P goes from one to the other with
    /// no data moved between lanes.
    pub fn quad_rows() -> CoopLayout {
        let mut c = [[0u8; 8]; 32];
        for (l, lane) in c.iter_mut().enumerate() {
            for (e, x) in lane.iter_mut().enumerate() {
                let row = l / 4 + 8 * (e / 4);
                let col = 2 * (l % 4) + e % 2 + 8 * ((e / 2) % 2);
                *x = (row * 16 + col) as u8;
            }
        }
        CoopLayout { c, a: c }
    }
}

/// Whether tensor-core kernels with f16 operands may work on their accumulators' elements
/// in registers (the `_reg` entries of attention_coop.wgsl, matmul_wide.wgsl's REGS
/// epilogue): `dev`'s layout is the one they are written for, [`CoopLayout::quad_rows`].
pub fn quad_rows(dev: &Device) -> Result<bool> {
    quad_rows_for(dev, DType::F16)
}

/// [`quad_rows`] for kernels whose operands are `dtype` (f16 or bf16, whose matrices the
/// driver may lay out apart).
pub fn quad_rows_for(dev: &Device, dtype: DType) -> Result<bool> {
    Ok(layout_for(dev, dtype)?.is_some_and(|l| l == CoopLayout::quad_rows()))
}

/// The layout of `dev`'s 16 x 16 cooperative matrices, measured on first use (see the
/// module docs), or `None` where the device has no cooperative matrices, no SPIR-V
/// passthrough or subgroups of 32, or element access is off (`Caps::coop_elements`), or
/// where the measurement failed or was not a layout (every position held by exactly one
/// element, and elements read back as written).
pub fn layout(dev: &Device) -> Result<Option<CoopLayout>> {
    layout_for(dev, DType::F16)
}

/// [`layout`] with `dtype` operands: f16, or bf16 where the device has bf16 matrices
/// (`Caps::coop_bf16_16`; the probe's 16-bit values then are bf16, which hold its integers
/// up to 255 exactly).
pub fn layout_for(dev: &Device, dtype: DType) -> Result<Option<CoopLayout>> {
    let st = state(dev)?;
    let c = dev.caps();
    let (cell, has) = match dtype {
        DType::F16 => (&st.coop_layout, true),
        DType::BF16 => (&st.coop_layout_bf16, c.coop_bf16_16),
        _ => return Ok(None),
    };
    if let Some(l) = cell.get() {
        return Ok(l.clone());
    }
    let measured = if has
        && c.coop_elements
        && c.f16
        && c.subgroups
        && c.subgroup_min == 32
        && c.subgroup_max == 32
    {
        // A failed measurement means only that no kernel may assume a layout.
        measure(dev, dtype).ok().flatten()
    } else {
        None
    };
    Ok(cell.get_or_init(|| measured).clone())
}

fn measure(dev: &Device, dtype: DType) -> Result<Option<CoopLayout>> {
    let out = dev.alloc(768 * 4)?;
    // Bound to say the operands' type (bf16 retypes the probe's 16-bit values); never read.
    let half = dev.alloc(16)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::CoopLayout,
            entry: "probe",
            wg: 32,
            consts: &[],
            params: LayoutParams { n: 0 },
            args: &[
                Arg {
                    block: &out,
                    dtype: DType::F32,
                },
                Arg {
                    block: &half,
                    dtype,
                },
            ],
            groups: [1, 1, 1],
        },
    )?;
    let v = dev.read_block::<f32>(&out, 0, 768 * 4)?.wait()?;
    Ok(decode(&v))
}

/// The layout from the probe's output (see coop_layout.wgsl), if it is one.
fn decode(v: &[f32]) -> Option<CoopLayout> {
    let mut l = CoopLayout {
        c: [[0; 8]; 32],
        a: [[0; 8]; 32],
    };
    for (which, half) in [&v[..256], &v[256..512]].into_iter().enumerate() {
        let mut seen = [false; 256];
        for (pos, &x) in half.iter().enumerate() {
            // The (lane, element) whose value landed at `pos`, each exactly once.
            if !(0.0..256.0).contains(&x) || x.fract() != 0.0 || seen[x as usize] {
                return None;
            }
            seen[x as usize] = true;
            let (lane, e) = (x as usize / 8, x as usize % 8);
            let m = if which == 0 { &mut l.c } else { &mut l.a };
            m[lane][e] = pos as u8;
        }
    }
    let read_back = v[512..768].iter().enumerate().all(|(i, &x)| x == i as f32);
    read_back.then_some(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's output for a device with layout `l`.
    fn output(l: &CoopLayout) -> Vec<f32> {
        let mut v = vec![0.0; 768];
        for lane in 0..32 {
            for e in 0..8 {
                v[l.c[lane][e] as usize] = (lane * 8 + e) as f32;
                v[256 + l.a[lane][e] as usize] = (lane * 8 + e) as f32;
                v[512 + lane * 8 + e] = (lane * 8 + e) as f32;
            }
        }
        v
    }

    #[test]
    fn decodes_a_layout_and_rejects_what_is_not_one() {
        let nv = CoopLayout::quad_rows();
        assert_eq!(decode(&output(&nv)).as_ref(), Some(&nv));
        // Lane 0 holds row 0's columns 0, 1, 8, 9, then row 8's, as NVIDIA's driver reports.
        assert_eq!(nv.c[0], [0, 1, 8, 9, 128, 129, 136, 137]);
        assert_eq!(nv.c[5], [18, 19, 26, 27, 146, 147, 154, 155]);
        let mut v = output(&nv);
        v[3] = v[5];
        assert_eq!(decode(&v), None, "a position twice");
        let mut v = output(&nv);
        v[600] += 1.0;
        assert_eq!(decode(&v), None, "an element read back wrong");
        let mut v = output(&nv);
        v[300] = 0.5;
        assert_eq!(decode(&v), None, "not an element");
    }
}
