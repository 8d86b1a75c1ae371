//! Where the repository's `data/` is, for examples run from a build or carried elsewhere.

use std::path::PathBuf;

/// The directory this example was built in, or, for a binary carried to another machine
/// (benches/gpu_run.sh runs them from `<checkout>/.gpu`), the nearest directory above the
/// working directory that holds `data/`.
pub fn repo_root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("data").is_dir() {
        return built;
    }
    let mut dir = std::env::current_dir().unwrap_or_default();
    loop {
        if dir.join("data/mnist").is_dir() {
            return dir;
        }
        if !dir.pop() {
            return built;
        }
    }
}
