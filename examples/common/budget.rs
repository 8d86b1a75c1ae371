//! The `--budget` option of the examples that train inside a memory budget.

use wgrad::MemoryLimit;

/// Parses a budget in bytes (`512MiB`, `1GiB`); a fraction of the adapter is refused.
pub fn parse_bytes(v: &str) -> Result<u64, String> {
    match MemoryLimit::parse(v).map_err(|e| e.to_string())? {
        MemoryLimit::Bytes(b) => Ok(b),
        MemoryLimit::Fraction(_) => Err("--budget takes bytes (like 1GiB), not a fraction".into()),
    }
}
