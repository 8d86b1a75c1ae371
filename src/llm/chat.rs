//! Chat templates: a conversation rendered as the prompt text a chat model was trained on.
//!
//! Published chat models ship a Jinja template (`tokenizer.chat_template` in GGUF metadata,
//! `chat_template` in a checkpoint's `tokenizer_config.json` or a `chat_template.jinja` file).
//! [`ChatTemplate`] renders it with [MiniJinja](https://docs.rs/minijinja) set up the way
//! transformers' `apply_chat_template` sets up Jinja2, so the text is the same byte for byte:
//!
//! * `trim_blocks` and `lstrip_blocks` on, the template's one trailing newline dropped;
//! * the variables `messages` (a list of `{role, content}`), `add_generation_prompt`, `tools`
//!   and `documents` (both `none`), and the special tokens' texts `bos_token`, `eos_token`,
//!   `unk_token` and `pad_token` where they are known;
//! * `raise_exception(message)` fails the render with that message; `strftime_now(format)`
//!   formats the current time (UTC; `%Y %y %m %d %-d %e %H %I %M %S %p %b %B %a %A %j %%`);
//! * `tojson` writes JSON as Python's `json.dumps` does (`", "` and `": "` separators, no HTML
//!   escaping; `indent`, `separators`, `sort_keys` and `ensure_ascii` arguments);
//! * `break` and `continue` in loops, `namespace()`, and Python's string, dict and list
//!   methods (`strip`, `split`, `startswith`, `items`, `get`...).
//!
//! Not supported: transformers' `{% generation %}` tag (for assistant-token masks), and
//! messages with fields other than role and content (tool calls, images).

use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Environment, ErrorKind, Value};

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// The name the template is stored under in its environment: no extension, so no HTML
/// escaping.
const NAME: &str = "chat";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who speaks: `"system"`, `"user"` or `"assistant"` (templates may know others).
    pub role: String,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message of `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// A message as the template sees it: a mapping whose keys come in the order `role`,
/// `content`, as a Python dict built that way iterates (and `tojson` writes) them.
#[derive(Debug)]
struct MessageValue(Message);

impl Object for MessageValue {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.as_str())),
            "content" => Some(Value::from(self.0.content.as_str())),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["role", "content"])
    }
}

/// A compiled chat template and the special tokens' texts it may refer to.
///
/// ```
/// use wgrad::llm::{ChatTemplate, Message};
///
/// # fn main() -> wgrad::Result<()> {
/// let template = ChatTemplate::new(
///     "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}\n{% endfor %}\
///      {% if add_generation_prompt %}<|assistant|>{% endif %}",
/// )?
/// .with_special_token("eos_token", "</s>");
/// let text = template.render(&[Message::user("  Hello! ")], true)?;
/// assert_eq!(text, "<|user|>Hello!</s>\n<|assistant|>");
/// # Ok(())
/// # }
/// ```
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// `(name, text)` of the special tokens passed to the template.
    special: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("special", &self.special)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template; a syntax error is an [`Error::Invalid`] with MiniJinja's message.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate> {
        let source = source.into();
        compile(source).map_err(|e| Error::invalid("ChatTemplate::new", describe(&e)))
    }

    /// The template in `tokenizer.chat_template` of a GGUF file, with the texts of the tokens
    /// that `tokenizer.ggml.bos_token_id`, `eos_token_id`, `unknown_token_id` and
    /// `padding_token_id` name. A missing key or a template that does not compile is an
    /// [`Error::Format`] naming the file.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate> {
        let source = file.get_str("tokenizer.chat_template")?;
        let mut template = compile(source.to_string()).map_err(|e| {
            Error::format(
                file.path(),
                format!("tokenizer.chat_template: {}", describe(&e)),
            )
        })?;
        let tokens = match file.get("tokenizer.ggml.tokens") {
            Some(_) => file.get_str_array("tokenizer.ggml.tokens")?,
            None => &[],
        };
        for (name, key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            if file.get(key).is_none() {
                continue;
            }
            let id = file.get_u32(key)?;
            let text = tokens.get(id as usize).ok_or_else(|| {
                Error::format(
                    file.path(),
                    format!(
                        "{key} = {id} is past the vocabulary ({} tokens)",
                        tokens.len()
                    ),
                )
            })?;
            template = template.with_special_token(name, text);
        }
        Ok(template)
    }

    /// The template of a Hugging Face checkpoint directory: `chat_template.jinja` where it
    /// exists, else `chat_template` in `tokenizer_config.json` (a string, or a list of
    /// `{name, template}` of which the one named `default` is taken); with the special
    /// tokens' texts from `tokenizer_config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<ChatTemplate> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<serde_json::Value> = match std::fs::read(&config_path) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                Error::format(config_path.display().to_string(), format!("not JSON: {e}"))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = match std::fs::read_to_string(&jinja_path) {
            Ok(s) => (s, jinja_path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let from_config = config
                    .as_ref()
                    .and_then(|c| c.get("chat_template"))
                    .and_then(|t| match t {
                        serde_json::Value::String(s) => Some(s.clone()),
                        serde_json::Value::Array(list) => list
                            .iter()
                            .find(|e| e.get("name").and_then(|n| n.as_str()) == Some("default"))
                            .and_then(|e| e.get("template"))
                            .and_then(|t| t.as_str())
                            .map(str::to_string),
                        _ => None,
                    });
                match from_config {
                    Some(s) => (s, config_path.display().to_string()),
                    None => {
                        return Err(Error::format(
                            dir.display().to_string(),
                            "no chat_template.jinja, and no chat_template in tokenizer_config.json",
                        ));
                    }
                }
            }
            Err(e) => return Err(e.into()),
        };
        let mut template = compile(source)
            .map_err(|e| Error::format(origin, format!("chat template: {}", describe(&e))))?;
        if let Some(config) = &config {
            for name in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                let text = config.get(name).and_then(|v| {
                    v.as_str()
                        .or_else(|| v.get("content").and_then(serde_json::Value::as_str))
                });
                if let Some(text) = text {
                    template = template.with_special_token(name, text);
                }
            }
        }
        Ok(template)
    }

    /// Sets a special token's text the template can use by `name` (`bos_token`, `eos_token`,
    /// `unk_token`, `pad_token`, or another name a template reads).
    pub fn with_special_token(mut self, name: &str, text: &str) -> ChatTemplate {
        match self.special.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = text.to_string(),
            None => self.special.push((name.to_string(), text.to_string())),
        }
        self
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text of a special token the template is given, if set.
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// Renders `messages`; with `add_generation_prompt`, the text that opens the assistant's
    /// reply follows (SmolLM2: `<|im_start|>assistant\n`). A `raise_exception` in the
    /// template, or a failing expression, is an [`Error::Invalid`] with its message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| Value::from_object(MessageValue(m.clone())))
            .collect();
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".to_string(), Value::from(messages)),
            ("tools".to_string(), Value::from(())),
            ("documents".to_string(), Value::from(())),
            (
                "add_generation_prompt".to_string(),
                Value::from(add_generation_prompt),
            ),
        ];
        for (name, text) in &self.special {
            ctx.push((name.clone(), Value::from(text.as_str())));
        }
        let ctx: std::collections::BTreeMap<String, Value> = ctx.into_iter().collect();
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(Value::from(ctx)))
            .map_err(|e| Error::invalid("ChatTemplate::render", describe(&e)))
    }
}

impl FromStr for ChatTemplate {
    type Err = Error;

    /// [`ChatTemplate::new`].
    fn from_str(source: &str) -> Result<ChatTemplate> {
        ChatTemplate::new(source)
    }
}

/// The environment with the template loaded, set up as transformers sets up Jinja2.
fn compile(source: String) -> std::result::Result<ChatTemplate, minijinja::Error> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(NAME, source.clone())?;
    Ok(ChatTemplate {
        env,
        source,
        special: Vec::new(),
    })
}

/// A MiniJinja error with the errors that caused it.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(s, ": {c}");
        cause = c.source();
    }
    s
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time in a strftime format.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&format, secs)
}

/// Formats the UTC time `secs` seconds after 1970-01-01 by the strftime directives the module
/// documentation lists; other directives are written as they are.
fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_date(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[weekday];

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |v: i64, width: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &num(year.rem_euclid(100), 2),
            Some('m') => out += &num(month, 2),
            Some('d') => out += &num(day, 2),
            Some('e') => out += &format!("{day:2}"),
            Some('H') => out += &num(hour, 2),
            Some('I') => out += &num((hour + 11) % 12 + 1, 2),
            Some('M') => out += &num(minute, 2),
            Some('S') => out += &num(second, 2),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('b') | Some('h') => out += &month_name[..3],
            Some('B') => out += month_name,
            Some('a') => out += &day_name[..3],
            Some('A') => out += day_name,
            Some('j') => out += &num(day_of_year, 3),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian (year, month, day) of a day count from 1970-01-01, through 400-year
/// eras of 146,097 days that start on March 1st (so the leap day ends a year).
fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468; // days from 0000-03-01
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The inverse of [`civil_date`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// How `tojson` writes: Python's `json.dumps` arguments.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`: JSON as
/// transformers' template filter writes it (Python's `json.dumps`).
fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let item = seps.get_item_by_index(0)?;
            let key = seps.get_item_by_index(1)?;
            (
                item.as_str().unwrap_or(",").to_string(),
                key.as_str().unwrap_or(":").to_string(),
            )
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    // Before each item of a list or mapping: the line break and indent, when indenting.
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let f = f64::try_from(value.clone())?;
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                match key.as_str() {
                    Some(k) => write_json_str(out, k, style),
                    None => write_json_str(out, &key.to_string(), style),
                }
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        _ => write_json_str(out, &value.to_string(), style),
    }
    Ok(())
}

/// A JSON string as Python writes it: quotes, backslashes and control characters escaped;
/// with `ensure_ascii`, every non-ASCII character as `\uXXXX` (UTF-16 units).
fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it: the shortest digits that read back the same, with a
/// `.0` on whole numbers, and an exponent (`1e-05`, `1e+16`) outside [1e-4, 1e16).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let a = f.abs();
    if a == 0.0 || (1e-4..1e16).contains(&a) {
        return format!("{f:?}");
    }
    let s = format!("{f:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        // 2024-07-26 12:34:56 UTC, a Friday.
        let t = days_from_civil(2024, 7, 26) * 86_400 + 12 * 3600 + 34 * 60 + 56;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %H:%M:%S %p %j %% %Q", t),
            "Friday July 26, 12:34:56 PM 208 % %Q"
        );
    }

    #[test]
    fn floats_as_python() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e-5), "1e-05");
        assert_eq!(python_float(1.5e20), "1.5e+20");
        assert_eq!(python_float(-2.5), "-2.5");
    }

    #[test]
    fn tojson_like_json_dumps() -> Result<()> {
        let t = ChatTemplate::new(
            "{{ messages[0] | tojson }}|{{ {'b': [1, 2.5, none, true], 'a': 'x<\"é'} | tojson(sort_keys=true) }}|\
             {{ [1, {'k': []}] | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=true) }}",
        )?;
        let s = t.render(&[Message::user("hi\n")], false)?;
        assert_eq!(
            s,
            "{\"role\": \"user\", \"content\": \"hi\\n\"}|{\"a\": \"x<\\\"é\", \"b\": [1, 2.5, null, true]}|\
             [\n  1,\n  {\n    \"k\": []\n  }\n]|\"\\u00e9\""
        );
        Ok(())
    }

    #[test]
    fn exceptions_and_python_methods() -> Result<()> {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
             {{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}\
             {{ m.content.strip().upper() }}{% if loop.last %}{% break %}{% endif %}{% endfor %}",
        )?;
        assert_eq!(t.render(&[Message::user("  a b ")], false)?, "A B");
        let err = t.render(&[Message::system("x")], false).unwrap_err();
        assert!(err.to_string().contains("Only user and assistant"), "{err}");
        Ok(())
    }

    #[test]
    fn trim_and_lstrip_blocks() -> Result<()> {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n",
        )?;
        assert_eq!(t.render(&[Message::user("q")], false)?, "[q]\n");
        // Undefined special tokens render as nothing; `tools` is none, not undefined.
        let t = ChatTemplate::new("{{ bos_token }}{% if tools is none %}none{% endif %}")?;
        assert_eq!(t.render(&[], false)?, "none");
        Ok(())
    }

    #[test]
    fn syntax_errors_are_errors() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
}
