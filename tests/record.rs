//! BENCHMARKS.md, the table of record, is generated from the results files in
//! `benches/results/*.json`: this test checks every file against the schema, renders the
//! markdown and compares it with BENCHMARKS.md. With `WGRAD_WRITE_RECORD=1` it writes the file
//! instead:
//!
//! ```text
//! WGRAD_WRITE_RECORD=1 cargo test --release --test record
//! ```
//!
//! A results file is one run on one device (`<date>-<device>-<what>.json`, made by
//! `benches/record.py` from the benchmarks' outputs):
//!
//! | key | |
//! |---|---|
//! | `suite` | `kernels`, `training`, `memory`, `multi-gpu`, `lavapipe`, `llm`, or any other word: a section of the record |
//! | `device`, `backend`, `driver` | the adapter as the run reported it |
//! | `date`, `commit`, `command` | when, which build (7-40 hex digits), and the command that made the figures |
//! | `rows` | the figures: objects with a `name` and any other scalar columns |
//! | `wgpu`, `reference`, `title`, `note`, `commit_time`, `columns` (optional) | wgpu's version; what wgrad was compared with; a heading; a paragraph; the commit's time (orders runs of one date); columns to show first, as `"key"` or `"key=heading"` |
//!
//! Row columns are rendered in a fixed order where known (`name`, `size`, `dtype`, `wgrad_ms`,
//! `reference_ms`, `ratio`, ...), then the others; `note` last. Numeric columns: `ratio` is
//! wgrad's rate over the reference's (1.0 = parity, above 1 faster), `time_ratio` wgrad's time
//! over the reference's (whole training steps), `memory_ratio` wgrad's peak memory over the
//! reference's; every column ending in `_ms` or `ratio` is a positive number. Ranges across
//! runs are text in `note`.

use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const REQUIRED: [&str; 8] = [
    "suite", "device", "backend", "driver", "date", "commit", "command", "rows",
];
const OPTIONAL: [&str; 6] = [
    "wgpu",
    "reference",
    "title",
    "note",
    "commit_time",
    "columns",
];

/// Sections in this order; any other suite follows them, by name.
const SUITES: [(&str, &str); 6] = [
    ("kernels", "Kernels"),
    ("training", "Training"),
    ("memory", "Memory"),
    ("multi-gpu", "More than one GPU"),
    ("lavapipe", "lavapipe (CPU)"),
    ("llm", "LLM inference"),
];

/// Columns in this order where present; then `wgrad_*`, `reference_*` and the rest by name;
/// `note` last.
const FIRST: [&str; 11] = [
    "name",
    "variant",
    "size",
    "dtype",
    "wgrad_ms",
    "reference_ms",
    "ratio",
    "rate",
    "reference_rate",
    "time_ratio",
    "memory_ratio",
];

/// Headings where the key alone would read badly.
const LABELS: [(&str, &str); 6] = [
    ("name", "what"),
    ("ratio", "ratio (wgrad rate / reference rate)"),
    ("rate", "wgrad rate"),
    ("time_ratio", "wgrad time / reference time"),
    ("memory_ratio", "wgrad memory / reference memory"),
    ("check", "max rel. error"),
];

/// One results file, checked.
struct Run {
    file: String,
    obj: Map<String, Value>,
}

impl Run {
    fn s(&self, key: &str) -> &str {
        self.obj.get(key).and_then(Value::as_str).unwrap_or("")
    }
    fn rows(&self) -> &[Value] {
        self.obj["rows"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().ok();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && s.bytes()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
        && matches!(num(5..7), Some(1..=12))
        && matches!(num(8..10), Some(1..=31))
}

fn is_word(s: &str, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(&c))
}

/// Every way `text` (the contents of `file`) breaks the schema; empty when it is a valid
/// results file.
fn check(file: &str, text: &str) -> (Vec<String>, Option<Run>) {
    let mut errs = Vec::new();
    let mut err = |m: String| errs.push(format!("{file}: {m}"));
    // The project keeps this word out of its files (spelled in two parts so that this
    // file keeps it out too).
    let banned = concat!("ses", "sion");
    if text.to_lowercase().contains(banned) {
        err(format!("the word {banned:?} has no place in the record"));
    }
    let stem = file.strip_suffix(".json").unwrap_or("");
    if stem.is_empty() || !is_word(stem, b"-.") {
        err("the name is not <date>-<device>-<what>.json in lower case".into());
    }
    let obj = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => o,
        Ok(_) => {
            err("not a JSON object".into());
            return (errs, None);
        }
        Err(e) => {
            err(format!("not JSON: {e}"));
            return (errs, None);
        }
    };
    for k in REQUIRED {
        match obj.get(k) {
            None => err(format!("`{k}` missing")),
            Some(Value::String(s)) if s.trim().is_empty() => err(format!("`{k}` is empty")),
            Some(Value::String(_)) if k != "rows" => {}
            Some(Value::Array(a)) if k == "rows" && !a.is_empty() => {}
            Some(_) if k == "rows" => err("`rows` is not a non-empty array".into()),
            Some(_) => err(format!("`{k}` is not a string")),
        }
    }
    for (k, v) in &obj {
        if REQUIRED.contains(&k.as_str()) {
            continue;
        }
        if !OPTIONAL.contains(&k.as_str()) {
            err(format!("unknown key `{k}`"));
        } else if k == "columns" {
            let col = |c: &str| {
                let (key, label) = c.split_once('=').unwrap_or((c, "x"));
                is_word(key, b"_") && !label.trim().is_empty()
            };
            let ok = v
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c.as_str().is_some_and(col)));
            if !ok {
                err("`columns` is not an array of \"key\" or \"key=label\"".into());
            }
        } else if v.as_str().is_none_or(|s| s.trim().is_empty()) {
            err(format!("`{k}` is not a non-empty string"));
        }
    }
    let s = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or("");
    if !is_date(s("date")) {
        err(format!("`date` {:?} is not YYYY-MM-DD", s("date")));
    } else if !file.starts_with(&format!("{}-", s("date"))) {
        err("the file name does not start with the run's date".into());
    }
    let commit = s("commit");
    if !(7..=40).contains(&commit.len())
        || !commit
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    {
        err(format!(
            "`commit` {commit:?} is not 7-40 lower-case hex digits"
        ));
    }
    if let Some(t) = obj.get("commit_time").and_then(Value::as_str)
        && !(t.len() >= 16 && is_date(&t[..10]) && t.as_bytes()[10] == b'T')
    {
        err(format!("`commit_time` {t:?} is not YYYY-MM-DDTHH:MM..."));
    }
    if !is_word(s("suite"), b"-") {
        err(format!("`suite` {:?} is not a lower-case word", s("suite")));
    }
    if s("command").contains('`') {
        err("`command` holds a backtick".into());
    }
    let rows = obj.get("rows").and_then(Value::as_array);
    for (i, row) in rows.into_iter().flatten().enumerate() {
        let Some(row) = row.as_object() else {
            err(format!("row {i} is not an object"));
            continue;
        };
        let name = row.get("name").and_then(Value::as_str).unwrap_or("");
        if name.trim().is_empty() {
            err(format!("row {i} has no name"));
        }
        let at = format!("row {i} ({name})");
        for (k, v) in row {
            if !is_word(k, b"_") {
                err(format!("{at}: key `{k}` is not lower_case"));
            }
            match v {
                Value::Number(n) => {
                    if !n.as_f64().is_some_and(f64::is_finite) {
                        err(format!("{at}: `{k}` is not a finite number"));
                    }
                }
                Value::String(_) | Value::Bool(_) => {}
                _ => err(format!("{at}: `{k}` is not a string, number or boolean")),
            }
            if (k.ends_with("_ms") || k.ends_with("ratio"))
                && !v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)
            {
                err(format!(
                    "{at}: `{k}` is not a positive number (ranges go in `note`)"
                ));
            }
        }
        let num = |k: &str| row.get(k).and_then(Value::as_f64);
        // The ratios, where both times are given, must be what the times say (as rounded in
        // the record: to 0.005, or a percent).
        let near = |have: f64, want: f64| (have - want).abs() <= 0.0051 + 0.01 * want;
        if let (Some(w), Some(r)) = (num("wgrad_ms"), num("reference_ms")) {
            if let Some(q) = num("ratio")
                && !near(q, r / w)
            {
                err(format!("{at}: ratio {q} but the times give {:.3}", r / w));
            }
            if let Some(q) = num("time_ratio")
                && !near(q, w / r)
            {
                err(format!(
                    "{at}: time_ratio {q} but the times give {:.3}",
                    w / r
                ));
            }
        }
    }
    let run = errs.is_empty().then(|| Run {
        file: file.to_string(),
        obj,
    });
    (errs, run)
}

/// The results files, checked; panics with every problem found.
fn load(dir: &Path) -> Vec<Run> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let (mut runs, mut errs) = (Vec::new(), Vec::new());
    for p in files {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&p).unwrap();
        let (e, run) = check(&name, &text);
        errs.extend(e);
        runs.extend(run);
    }
    assert!(errs.is_empty(), "benches/results:\n{}", errs.join("\n"));
    assert!(!runs.is_empty(), "no results files in {}", dir.display());
    runs
}

/// The run's `columns`: (key, label given) in order.
fn given(run: &Run) -> Vec<(&str, Option<&str>)> {
    let cols = run.obj.get("columns").and_then(Value::as_array);
    cols.into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|c| match c.split_once('=') {
            Some((k, l)) => (k, Some(l)),
            None => (c, None),
        })
        .collect()
}

fn label(run: &Run, key: &str) -> String {
    if let Some((_, Some(l))) = given(run).into_iter().find(|(k, _)| *k == key) {
        return l.to_string();
    }
    if let Some((_, l)) = LABELS.iter().find(|(k, _)| *k == key) {
        return l.to_string();
    }
    key.replace("_per_s", "/s")
        .replace("_mib", " MiB")
        .replace("_ms", " ms")
        .replace('_', " ")
}

/// The row keys of a run in the order they are shown.
fn columns(run: &Run) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for row in run.rows() {
        for k in row.as_object().unwrap().keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let given = given(run);
    let rank = |k: &str| -> (usize, usize, String) {
        if let Some(i) = given.iter().position(|(g, _)| *g == k) {
            return (0, i, String::new());
        }
        if k == "note" {
            return (5, 0, String::new());
        }
        if let Some(i) = FIRST.iter().position(|f| *f == k) {
            return (1, i, String::new());
        }
        let group = if k.starts_with("wgrad_") {
            2
        } else if k.starts_with("reference_") {
            3
        } else {
            4
        };
        (group, 0, k.to_string())
    };
    keys.sort_by_key(|k| rank(k));
    keys
}

fn cell(v: Option<&Value>) -> String {
    let s = match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    s.replace('|', "\\|").replace('\n', " ")
}

fn suite_rank(suite: &str) -> (usize, String) {
    match SUITES.iter().position(|(s, _)| *s == suite) {
        Some(i) => (i, String::new()),
        None => (SUITES.len(), suite.to_string()),
    }
}

fn render(runs: &[Run]) -> String {
    let mut out = String::new();
    out.push_str(
        "# Benchmarks: the table of record

Generated from the results files in [`benches/results/`](benches/results/) by
`tests/record.rs`: do not edit it by hand. Add or change a results file, then run
`WGRAD_WRITE_RECORD=1 cargo test --release --test record` (`cargo test --release --test
record` checks the file against the results and the results against their schema).

How results are made: on a machine with a GPU, `benches/gpu_run.sh` runs the benchmarks from
binaries built elsewhere (docs/performance.md, \"Numbers on a GPU\"). `bench --json` times wgrad's kernels;
`benches/torch_compare.py` times PyTorch on every row of that output, on the same GPU in the
same call; `benches/record.py` turns those outputs, and those of `train_gpt --bench`,
`benches/gpt_step.py`, `train_mnist` and `memory_bench --json`, into a results file. \"ratio\"
is wgrad's rate over the reference's, both measured in the same call (1.0 = parity, above 1
faster); for whole training steps the record gives wgrad's time over the reference's, and
says so. Where the record gives a range across runs instead of one figure, the range is in
the row's note. Each run below names its device, backend, driver, date, the commit measured
and the command; newest first within each section.

What each kernel does, what bounds it and what was tried and not kept:
[docs/performance.md](docs/performance.md), the performance notes by kernel.
",
    );
    let mut order: Vec<&Run> = runs.iter().collect();
    order.sort_by(|a, b| {
        suite_rank(a.s("suite"))
            .cmp(&suite_rank(b.s("suite")))
            .then_with(|| b.s("date").cmp(a.s("date")))
            .then_with(|| b.s("commit_time").cmp(a.s("commit_time")))
            .then_with(|| a.file.cmp(&b.file))
    });
    let mut suite = "";
    for run in order {
        if run.s("suite") != suite {
            suite = run.s("suite");
            let title = SUITES
                .iter()
                .find(|(s, _)| *s == suite)
                .map_or(suite, |(_, t)| *t);
            let _ = write!(out, "\n## {title}\n");
        }
        let title = match run.s("title") {
            "" => run.file.trim_end_matches(".json").to_string(),
            t => t.to_string(),
        };
        let _ = write!(
            out,
            "\n### {}, {}: {title}\n\n",
            run.s("date"),
            run.s("device")
        );
        let mut dev = format!(
            "{}, {}, driver {}",
            run.s("device"),
            run.s("backend"),
            run.s("driver")
        );
        if !run.s("wgpu").is_empty() {
            let _ = write!(dev, ", wgpu {}", run.s("wgpu"));
        }
        let _ = writeln!(out, "- Device: {dev}");
        if !run.s("reference").is_empty() {
            let _ = writeln!(out, "- Reference: {}", run.s("reference"));
        }
        let when = match run.s("commit_time") {
            "" => String::new(),
            t => format!(" (committed {} {} UTC)", &t[..10], &t[11..16]),
        };
        let _ = writeln!(
            out,
            "- Date: {}; commit {}{when}",
            run.s("date"),
            run.s("commit")
        );
        let _ = writeln!(out, "- Command: `{}`", run.s("command"));
        let _ = writeln!(
            out,
            "- Results: [benches/results/{0}](benches/results/{0})",
            run.file
        );
        if !run.s("note").is_empty() {
            let _ = write!(out, "\n{}\n", run.s("note"));
        }
        let cols = columns(run);
        let _ = write!(
            out,
            "\n| {} |\n|{}\n",
            cols.iter()
                .map(|c| label(run, c))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(cols.len())
        );
        for row in run.rows() {
            let row = row.as_object().unwrap();
            let cells: Vec<String> = cols.iter().map(|c| cell(row.get(c))).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out
}

#[test]
fn benchmarks_md_is_generated_from_the_results() {
    let runs = load(&root().join("benches/results"));
    let md = render(&runs);
    let path = root().join("BENCHMARKS.md");
    if std::env::var("WGRAD_WRITE_RECORD").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &md).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != md {
        let line = have
            .lines()
            .zip(md.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(md.lines().count()));
        panic!(
            "BENCHMARKS.md differs from what benches/results/*.json render (first at line {}); \
             run `WGRAD_WRITE_RECORD=1 cargo test --release --test record`",
            line + 1
        );
    }
}

fn problems(file: &str, text: &str) -> String {
    check(file, text).0.join("\n")
}

const GOOD: &str = r#"{"suite": "kernels", "device": "GPU", "backend": "Vulkan",
    "driver": "1.0", "date": "2026-11-26", "commit": "13436c2", "command": "bench --json",
    "rows": [{"name": "matmul", "wgrad_ms": 0.4922, "reference_ms": 0.2089, "ratio": 0.42}]}"#;

#[test]
fn a_valid_file_passes_and_renders_its_columns() {
    let (errs, run) = check("2026-11-26-gpu-kernels.json", GOOD);
    assert!(errs.is_empty(), "{errs:?}");
    let md = render(&[run.unwrap()]);
    assert!(
        md.contains("| what | wgrad ms | reference ms | ratio (wgrad rate / reference rate) |")
    );
    assert!(md.contains("| matmul | 0.4922 | 0.2089 | 0.42 |"), "{md}");
    assert!(md.contains("- Date: 2026-11-26; commit 13436c2\n"));
    let given = GOOD.replace(
        "\"rows\"",
        "\"columns\": [\"ratio=rate ratio\", \"name\"], \"rows\"",
    );
    let (errs, run) = check("2026-11-26-gpu-kernels.json", &given);
    assert!(errs.is_empty(), "{errs:?}");
    let md = render(&[run.unwrap()]);
    assert!(
        md.contains("| rate ratio | what | wgrad ms | reference ms |"),
        "{md}"
    );
}

#[test]
fn the_schema_catches_what_a_hand_edit_gets_wrong() {
    let f = "2026-11-26-gpu-kernels.json";
    let with = |from: &str, to: &str| GOOD.replace(from, to);
    assert!(problems(f, &with("\"driver\": \"1.0\",", "")).contains("`driver` missing"));
    assert!(problems(f, &with("\"name\": \"matmul\",", "")).contains("row 0 has no name"));
    assert!(problems(f, &with("0.42", "0.52")).contains("ratio 0.52 but the times give 0.424"));
    assert!(problems(f, &with("0.4922", "\"0.49-0.50\"")).contains("not a positive number"));
    assert!(problems(f, &with("0.4922", "1e999")).contains("not JSON"));
    assert!(problems(f, &with("13436c2", "HEAD")).contains("hex digits"));
    assert!(problems(f, &with("2026-11-26", "26.11.2026")).contains("YYYY-MM-DD"));
    assert!(problems("2026-11-25-gpu-kernels.json", GOOD).contains("run's date"));
    assert!(problems(f, &with("\"rows\"", "\"lines\"")).contains("unknown key `lines`"));
    assert!(problems(f, &with("bench --json", "bench `--json`")).contains("backtick"));
    let banned = concat!("Ses", "sion");
    assert!(problems(f, &with("matmul", banned)).contains("has no place"));
    assert!(problems(f, &with("\"ratio\": 0.42", "\"x\": [1]")).contains("not a string, number"));
}
