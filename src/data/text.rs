//! Character-level text: random windows of a text file as next-character prediction samples.

use super::dataset::Dataset;
use crate::error::{Error, Result};
use std::path::Path;
use std::sync::Arc;

/// A text encoded as character ids (the sorted set of its characters is the vocabulary).
/// Sample `i` is a window of `seq` ids starting at a position drawn from (seed, i); its labels
/// are the same window shifted by one character.
///
/// ```
/// use wgrad::data::{CharText, Dataset};
/// # fn main() -> wgrad::Result<()> {
/// let text = CharText::from_text("to be or not to be, that is the question", 8, 0)?;
/// assert_eq!(text.vocab_size(), 14); // the distinct characters, space and comma included
/// assert_eq!(text.decode(&text.encode("not to be")), "not to be");
/// let (mut x, mut y) = (vec![0u32; 8], vec![0u32; 8]);
/// text.get(3, &mut x, &mut y)?;
/// assert_eq!(x[1..], y[..7]); // the targets are the inputs moved on by one character
/// # Ok(())
/// # }
/// ```
pub struct CharText {
    ids: Arc<Vec<u32>>,
    vocab: Vec<char>,
    seq: usize,
    windows: usize,
    seed: u64,
}

impl CharText {
    /// Reads and encodes a UTF-8 file.
    pub fn from_file(path: impl AsRef<Path>, seq: usize, seed: u64) -> Result<CharText> {
        let text = std::fs::read_to_string(path.as_ref())?;
        CharText::from_text(&text, seq, seed).map_err(|e| match e {
            Error::Invalid { detail, .. } => {
                Error::format(path.as_ref().display().to_string(), detail)
            }
            other => other,
        })
    }

    /// Encodes a text; an epoch has len / seq windows.
    pub fn from_text(text: &str, seq: usize, seed: u64) -> Result<CharText> {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<u32> = text
            .chars()
            .map(|c| vocab.binary_search(&c).unwrap_or(0) as u32)
            .collect();
        if seq == 0 || ids.len() < seq + 2 {
            return Err(Error::invalid(
                "CharText",
                format!("{} characters cannot give windows of {seq}", ids.len()),
            ));
        }
        let windows = (ids.len() - 1) / seq;
        Ok(CharText {
            ids: Arc::new(ids),
            vocab,
            seq,
            windows,
            seed,
        })
    }

    /// Number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Ids of the characters of `s` (unknown characters map to 0).
    pub fn encode(&self, s: &str) -> Vec<u32> {
        s.chars()
            .map(|c| self.vocab.binary_search(&c).unwrap_or(0) as u32)
            .collect()
    }

    /// The text of ids.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.vocab.get(i as usize).copied().unwrap_or('?'))
            .collect()
    }

    /// Window length.
    pub fn seq_len(&self) -> usize {
        self.seq
    }

    fn start(&self, i: usize) -> usize {
        let mut z = self.seed ^ (i as u64).wrapping_mul(0x9E3779B97F4A7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^= z >> 31;
        (z % (self.ids.len() - self.seq) as u64) as usize
    }
}

impl Dataset for CharText {
    type X = u32;
    fn len(&self) -> usize {
        self.windows
    }
    fn x_shape(&self) -> Vec<usize> {
        vec![self.seq]
    }
    fn y_shape(&self) -> Vec<usize> {
        vec![self.seq]
    }
    fn get(&self, index: usize, x: &mut [u32], y: &mut [u32]) -> Result<()> {
        if index >= self.windows {
            return Err(Error::invalid(
                "CharText",
                format!("window {index} out of {}", self.windows),
            ));
        }
        let s = self.start(index);
        x.copy_from_slice(&self.ids[s..s + self.seq]);
        y.copy_from_slice(&self.ids[s + 1..s + 1 + self.seq]);
        Ok(())
    }
}
