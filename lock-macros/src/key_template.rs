//! The key template: `"order:{id}"`, `"{req.item}"`, `"{self.tenant}"`,
//! `{{`/`}}` for literal braces. Parsed at compile time so a typo is an
//! error inside the string, not a lock on the wrong key.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::LitStr;

/// One `{path}` in the template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// `req.item.id` as its parts: `["req", "item", "id"]`.
    pub(crate) path: Vec<String>,
    /// Byte range of the placeholder (braces included) in the string value.
    pub(crate) range: (usize, usize),
}

/// A parsed template: the `format!` string and its placeholders.
#[derive(Debug)]
pub(crate) struct KeyTemplate {
    pub(crate) format: String,
    pub(crate) placeholders: Vec<Placeholder>,
}

/// A template error with the byte range it concerns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) range: (usize, usize),
}

fn err(message: impl Into<String>, start: usize, end: usize) -> TemplateError {
    TemplateError {
        message: message.into(),
        range: (start, end),
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && s != "_"
}

impl KeyTemplate {
    pub(crate) fn parse(value: &str) -> Result<Self, TemplateError> {
        if value.is_empty() {
            return Err(err(
                "the lock key is empty; name the resource, e.g. `key = \"order:{id}\"`",
                0,
                0,
            ));
        }
        let mut format = String::with_capacity(value.len());
        let mut placeholders = Vec::new();
        let bytes = value.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'{' if bytes.get(i + 1) == Some(&b'{') => {
                    format.push_str("{{");
                    i += 2;
                }
                b'}' if bytes.get(i + 1) == Some(&b'}') => {
                    format.push_str("}}");
                    i += 2;
                }
                b'{' => {
                    let Some(len) = value[i + 1..].find('}') else {
                        return Err(err(
                            "unclosed `{` in the lock key; write `{{` for a literal brace",
                            i,
                            value.len(),
                        ));
                    };
                    let inner = &value[i + 1..i + 1 + len];
                    let end = i + len + 2;
                    let trimmed = inner.trim();
                    if trimmed.is_empty() {
                        return Err(err(
                            "empty `{}` in the lock key; name a parameter, e.g. `{id}`",
                            i,
                            end,
                        ));
                    }
                    let path: Vec<String> =
                        trimmed.split('.').map(|p| p.trim().to_owned()).collect();
                    if let Some(bad) = path.iter().find(|p| {
                        !is_ident(p) && !p.chars().all(|c| c.is_ascii_digit()) || p.is_empty()
                    }) {
                        return Err(err(
                            format!(
                                "`{{{inner}}}` is not a parameter path (`{bad}` is not an identifier); \
                                 write `{{param}}` or `{{param.field}}`, and `{{{{` for a literal brace"
                            ),
                            i,
                            end,
                        ));
                    }
                    if !is_ident(&path[0]) {
                        return Err(err(
                            format!("`{{{inner}}}` must start with a parameter name"),
                            i,
                            end,
                        ));
                    }
                    format.push_str("{}");
                    placeholders.push(Placeholder {
                        path,
                        range: (i, end),
                    });
                    i = end;
                }
                b'}' => {
                    return Err(err(
                        "unmatched `}` in the lock key; write `}}` for a literal brace",
                        i,
                        i + 1,
                    ));
                }
                _ => {
                    // Copy one whole UTF-8 character.
                    let ch = value[i..].chars().next().unwrap();
                    format.push(ch);
                    i += ch.len_utf8();
                }
            }
        }
        Ok(KeyTemplate {
            format,
            placeholders,
        })
    }

    /// `format!` arguments, spanned on the string so that type errors (a
    /// field that does not exist, a value without `Display`) point at it.
    pub(crate) fn args(&self, span: Span) -> Vec<TokenStream> {
        self.placeholders
            .iter()
            .map(|p| {
                let mut parts = p.path.iter();
                let first = parts.next().unwrap();
                let head = if first == "self" {
                    quote_spanned!(span=> self)
                } else {
                    let id = Ident::new(first, span);
                    quote!(#id)
                };
                let rest = parts.map(|f| {
                    if f.chars().all(|c| c.is_ascii_digit()) {
                        let idx = syn::Index {
                            index: f.parse().unwrap_or(0),
                            span,
                        };
                        quote!(#idx)
                    } else {
                        let id = Ident::new(f, span);
                        quote!(#id)
                    }
                });
                quote_spanned!(span=> #head #(. #rest)*)
            })
            .collect()
    }
}

/// The span of a byte range inside a string literal where the compiler can
/// give one (nightly), else the whole literal.
pub(crate) fn span_of(lit: &LitStr, range: (usize, usize)) -> Span {
    // +1 skips the opening quote; only exact for plain (non-raw, unescaped) strings.
    let token = lit.token();
    let raw = token.to_string();
    if raw.starts_with('"') && lit.value().len() + 2 == raw.len() {
        if let Some(span) = token.subspan(range.0 + 1..range.1 + 1) {
            return span;
        }
    }
    lit.span()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(t: &KeyTemplate) -> Vec<String> {
        t.placeholders.iter().map(|p| p.path.join(".")).collect()
    }

    #[test]
    fn placeholders_and_escapes() {
        let t = KeyTemplate::parse("order:{id}:{req.user.name}:{{x}}").unwrap();
        assert_eq!(t.format, "order:{}:{}:{{x}}");
        assert_eq!(paths(&t), ["id", "req.user.name"]);
        assert_eq!(t.placeholders[0].range, (6, 10));
        let t = KeyTemplate::parse("{self.tenant}/{ pair.0 }").unwrap();
        assert_eq!(paths(&t), ["self.tenant", "pair.0"]);
        let t = KeyTemplate::parse("plain-ключ").unwrap();
        assert_eq!(t.format, "plain-ключ");
        assert!(t.placeholders.is_empty());
    }

    #[test]
    fn errors_name_the_fix() {
        let e = KeyTemplate::parse("a{id").unwrap_err();
        assert!(e.message.contains("unclosed"), "{}", e.message);
        assert_eq!(e.range.0, 1);
        assert!(KeyTemplate::parse("a}b")
            .unwrap_err()
            .message
            .contains("unmatched"));
        assert!(KeyTemplate::parse("a{}b")
            .unwrap_err()
            .message
            .contains("empty"));
        assert!(KeyTemplate::parse("{a-b}")
            .unwrap_err()
            .message
            .contains("not a parameter path"));
        assert!(KeyTemplate::parse("{0}")
            .unwrap_err()
            .message
            .contains("start with"));
        assert!(KeyTemplate::parse("{a..b}").is_err());
        assert!(KeyTemplate::parse("")
            .unwrap_err()
            .message
            .contains("empty"));
    }
}
