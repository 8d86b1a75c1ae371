//! The MPI group the examples use under `mpirun`: wgrad's `MpiGroup` with the `mpi` feature,
//! and without it a stand-in whose `init` says how to build with it (so the examples' code
//! has one path).

#[cfg(not(feature = "mpi"))]
use wgrad::Tensor;
use wgrad::{Device, Result};

/// The devices an example trains on: the `--devices` list, else under mpirun the adapter
/// numbered by this process's rank on its host, else the best adapter.
pub fn devices(list: Option<&str>, group: Option<&MpiGroup>) -> Result<Vec<Device>> {
    Ok(match (list, group) {
        (Some(list), _) => wgrad::parallel::open_devices(list)?,
        (None, Some(g)) => vec![Device::with_index(
            g.local_rank() % Device::all().len().max(1),
        )?],
        (None, None) => vec![Device::new()?],
    })
}

#[cfg(feature = "mpi")]
pub use wgrad::parallel::MpiGroup;

/// Stands in for `wgrad::parallel::MpiGroup` in a build without the `mpi` feature.
#[cfg(not(feature = "mpi"))]
pub struct MpiGroup;

// Each example uses some of these.
#[cfg(not(feature = "mpi"))]
#[allow(dead_code)]
impl MpiGroup {
    pub fn init() -> Result<MpiGroup> {
        Err(wgrad::Error::Unsupported(
            "--mpi needs the example built with `--features mpi`".into(),
        ))
    }
    pub fn rank(&self) -> usize {
        0
    }
    pub fn size(&self) -> usize {
        1
    }
    pub fn local_rank(&self) -> usize {
        0
    }
    pub fn broadcast_params(&self, _: &[(String, Tensor)]) -> Result<()> {
        Ok(())
    }
    pub fn mean(&self, x: f32) -> f32 {
        x
    }
    pub fn backward(&self, l: &Tensor, _: &[(String, Tensor)]) -> Result<std::time::Duration> {
        l.backward()?;
        Ok(std::time::Duration::ZERO)
    }
}
