"""Writes tests/fixtures/chat_templates.json: chat templates in the styles published models use
(Llama 3, Qwen, Mistral, Zephyr/Phi-3), rendered by transformers' own Jinja2 setup, for
tests/chat_template.rs to match byte for byte.

Each case holds the template, the special tokens given to it, the messages, whether a generation
prompt was asked for, and either the rendered `text` or the `error` message raised.

    python3 -m pip install transformers jinja2
    python3 scripts/make_chat_template_reference.py
"""
import json
import os

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "chat_templates.json")

# Header-per-turn, system message trimmed and moved out of the list, `is defined` checks.
LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# A namespace updated in a reversed loop, Python string methods, tools checked against none.
QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}{{- tools | tojson }}{{- '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n</think>\\n\\n' + content.strip() + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Alternation enforced with raise_exception, eos after each answer.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

# No whitespace control: trim_blocks and lstrip_blocks alone decide the newlines.
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

# Loop controls, previous items, message keys and JSON of the whole message.
MISC = """{% for message in messages %}
    {% if loop.index0 == 3 %}{% break %}{% endif %}
    {% if message.role == 'system' %}{% continue %}{% endif %}
    {{ loop.index }}/{{ loop.length }} {{ message | tojson }} {{ message.keys() | list | join(',') }}
    {%- if loop.previtem is defined %} after {{ loop.previtem.role | upper }}{% endif %}

{% endfor %}
{{ messages | map(attribute='content') | map('length') | join('+') }} {{ "%s-%s" | format(bos_token, eos_token) }}
{{ (messages | selectattr('role', 'equalto', 'user') | list | length) }} {{ messages[-1].content.replace('!', '?').title() }}
"""

CHAT = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi \"there\" \u00e9\u00e8 \U0001F980"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
    {"role": "user", "content": "Bye now!"},
]
ALTERNATING = [m for m in CHAT if m["role"] != "system"]

CASES = [
    ("llama3", LLAMA3, CHAT, True),
    ("llama3 no system", LLAMA3, ALTERNATING, False),
    ("qwen", QWEN, CHAT, True),
    ("qwen first system", QWEN, CHAT[1:2] + CHAT[:1], False),
    ("mistral", MISTRAL, ALTERNATING, False),
    ("mistral with system", MISTRAL, CHAT, False),
    ("zephyr", ZEPHYR, CHAT, True),
    ("zephyr no prompt", ZEPHYR, CHAT, False),
    ("misc", MISC, CHAT, False),
]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def main():
    cases = []
    for name, template, messages, add in CASES:
        case = {"name": name, "template": template, "special": SPECIAL, "messages": messages,
                "add_generation_prompt": add}
        try:
            rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                                add_generation_prompt=add, **SPECIAL)
            case["text"] = rendered[0]
        except Exception as e:  # the template's raise_exception
            case["error"] = str(e)
        cases.append(case)
    with open(OUT, "w") as f:
        json.dump({"transformers": transformers.__version__, "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
