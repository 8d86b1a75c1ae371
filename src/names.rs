//! Parameter name patterns, as freezing and optimizer groups select parameters.

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (none
/// included) and every other character for itself: `*.bias`, `blocks.*.attn.*`, `*norm*`.
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Greedy matching with backtracking to the last star: linear in practice, and at worst
    // the product of the lengths.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns() {
        assert!(matches("*.bias", "blocks.0.attn.bias"));
        assert!(!matches("*.bias", "blocks.0.attn.weight"));
        assert!(matches("blocks.*.attn.*", "blocks.11.attn.qkv.weight"));
        assert!(matches("*norm*", "ln_f.norm.weight"));
        assert!(matches("*", ""));
        assert!(matches("wte.weight", "wte.weight"));
        assert!(!matches("wte.weight", "wte.weights"));
        assert!(!matches("a*b", "ac"));
        assert!(matches("a*b*c", "aXbYbZc"));
    }
}
