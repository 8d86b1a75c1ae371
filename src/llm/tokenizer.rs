//! Text to token ids and back, as Hugging Face transformers tokenizes for the same model.
//!
//! [`Tokenizer`] wraps Hugging Face's `tokenizers` crate (cargo feature `tokenizers`). It is
//! built either from a Hugging Face checkpoint's `tokenizer.json` ([`Tokenizer::from_file`]) or
//! from the vocabulary a GGUF file carries in its metadata ([`Tokenizer::from_gguf`]). A GGUF
//! has no `tokenizer.json`, so the pipeline is rebuilt the way transformers rebuilds it when it
//! loads a GGUF (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), so that both produce the
//! same ids for the same text:
//!
//! * `tokenizer.ggml.model = "gpt2"` (byte-level BPE: SmolLM2, Llama 3, Qwen2): the tokens and
//!   merges as the file spells them; the text split by GPT-2's pattern, or by the pattern that
//!   `tokenizer.ggml.pre` names (Llama 3's, Qwen2's...), then mapped byte by byte to the byte
//!   alphabet; decoding maps the alphabet back to bytes.
//! * `tokenizer.ggml.model = "llama"` (SentencePiece BPE: Llama 2, TinyLlama, Mistral): spaces
//!   become `▁` with one prepended to the text, unknown characters fall back to `<0xNN>` byte
//!   tokens; the merges are the file's, or rebuilt from the token scores when it has none.
//!
//! In both, the tokens the file marks as control (type 3) and the bos/eos/unknown/padding tokens
//! are special added tokens: written in the text they map to their one id (`<|im_start|>` is
//! id 1 in SmolLM2), and [`Tokenizer::decode`] can skip them. Tokens marked user-defined
//! (type 4) are added tokens that are not special. `tokenizer.ggml.add_bos_token` and
//! `add_eos_token` say whether `encode(text, true)` adds bos and eos around the text.
//!
//! Without the `tokenizers` feature this module still compiles, and both constructors return
//! an error that says to enable it.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// What a GGUF token type (`tokenizer.ggml.token_type`) of 3 means: a control token.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
const TOKEN_TYPE_CONTROL: i32 = 3;
/// What a GGUF token type of 4 means: a user-defined token, matched whole in the text.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// A tokenizer of a published model: encode text to ids, decode ids to text.
///
/// ```no_run
/// use wgrad::gguf::GgufFile;
/// use wgrad::llm::Tokenizer;
///
/// # fn main() -> wgrad::Result<()> {
/// let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
/// let tok = Tokenizer::from_gguf(&file)?;
/// let ids = tok.encode("<|im_start|>user\nHello!<|im_end|>", false)?;
/// assert_eq!(ids[0], 1); // a special token written in the text is its one id
/// assert_eq!(tok.decode(&ids, false)?, "<|im_start|>user\nHello!<|im_end|>");
/// assert_eq!(tok.decode(&ids, true)?, "user\nHello!"); // special tokens skipped
///
/// // Generation: text comes out as soon as its UTF-8 is complete.
/// let mut stream = tok.stream(true);
/// let mut text = String::new();
/// for &id in &ids {
///     text += &stream.push(&tok, id)?;
/// }
/// text += &stream.finish(&tok)?;
/// assert_eq!(text, "user\nHello!");
/// # Ok(())
/// # }
/// ```
pub struct Tokenizer {
    inner: backend::Backend,
    bos: Option<u32>,
    eos: Option<u32>,
    eos_ids: Vec<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .field("pad", &self.pad)
            .field("unk", &self.unk)
            .finish()
    }
}

/// The ids a GGUF file's metadata gives its named special tokens.
#[derive(Clone, Copy, Debug, Default)]
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
}

/// The metadata key of an optional token id; a value present but not a u32 is an error.
fn optional_id(file: &GgufFile, key: &str) -> Result<Option<u32>> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => file.get_u32(key).map(Some),
    }
}

/// An optional boolean metadata key.
fn optional_bool(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => file.get_bool(key).map(Some),
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata, the way
    /// transformers builds it from the same file (see the module documentation).
    ///
    /// Errors name the file and the key: a missing `tokenizer.ggml.model` or
    /// `tokenizer.ggml.tokens` (or `tokenizer.ggml.scores` where the file has no merges to
    /// take instead), a value of the wrong type, a merge that is not two tokens, a
    /// special token id past the vocabulary, a tokenizer model or pre-tokenizer this crate
    /// cannot rebuild; or say to enable the `tokenizers` feature.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model = file.get_str("tokenizer.ggml.model")?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?;
        let token_types = match file.get("tokenizer.ggml.token_type") {
            None => &[][..],
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?,
        };
        let merges = match file.get("tokenizer.ggml.merges") {
            None => None,
            Some(_) => Some(file.get_str_array("tokenizer.ggml.merges")?),
        };
        let pre = match file.get("tokenizer.ggml.pre") {
            None => None,
            Some(_) => Some(file.get_str("tokenizer.ggml.pre")?),
        };
        let ids = SpecialIds {
            bos: optional_id(file, "tokenizer.ggml.bos_token_id")?,
            eos: optional_id(file, "tokenizer.ggml.eos_token_id")?,
            unk: optional_id(file, "tokenizer.ggml.unknown_token_id")?,
            pad: optional_id(file, "tokenizer.ggml.padding_token_id")?,
        };
        for (key, id) in [
            ("bos_token_id", ids.bos),
            ("eos_token_id", ids.eos),
            ("unknown_token_id", ids.unk),
            ("padding_token_id", ids.pad),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= tokens.len()) {
                return Err(Error::format(
                    file.path(),
                    format!(
                        "tokenizer.ggml.{key} = {id} is past the vocabulary ({} tokens)",
                        tokens.len()
                    ),
                ));
            }
        }
        // SentencePiece vocabularies add bos unless the file says otherwise, as llama.cpp does.
        let add_bos =
            optional_bool(file, "tokenizer.ggml.add_bos_token")?.unwrap_or(model == "llama");
        let add_eos = optional_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        // Without merges in the file they are rebuilt from the token scores.
        let scores = match merges {
            Some(_) => None,
            None => Some(file.get_f32_array("tokenizer.ggml.scores")?),
        };
        let spec = backend::GgufSpec {
            path: file.path(),
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
            ids,
            add_bos,
            add_eos,
        };
        let inner = backend::Backend::from_gguf(&spec)?;
        // A chat model may end a turn on a token other than eos: llama.cpp's end-of-turn and
        // end-of-message ids, where the file has them, also end generation.
        let mut eos_ids: Vec<u32> = ids.eos.into_iter().collect();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = optional_id(file, key)?
                && (id as usize) < tokens.len()
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        Ok(Tokenizer {
            inner,
            bos: ids.bos,
            eos: ids.eos,
            eos_ids,
            pad: ids.pad,
            unk: ids.unk,
        })
    }

    /// Loads a Hugging Face `tokenizer.json`.
    ///
    /// The special tokens' names are not in that file: they are read from
    /// `tokenizer_config.json` beside it (`bos_token`, `eos_token`, `pad_token`, `unk_token`),
    /// and the ids that end generation from `generation_config.json` and `config.json`
    /// (`eos_token_id`, a number or a list), where those files exist. A file that is not a
    /// tokenizer (or a companion file that is not JSON) is an [`Error::Format`] naming it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let inner = backend::Backend::from_file(path)?;
        let mut tok = Tokenizer {
            inner,
            bos: None,
            eos: None,
            eos_ids: Vec::new(),
            pad: None,
            unk: None,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(cfg) = read_json(&dir.join("tokenizer_config.json"))? {
            let id = |key: &str| {
                cfg.get(key)
                    .and_then(token_content)
                    .and_then(|t| tok.token_to_id(t))
            };
            let (bos, eos, pad, unk) = (
                id("bos_token"),
                id("eos_token"),
                id("pad_token"),
                id("unk_token"),
            );
            (tok.bos, tok.eos, tok.pad, tok.unk) = (bos, eos, pad, unk);
        }
        tok.eos_ids.extend(tok.eos);
        for name in ["generation_config.json", "config.json"] {
            if let Some(cfg) = read_json(&dir.join(name))? {
                let ids = cfg.get("eos_token_id").map(json_ids).unwrap_or_default();
                if tok.eos.is_none() {
                    tok.eos = ids.first().copied();
                }
                for id in ids {
                    if !tok.eos_ids.contains(&id) {
                        tok.eos_ids.push(id);
                    }
                }
                if tok.bos.is_none() {
                    tok.bos = cfg.get("bos_token_id").and_then(json_ids_first);
                }
            }
        }
        Ok(tok)
    }

    /// The ids of `text`. With `add_special_tokens`, the tokens the tokenizer puts around a
    /// sequence are added (bos for Llama 2 and Llama 3; nothing for SmolLM2); special tokens
    /// written in the text map to their ids either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner.encode(text, add_special_tokens)
    }

    /// The text of `ids`, leaving out special tokens when `skip_special` is set. Bytes that do
    /// not form valid UTF-8 (a character cut between two ids) become U+FFFD; see [`TextStream`]
    /// for text that arrives one id at a time. An id past the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let size = self.vocab_size();
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(Error::invalid(
                "Tokenizer::decode",
                format!("token id {bad} is past the vocabulary ({size} tokens)"),
            ));
        }
        self.inner.decode(ids, skip_special)
    }

    /// A decoder of generated text, fed one id at a time: see [`TextStream`].
    pub fn stream(&self, skip_special: bool) -> TextStream {
        TextStream::new(skip_special)
    }

    /// The beginning-of-sequence token id, if the tokenizer names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token id, if the tokenizer names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every id that ends generation: [`eos_id`](Tokenizer::eos_id) first, then the model's
    /// end-of-turn ids (GGUF `tokenizer.ggml.eot_token_id` and `eom_token_id`; a checkpoint's
    /// `eos_token_id` lists in `generation_config.json` and `config.json`). SmolLM2-Instruct's
    /// eos is `<|im_end|>` itself, so this is `[2]` there.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Whether generation ends at `id` (it is one of [`eos_ids`](Tokenizer::eos_ids)).
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The padding token id, if the tokenizer names one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// The unknown token id, if the tokenizer names one.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// The number of ids, added tokens included: every id below it decodes.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The token of `id` as the vocabulary spells it (byte-level BPE writes a space as `Ġ`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token spelled as the vocabulary spells it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Reads a JSON file, or `None` when it does not exist.
fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::format(path.display().to_string(), format!("not JSON: {e}")))
}

/// A special token in `tokenizer_config.json`: a string, or an added token `{"content": ...}`.
fn token_content(v: &serde_json::Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(serde_json::Value::as_str))
}

/// A token id field that holds a number or a list of numbers.
fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v.as_array() {
        Some(list) => list.iter().filter_map(one).collect(),
        None => one(v).into_iter().collect(),
    }
}

fn json_ids_first(v: &serde_json::Value) -> Option<u32> {
    json_ids(v).first().copied()
}

/// Decodes generated ids as they arrive, giving out each piece of text once it is complete.
///
/// One id can end in the middle of a UTF-8 character (byte-level and byte-fallback
/// vocabularies cut emoji and CJK characters into several ids), and a SentencePiece decoder
/// drops the space of a text's first token. So the text is not the concatenation of each id
/// decoded alone: [`push`](TextStream::push) decodes a short window of recent ids, gives out
/// what it adds past what was already given out, and holds back a piece that ends in U+FFFD
/// (an incomplete character) until a later id completes it. [`finish`](TextStream::finish)
/// gives out whatever is still held back. The pieces joined equal
/// [`Tokenizer::decode`] of all the ids.
#[derive(Clone, Debug)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Where the decoded window starts: the ids before it are given out and need no context.
    prefix: usize,
    /// How many ids have been given out as text.
    read: usize,
    skip_special: bool,
}

impl TextStream {
    /// An empty stream; `skip_special` leaves special tokens out of the text.
    pub fn new(skip_special: bool) -> TextStream {
        TextStream {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            skip_special,
        }
    }

    /// Adds the next id and returns the text it completes: empty while a character is still
    /// cut, or for a skipped special token.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let (given, all) = self.window(tokenizer)?;
        if all.len() > given.len() && !all.ends_with('\u{FFFD}') {
            let new = all.get(given.len()..).unwrap_or_default().to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(new)
        } else {
            Ok(String::new())
        }
    }

    /// Returns the text still held back (an incomplete character comes out as U+FFFD), and
    /// starts the stream afresh after it.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let (given, all) = self.window(tokenizer)?;
        let rest = all.get(given.len()..).unwrap_or_default().to_string();
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(rest)
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The window's text already given out, and its whole text.
    fn window(&self, tokenizer: &Tokenizer) -> Result<(String, String)> {
        let given = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let all = tokenizer.decode(&self.ids[self.prefix..], self.skip_special)?;
        // A decoder that is not plain concatenation (one that rewrites across ids) could make
        // the given text not a prefix of the whole: then give out the whole window's text
        // past the common prefix's length rather than split a character.
        if all.starts_with(&given) {
            Ok((given, all))
        } else {
            let common = given
                .char_indices()
                .zip(all.chars())
                .find(|((_, a), b)| a != b)
                .map_or(given.len().min(all.len()), |((i, _), _)| i);
            Ok((all.get(..common).unwrap_or_default().to_string(), all))
        }
    }
}

/// The character byte-level BPE writes for a byte: printable Latin-1 bytes stand for
/// themselves; the others (the controls, space, DEL, 0x80 to 0xA0 and the soft hyphen 0xAD)
/// take the characters from U+0100 up, in byte order, so every byte is one visible character.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
    }
}

/// The 256 characters of the byte-level alphabet.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
fn byte_alphabet() -> HashSet<char> {
    (0..=255u8).map(byte_char).collect()
}

/// A token as a byte-level vocabulary spells it: unchanged when it is written in the byte
/// alphabet already, else its UTF-8 bytes each as their alphabet character.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
fn byte_level_spelling(token: &str, alphabet: &HashSet<char>) -> String {
    if token.chars().all(|c| alphabet.contains(&c)) {
        token.to_string()
    } else {
        token.bytes().map(byte_char).collect()
    }
}

/// Merges for a SentencePiece vocabulary that lists none, rebuilt from its scores: every way
/// to cut a token into two tokens of the vocabulary is a merge, ranked by the whole token's
/// score (highest first), then by the shorter left and right pieces; cuts of one token in the
/// order of their pieces' ids. A stable sort keeps the vocabulary order among equals.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t, i);
    }
    // One score per distinct token, the last one listed, in first-listed order.
    let mut score_of: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (t, &s) in tokens.iter().zip(scores) {
        if score_of.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for token in order {
        let score = score_of.get(token).copied().unwrap_or(f32::NEG_INFINITY);
        let mut local: Vec<(&str, &str, f32)> = token
            .char_indices()
            .skip(1)
            .map(|(i, _)| token.split_at(i))
            .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (vocab.get(l).copied(), vocab.get(r).copied()));
        merges.extend(local);
    }
    merges.sort_by(|a, b| {
        let key = |m: &(&str, &str, f32)| (m.2, m.0.chars().count(), m.1.chars().count());
        let (ka, kb) = (key(a), key(b));
        kb.0.total_cmp(&ka.0)
            .then(kb.1.cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
    });
    merges
        .into_iter()
        .map(|(l, r, _)| (l.to_string(), r.to_string()))
        .collect()
}

/// The pattern that splits text into words before byte-level BPE, by `tokenizer.ggml.pre`:
/// `None` for GPT-2's own pattern (SmolLM2's "smollm", GPT-2, StarCoder and names not listed),
/// which the byte-level pre-tokenizer applies itself.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
fn pre_tokenizer_pattern(pre: Option<&str>) -> Option<&'static str> {
    // Llama 3's pattern: contractions, letters with one leading non-letter, numbers in runs of
    // at most three digits, punctuation runs, newlines, and other whitespace.
    const LLAMA3: &str = concat!(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    );
    // Qwen2's: Llama 3's with each digit a word of its own.
    const QWEN2: &str = concat!(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    );
    match pre? {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "dbrx" | "smaug-bpe" => Some(LLAMA3),
        "qwen2" | "deepseek-r1-qwen" | "megrez" => Some(QWEN2),
        _ => None,
    }
}

#[cfg(feature = "tokenizers")]
mod backend {
    //! The `tokenizers` crate behind [`super::Tokenizer`].

    use std::path::Path;

    use tokenizers::decoders::DecoderWrapper;
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::byte_level::ByteLevel;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::decoders::strip::Strip;
    use tokenizers::models::bpe::{BPE, Vocab};
    use tokenizers::normalizers::Replace;
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
    use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{AddedToken, SplitDelimiterBehavior};

    use super::{
        SpecialIds, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, byte_alphabet,
        byte_level_spelling, merges_from_scores, pre_tokenizer_pattern,
    };
    use crate::error::{Error, Result};

    /// What [`super::Tokenizer::from_gguf`] read from the metadata.
    pub(super) struct GgufSpec<'a> {
        pub path: &'a str,
        pub model: &'a str,
        pub pre: Option<&'a str>,
        pub tokens: &'a [String],
        pub token_types: &'a [i32],
        pub merges: Option<&'a [String]>,
        pub scores: Option<&'a [f32]>,
        pub ids: SpecialIds,
        pub add_bos: bool,
        pub add_eos: bool,
    }

    pub(super) struct Backend(tokenizers::Tokenizer);

    fn tok_err(op: &'static str, e: tokenizers::Error) -> Error {
        Error::invalid(op, e.to_string())
    }

    impl Backend {
        pub fn from_file(path: &Path) -> Result<Backend> {
            tokenizers::Tokenizer::from_file(path)
                .map(Backend)
                .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
        }

        pub fn from_gguf(spec: &GgufSpec<'_>) -> Result<Backend> {
            let fmt = |detail: String| Error::format(spec.path, detail);
            let byte_level = match spec.model {
                "gpt2" => true,
                "llama" => false,
                other => {
                    return Err(fmt(format!(
                        "tokenizer.ggml.model = {other:?}: only \"gpt2\" (byte-level BPE) and \
                         \"llama\" (SentencePiece BPE) tokenizers can be built"
                    )));
                }
            };
            let alphabet = byte_alphabet();
            // Byte-level files spell every token in the byte alphabet; one that is not (a
            // special token with other characters) is respelled so the model can hold it.
            let vocab: Vocab = spec
                .tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let t = if byte_level {
                        byte_level_spelling(t, &alphabet)
                    } else {
                        t.clone()
                    };
                    (t, i as u32)
                })
                .collect();
            let merges: Vec<(String, String)> = match (spec.merges, spec.scores) {
                (Some(merges), _) => merges
                    .iter()
                    .enumerate()
                    .map(|(i, m)| match m.split(' ').collect::<Vec<_>>()[..] {
                        [l, r] => Ok((l.to_string(), r.to_string())),
                        _ => Err(fmt(format!(
                            "tokenizer.ggml.merges[{i}] = {m:?} is not two tokens separated by \
                             one space"
                        ))),
                    })
                    .collect::<Result<_>>()?,
                (None, Some(scores)) => merges_from_scores(spec.tokens, scores),
                (None, None) => Vec::new(),
            };
            let mut builder = BPE::builder().vocab_and_merges(vocab, merges);
            if !byte_level {
                builder = builder.fuse_unk(true).byte_fallback(true);
            }
            let bpe = builder
                .build()
                .map_err(|e| fmt(format!("tokenizer.ggml.merges: {e}")))?;
            let mut tok = tokenizers::Tokenizer::new(bpe);

            if byte_level {
                let pre = match pre_tokenizer_pattern(spec.pre) {
                    None => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
                    Some(pattern) => {
                        let split = Split::new(
                            SplitPattern::Regex(pattern.to_string()),
                            SplitDelimiterBehavior::Isolated,
                            false,
                        )
                        .map_err(|e| tok_err("Tokenizer::from_gguf", e))?;
                        PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                            PreTokenizerWrapper::Split(split),
                            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
                        ]))
                    }
                };
                tok.with_pre_tokenizer(Some(pre));
                tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
            } else {
                // The text's spaces become ▁ and one ▁ starts the text; decoding turns ▁ back
                // into spaces, <0xNN> tokens into bytes, and drops the one leading space.
                tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Metaspace(Metaspace::new(
                    '▁',
                    PrependScheme::First,
                    false,
                ))));
                let replace =
                    Replace::new("▁", " ").map_err(|e| tok_err("Tokenizer::from_gguf", e))?;
                tok.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
                    DecoderWrapper::Replace(replace),
                    DecoderWrapper::ByteFallback(ByteFallback::new()),
                    DecoderWrapper::Fuse(Fuse::new()),
                    DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
                ]))));
            }

            // Control tokens are special; those a byte-level file spells outside the byte
            // alphabet are mislabelled vocabulary entries and stay plain tokens.
            let spelled = |t: &str| !byte_level || t.chars().all(|c| alphabet.contains(&c));
            let typed = |kind: i32| {
                spec.tokens
                    .iter()
                    .zip(spec.token_types)
                    .filter(move |&(_, &ty)| ty == kind)
                    .map(|(t, _)| t.as_str())
            };
            let control: Vec<AddedToken> = typed(TOKEN_TYPE_CONTROL)
                .filter(|t| spelled(t))
                .map(|t| AddedToken::from(t, true).normalized(false))
                .collect();
            tok.add_special_tokens(control)
                .map_err(|e| tok_err("Tokenizer::from_gguf", e))?;
            let user: Vec<AddedToken> = typed(TOKEN_TYPE_USER_DEFINED)
                .filter(|t| tok.token_to_id(t).is_some())
                .map(|t| AddedToken::from(t, false).normalized(false))
                .collect();
            tok.add_tokens(user)
                .map_err(|e| tok_err("Tokenizer::from_gguf", e))?;
            // The named special tokens are special whatever their type.
            let name = |id: Option<u32>| id.and_then(|id| spec.tokens.get(id as usize));
            let named: Vec<AddedToken> = [spec.ids.bos, spec.ids.eos, spec.ids.unk, spec.ids.pad]
                .into_iter()
                .filter_map(name)
                .filter(|t| {
                    !tok.get_added_tokens_decoder()
                        .values()
                        .any(|a| &a.content == *t)
                })
                .map(|t| AddedToken::from(t.as_str(), true).normalized(false))
                .collect();
            tok.add_special_tokens(named)
                .map_err(|e| tok_err("Tokenizer::from_gguf", e))?;

            // bos and eos around the text when `encode` is asked for special tokens.
            let bos = name(spec.ids.bos)
                .zip(spec.ids.bos)
                .filter(|_| spec.add_bos);
            let eos = name(spec.ids.eos)
                .zip(spec.ids.eos)
                .filter(|_| spec.add_eos);
            let mut single = Vec::new();
            let mut pair = Vec::new();
            let mut specials = Vec::new();
            if let Some((t, id)) = bos {
                single.push(format!("{t}:0"));
                specials.push((t.clone(), id));
            }
            single.push("$A:0".to_string());
            if let Some((t, id)) = eos {
                single.push(format!("{t}:0"));
                if !specials.iter().any(|(_, i)| *i == id) {
                    specials.push((t.clone(), id));
                }
            }
            pair.extend(single.iter().cloned());
            if let Some((t, _)) = bos {
                pair.push(format!("{t}:1"));
            }
            pair.push("$B:1".to_string());
            if let Some((t, _)) = eos {
                pair.push(format!("{t}:1"));
            }
            let template = TemplateProcessing::builder()
                .try_single(single)
                .and_then(|b| b.try_pair(pair))
                .map_err(|e| fmt(format!("post-processor template: {e}")))?
                .special_tokens(specials)
                .build()
                .map_err(|e| fmt(format!("post-processor template: {e}")))?;
            tok.with_post_processor(Some(template));
            Ok(Backend(tok))
        }

        pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
            self.0
                .encode_fast(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| tok_err("Tokenizer::encode", e))
        }

        pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
            self.0
                .decode(ids, skip_special)
                .map_err(|e| tok_err("Tokenizer::decode", e))
        }

        pub fn vocab_size(&self) -> usize {
            self.0.get_vocab_size(true)
        }

        pub fn id_to_token(&self, id: u32) -> Option<String> {
            self.0.id_to_token(id)
        }

        pub fn token_to_id(&self, token: &str) -> Option<u32> {
            self.0.token_to_id(token)
        }
    }
}

#[cfg(not(feature = "tokenizers"))]
mod backend {
    //! Without the `tokenizers` feature no tokenizer can be built: [`Backend`] has no values,
    //! and the constructors say which feature to enable.

    use std::path::Path;

    use super::SpecialIds;
    use crate::error::{Error, Result};

    /// The GGUF metadata read for the tokenizer (unused without the feature).
    #[allow(dead_code)]
    pub(super) struct GgufSpec<'a> {
        pub path: &'a str,
        pub model: &'a str,
        pub pre: Option<&'a str>,
        pub tokens: &'a [String],
        pub token_types: &'a [i32],
        pub merges: Option<&'a [String]>,
        pub scores: Option<&'a [f32]>,
        pub ids: SpecialIds,
        pub add_bos: bool,
        pub add_eos: bool,
    }

    pub(super) enum Backend {}

    fn disabled(op: &'static str) -> Error {
        Error::invalid(
            op,
            "wgrad was built without the `tokenizers` cargo feature; enable it \
             (features = [\"tokenizers\"]) to load tokenizers",
        )
    }

    impl Backend {
        pub fn from_file(_: &Path) -> Result<Backend> {
            Err(disabled("Tokenizer::from_file"))
        }

        pub fn from_gguf(_: &GgufSpec<'_>) -> Result<Backend> {
            Err(disabled("Tokenizer::from_gguf"))
        }

        pub fn encode(&self, _: &str, _: bool) -> Result<Vec<u32>> {
            match *self {}
        }

        pub fn decode(&self, _: &[u32], _: bool) -> Result<String> {
            match *self {}
        }

        pub fn vocab_size(&self) -> usize {
            match *self {}
        }

        pub fn id_to_token(&self, _: u32) -> Option<String> {
            match *self {}
        }

        pub fn token_to_id(&self, _: &str) -> Option<u32> {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection() {
        let chars: Vec<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(byte_alphabet().len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
        assert!(chars.iter().all(|&c| (c as u32) < 324));
    }

    #[test]
    fn spelling_keeps_alphabet_tokens() {
        let a = byte_alphabet();
        assert_eq!(byte_level_spelling("<|im_start|>", &a), "<|im_start|>");
        assert_eq!(byte_level_spelling("Ġhello", &a), "Ġhello");
        assert_eq!(byte_level_spelling("a b", &a), "aĠb");
    }

    #[test]
    fn merges_from_scores_rank_by_score_then_length() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "abc", "bc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -3.0, -2.0];
        let m = merges_from_scores(&tokens, &scores);
        let m: Vec<(&str, &str)> = m.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        assert_eq!(m, [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]);
    }
}
