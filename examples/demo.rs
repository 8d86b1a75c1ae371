//! A tour: device info, an upload, a few ops, a read-back and the memory report.
use wgrad::{DType, Device, Result, Tensor};

fn main() -> Result<()> {
    let dev = Device::new()?;
    println!("{}\n", dev.info());
    let a = Tensor::from_slice(&dev, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let b = dev.randn(&[2, 3], DType::F32)?;
    let c = a.mul(&b)?.add_scalar(1.0)?.relu()?;
    let s = c.sum(1, false)?;
    println!("a*b+1 relu = {:?}", c.to_vec::<f32>()?);
    println!("row sums   = {:?}", s.to_vec::<f32>()?);
    println!("transpose  = {:?}", a.transpose(0, 1)?.to_vec::<f32>()?);
    println!("\n{}", dev.memory_report());
    Ok(())
}
