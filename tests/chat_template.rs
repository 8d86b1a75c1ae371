//! Chat templates in the styles published models use, rendered as transformers renders them:
//! tests/fixtures/chat_templates.json holds each template, its messages and transformers' text
//! (scripts/make_chat_template_reference.py), which `ChatTemplate::render` must match byte for
//! byte, or the message of the exception the template raises.

use std::path::PathBuf;

use serde_json::Value as Json;
use wgrad::llm::{ChatTemplate, Message};

fn fixture() -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("the fixture is JSON")
}

fn str_of<'a>(v: &'a Json, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let fixture = fixture();
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let mut wrong = Vec::new();
    for case in cases {
        let name = str_of(case, "name");
        let mut template =
            ChatTemplate::new(str_of(case, "template")).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (token, text) in case["special"].as_object().expect("special") {
            template = template.with_special_token(token, text.as_str().expect("token text"));
        }
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| Message::new(str_of(m, "role"), str_of(m, "content")))
            .collect();
        let add = case["add_generation_prompt"]
            .as_bool()
            .expect("add_generation_prompt");
        let got = template.render(&messages, add);
        match (case.get("text").and_then(Json::as_str), got) {
            (Some(want), Ok(got)) if got == want => {}
            (Some(want), got) => wrong.push(format!("{name}:\n  want {want:?}\n  got  {got:?}")),
            (None, Err(e)) => {
                let want = str_of(case, "error");
                if !e.to_string().contains(want) {
                    wrong.push(format!("{name}: error {e} does not say {want:?}"));
                }
            }
            (None, Ok(got)) => wrong.push(format!("{name}: rendered {got:?} instead of failing")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn from_str_and_special_tokens() {
    let template: ChatTemplate = "{{ bos_token }}{{ messages | length }}{{ eos_token }}"
        .parse()
        .expect("compiles");
    assert_eq!(
        template
            .render(&[Message::user("a")], false)
            .expect("render"),
        "1"
    );
    let template = template
        .with_special_token("bos_token", "<s>")
        .with_special_token("eos_token", "</s>")
        .with_special_token("bos_token", "<bos>");
    assert_eq!(template.special_token("bos_token"), Some("<bos>"));
    assert_eq!(
        template
            .render(&[Message::user("a"), Message::assistant("b")], false)
            .expect("render"),
        "<bos>2</s>"
    );
}

#[test]
fn checkpoint_directory_templates() {
    let dir = std::env::temp_dir().join(format!("wgrad-chat-template-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A tokenizer_config.json with the template and special tokens, one as an added token.
    let config = serde_json::json!({
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "</s>",
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}
        ]
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
    let t = ChatTemplate::from_dir(&dir).expect("from tokenizer_config.json");
    assert_eq!(
        t.render(&[Message::user("hi")], false).expect("render"),
        "<s>hi</s>"
    );
    // chat_template.jinja takes precedence.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "[{{ messages[0].role }}]\n",
    )
    .expect("write");
    let t = ChatTemplate::from_dir(&dir).expect("from chat_template.jinja");
    assert_eq!(
        t.render(&[Message::user("hi")], false).expect("render"),
        "[user]"
    );
    // Neither: an error naming the directory.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    let err = ChatTemplate::from_dir(&empty).unwrap_err().to_string();
    assert!(
        err.contains("empty") && err.contains("chat_template"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
