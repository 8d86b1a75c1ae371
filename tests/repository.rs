//! The repository describes the project as it is: no file narrates the rounds of its
//! development (history lives in git and CHANGELOG.md). This test fails on the words that
//! did: the name of a round of work, and ordinal round numbers past the tenth.

use std::path::{Path, PathBuf};

/// The words, built from parts so that this file does not contain them.
fn forbidden() -> Vec<String> {
    let mut words = vec![["ses", "sion"].concat()];
    let teens = [
        "eleven",
        "twelf",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    words.extend(teens.iter().map(|w| format!("{w}th")));
    let units = [
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    ];
    for tens in ["twent", "thirt", "fort"] {
        words.push(format!("{tens}ieth"));
        for u in units {
            words.push(format!("{tens}y-{u}"));
        }
    }
    words
}

/// Text files a person reads: code, shaders, docs, scripts, results. Data and fixtures are
/// third-party content and are not checked.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() {
            let skip = ["target", "data", "fixtures", ".git", ".gl", ".whl"];
            if !skip.contains(&name.as_str()) && !name.starts_with(".gpu") {
                files(&p, out);
            }
        } else {
            let text = ["rs", "wgsl", "md", "py", "sh", "toml", "json", "txt"];
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if text.contains(&ext) || name == "run" {
                out.push(p);
            }
        }
    }
}

#[test]
fn no_file_narrates_development_rounds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(root, &mut all);
    // Where git is at hand, only the project's files: what git tracks or would (build trees
    // and downloads under ignored directories are someone else's text).
    let listed = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output();
    if let Some(out) = listed.ok().filter(|o| o.status.success()) {
        let project: std::collections::HashSet<PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| root.join(l))
            .collect();
        all.retain(|p| project.contains(p));
    }
    assert!(
        all.len() > 50,
        "found only {} files under {root:?}",
        all.len()
    );
    let words = forbidden();
    let mut hits = Vec::new();
    for path in &all {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for w in &words {
                if lower.contains(w.as_str()) {
                    hits.push(format!(
                        "{}:{}: {w:?}",
                        path.strip_prefix(root).unwrap_or(path).display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "files that narrate development (say the rule and its reason instead; history \
         belongs in git and CHANGELOG.md):\n{}",
        hits.join("\n")
    );
}
