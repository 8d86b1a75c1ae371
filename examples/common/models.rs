//! Where the examples find published models: the model cache of scripts/fetch_smollm2.sh.

use std::path::{Path, PathBuf};

/// The model cache, as scripts/fetch_smollm2.sh finds it: `$WGRAD_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/wgrad/models`, else `~/.cache/wgrad/models`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WGRAD_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("wgrad").join("models")
}

/// The model to load, or a message saying how to get one.
pub fn model_path(given: Option<&Path>) -> Result<PathBuf, String> {
    let fetch = "scripts/fetch_smollm2.sh fetches SmolLM2-135M-Instruct into the model cache \
                 and prints its path; or pass --model FILE.gguf|DIR";
    match given {
        Some(p) if p.exists() => Ok(p.to_path_buf()),
        Some(p) => Err(format!("no model at {} ({fetch})", p.display())),
        None => {
            let p = model_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
            if p.exists() {
                Ok(p)
            } else {
                Err(format!(
                    "no model given and none at {}: {fetch}",
                    p.display()
                ))
            }
        }
    }
}
