//! A remote subagent's `command_template`, checked and compiled once for the shell.
//!
//! A template is a shell script with two placeholders, `{model}` and `{prompt}` (arg mode
//! only). Their values come from the model, so they must never be read by a shell as script:
//! each placeholder becomes a quoted positional parameter (`"$1"` for the model, `"$2"` for
//! the prompt) and the values travel as `sh -c <script> sh <model> [<prompt>]` arguments, so
//! a value is always exactly one argument however it is written (`$(touch x)`, quotes, `;`).
//!
//! That holds only where a parameter expansion is not re-read, so a template is refused when
//! a placeholder stands inside single or double quotes (`echo "M={model}"`), right after a
//! backslash, or anywhere in a template that has arithmetic (`((`, `$((`), a `[[` test or a
//! here-document (`<<`), whose bodies some shells evaluate again.

/// Why a template was refused, in the words of the 422 it answers.
pub type Refusal = &'static str;

/// The script to run with `sh -c`: each placeholder replaced by its positional parameter.
pub fn compile(template: &str, prompt_via: &str) -> Result<String, Refusal> {
    let mut script = String::with_capacity(template.len());
    let (mut models, mut prompts) = (0, 0);
    let mut quote: Option<char> = None;
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let rest = &template[at..];
        match (quote, c) {
            (None, '\\') | (Some('"'), '\\') => {
                script.push(c);
                if let Some((_, escaped)) = chars.next() {
                    if escaped == '{' {
                        return Err("a placeholder may not follow a backslash");
                    }
                    script.push(escaped);
                }
                continue;
            }
            (None, '#') if word_start(&script) => {
                // A comment, to the end of its line: kept as it is, placeholders included.
                let end = rest.find('\n').unwrap_or(rest.len());
                script.push_str(&rest[..end]);
                for _ in rest[1..end].chars() {
                    chars.next();
                }
                continue;
            }
            (None, '\'' | '"') => quote = Some(c),
            (Some(open), _) if c == open => quote = None,
            (_, '{') => {
                let (name, parameter) = match () {
                    _ if rest.starts_with("{model}") => ("model", "\"$1\""),
                    _ if rest.starts_with("{prompt}") => ("prompt", "\"$2\""),
                    _ => return Err("invalid command_template placeholders"),
                };
                if quote.is_some() {
                    return Err("a placeholder may not stand inside quotes");
                }
                if name == "model" {
                    models += 1
                } else {
                    prompts += 1
                }
                script.push_str(parameter);
                for _ in 1..name.len() + 2 {
                    chars.next();
                }
                continue;
            }
            (_, '}') => return Err("invalid command_template placeholders"),
            _ => {}
        }
        script.push(c);
    }
    if quote.is_some() {
        return Err("command_template has an unterminated quote");
    }
    let expected_prompts = if prompt_via == "arg" { 1 } else { 0 };
    if prompts != expected_prompts {
        return Err("invalid command_template placeholders");
    }
    if models + prompts > 0 && ["((", "[[", "<<"].iter().any(|form| template.contains(form)) {
        return Err("placeholders may not be used with arithmetic, [[ tests or here-documents");
    }
    Ok(script)
}

/// Whether the next character starts a word (so `#` there begins a comment).
fn word_start(script: &str) -> bool {
    script.chars().last().is_none_or(|last| last.is_whitespace() || ";&|()".contains(last))
}

/// The positional parameters a compiled script reads: the model, then (arg mode) the prompt.
pub fn arguments(model: &str, prompt: &str, prompt_via: &str) -> Vec<String> {
    match prompt_via {
        "arg" => vec![model.to_string(), prompt.to_string()],
        _ => vec![model.to_string()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_quoted_positional_parameters() {
        assert_eq!(compile("claude --model {model} --print", "stdin").unwrap(), r#"claude --model "$1" --print"#);
        assert_eq!(compile("codex exec --model={model} {prompt}", "arg").unwrap(), r#"codex exec --model="$1" "$2""#);
        assert_eq!(compile("exit 3 # it's {model}", "stdin").unwrap(), "exit 3 # it's {model}");
        assert_eq!(compile(r#"printf '%s|' {model} "a b""#, "stdin").unwrap(), r#"printf '%s|' "$1" "a b""#);
    }

    #[test]
    fn placeholders_a_shell_would_read_again_are_refused() {
        for template in [
            r#"echo "M={model}""#,
            "echo 'M={model}'",
            r"echo \{model}",
            "x=$(({model}))",
            "[[ {model} == a ]]",
            "cat <<EOF\n{model}\nEOF",
            "echo 'unterminated {model}",
        ] {
            assert!(compile(template, "stdin").is_err(), "{template}");
        }
    }

    #[test]
    fn only_their_placeholders_and_prompt_only_in_arg_mode() {
        assert!(compile("codex {prompt}", "stdin").is_err());
        assert!(compile("codex {model}", "arg").is_err());
        assert!(compile("{prompt} {prompt}", "arg").is_err());
        assert!(compile("x {home}", "stdin").is_err());
        assert!(compile("x } {model}", "stdin").is_err());
        assert!(compile("x {model", "stdin").is_err());
    }
}
