//! `--chat-template`: a Jinja chat template given inline, or one of a few formats by name as
//! llama-server names its built-in ones (`chatml`, `llama3`, `command-r`), each written
//! here as a Jinja template that renders that format.

/// ChatML (`<|im_start|>role\n…<|im_end|>\n`).
const CHATML: &str = "{%- for m in messages -%}\
{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}";

/// Llama 3's header blocks.
const LLAMA3: &str = "{%- for m in messages -%}\
{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}";

/// Command R's turn tokens (the assistant's turn is the chatbot's).
const COMMAND_R: &str = "{%- set names = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'} -%}\
{%- for m in messages -%}\
{{- '<|START_OF_TURN_TOKEN|><|' + names.get(m['role'], m['role'] | upper) + '_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}";

/// The names `--chat-template` knows.
pub const NAMES: [&str; 3] = ["chatml", "llama3", "command-r"];

/// `--chat-template VALUE`: (a label for errors, the Jinja source). One of [`NAMES`] is
/// that format; any other value is the template itself, as llama-server takes it (a value
/// without Jinja markup then renders as the literal text, and a line on stderr says so).
pub fn resolve(value: &str) -> (String, String) {
    let source = match value.trim() {
        "chatml" => CHATML,
        "llama3" => LLAMA3,
        "command-r" => COMMAND_R,
        _ => {
            if !value.contains("{{") && !value.contains("{%") {
                eprintln!(
                    "qkv-server: --chat-template: {value:?} is none of the named formats ({}) \
                     and holds no Jinja markup: it renders as written",
                    NAMES.join(", ")
                );
            }
            return ("--chat-template".into(), value.to_owned());
        }
    };
    (
        format!("built-in template {}", value.trim()),
        source.to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use qkv::tokenizer::{ChatOptions, ChatTemplate};
    use serde_json::json;

    fn render(name: &str) -> String {
        let (label, source) = resolve(name);
        let msgs = [
            json!({"role": "system", "content": "You are a test."}),
            json!({"role": "user", "content": "Hi there"}),
        ];
        let options = ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        ChatTemplate::new(label.as_str(), source.as_str())
            .render(&msgs, &options)
            .unwrap()
    }

    #[test]
    fn each_named_format_renders_as_its_model_expects() {
        assert_eq!(
            render("command-r"),
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        );
        assert_eq!(
            render("chatml"),
            "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there\
             <|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("llama3"),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(resolve("{{ 'x' }}").1, "{{ 'x' }}");
        assert_eq!(resolve("plain text").1, "plain text");
    }
}
