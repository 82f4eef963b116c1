//! What `#[distributed_lock(...)]` accepts.

use std::time::Duration;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Expr, ExprLit, Lit, LitInt, LitStr, Path};

const OPTIONS: &str = "key, keys, mode, permits, lease, wait, on_lost, on_busy, min_hold, max_hold, fence, client, crate";

/// The attribute's options, validated.
pub(crate) struct Args {
    pub(crate) key: LitStr,
    /// `keys = [...]`: the other keys of a multi-key lock.
    pub(crate) more_keys: Vec<LitStr>,
    /// `mode = "read"`: a shared lock.
    pub(crate) read: bool,
    /// `permits = N`: a semaphore of N permits (never 0).
    pub(crate) permits: Option<u32>,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) on_lost_continue: bool,
    /// `on_busy = "skip"`.
    pub(crate) skip_if_busy: bool,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    /// `fence = false`: no token.
    pub(crate) unfenced: bool,
    /// `client = <expr>`: the client to lock with, an expression in the
    /// fn's scope (else the scoped or global client).
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Option<Path>,
}

#[derive(Default)]
struct Builder {
    key: Option<LitStr>,
    keys: Option<Vec<LitStr>>,
    mode: Option<(bool, LitStr)>,
    permits: Option<(u32, LitInt)>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    on_lost: Option<bool>,
    on_busy: Option<bool>,
    min_hold: Option<Duration>,
    max_hold: Option<(Duration, LitStr)>,
    fence: Option<bool>,
    client: Option<Expr>,
    krate: Option<Path>,
}

impl Args {
    pub(crate) fn parse(tokens: proc_macro2::TokenStream) -> syn::Result<Args> {
        let mut b = Builder::default();
        let parser = syn::meta::parser(|meta| b.option(meta));
        syn::parse::Parser::parse2(parser, tokens)?;
        if let Some((_, lit)) = &b.permits {
            // Spanned on the permits, the option that changes what kind
            // of lock this is.
            if b.keys.is_some() {
                return Err(syn::Error::new(
                    lit.span(),
                    "`permits` goes with one `key`, not `keys`: a semaphore limits the holders of one key; \
                     use `key = \"...\"`, or drop `permits` for a lock on all of `keys`",
                ));
            }
            if let Some((_, mode)) = &b.mode {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`permits` cannot go with `mode = {:?}`: a semaphore admits up to `permits` holders, \
                         none of them readers or writers; keep one of the two",
                        mode.value()
                    ),
                ));
            }
        }
        let (key, more_keys) = match (b.key, b.keys) {
            (Some(key), None) => (key, Vec::new()),
            (None, Some(mut keys)) => (keys.remove(0), keys),
            (Some(key), Some(_)) => {
                return Err(syn::Error::new(
                    key.span(),
                    "give either `key` (one lock) or `keys` (all of several), not both",
                ))
            }
            (None, None) => {
                return Err(syn::Error::new(
                    Span::call_site(),
                    "missing `key`: write `#[distributed_lock(key = \"order:{id}\")]`",
                ))
            }
        };
        if let Some((max, lit)) = &b.max_hold {
            for (name, bound) in [("lease", b.lease), ("min_hold", b.min_hold)] {
                if let Some(d) = bound.filter(|d| d > max) {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!(
                            "`max_hold` ({}) is shorter than `{name}` ({}): the lock would lapse before it; \
                             make `max_hold` at least `{name}`",
                            humantime::format_duration(*max),
                            humantime::format_duration(d)
                        ),
                    ));
                }
            }
        }
        Ok(Args {
            key,
            more_keys,
            read: b.mode.is_some_and(|(read, _)| read),
            permits: b.permits.map(|(n, _)| n),
            lease: b.lease,
            wait: b.wait,
            on_lost_continue: b.on_lost.unwrap_or(false),
            skip_if_busy: b.on_busy.unwrap_or(false),
            min_hold: b.min_hold,
            max_hold: b.max_hold.map(|(d, _)| d),
            unfenced: b.fence == Some(false),
            client: b.client,
            krate: b.krate,
        })
    }
}

/// The string value of `name = "..."`.
fn string(meta: &ParseNestedMeta, name: &str, example: &str) -> syn::Result<LitStr> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string literal, e.g. `{name} = {example}`"),
        )),
    }
}

/// The value of `permits = N`: a literal, so that a zero or a number
/// out of range is an error here, spanned on it.
fn permits(meta: &ParseNestedMeta) -> syn::Result<(u32, LitInt)> {
    let example = "e.g. `permits = 4` (at most 4 holders at once)";
    let expr: Expr = meta.value()?.parse()?;
    let lit = match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => lit,
        other => {
            return Err(syn::Error::new_spanned(
                other,
                format!("`permits` takes a positive integer literal, {example}; for a number known only at run time, call `client.semaphore(key, n)`"),
            ))
        }
    };
    let n: u32 = lit.base10_parse().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "`permits = {}` does not fit in a `u32`; at most {} permits",
                lit.base10_digits(),
                u32::MAX
            ),
        )
    })?;
    if n == 0 {
        return Err(syn::Error::new(
            lit.span(),
            "`permits` must be at least 1; with 0 permits no one could ever hold the key",
        ));
    }
    Ok((n, lit))
}

fn duration(lit: &LitStr, name: &str, allow_zero: bool) -> syn::Result<Duration> {
    let d = humantime::parse_duration(&lit.value()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!("`{name}` is not a duration ({e}); write e.g. \"500ms\", \"30s\" or \"2m\""),
        )
    })?;
    if d.is_zero() && !allow_zero {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{name}` must be longer than zero{}",
                if name == "lease" {
                    "; a zero lease would expire at once"
                } else {
                    ""
                }
            ),
        ));
    }
    if !d.is_zero() && d < Duration::from_millis(1) {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` is below Redis' 1 ms resolution; use at least \"1ms\""),
        ));
    }
    Ok(d)
}

fn once<T>(slot: &mut Option<T>, meta: &ParseNestedMeta, name: &str, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error(format!("`{name}` is given twice; keep one")));
    }
    *slot = Some(value);
    Ok(())
}

impl Builder {
    fn option(&mut self, meta: ParseNestedMeta) -> syn::Result<()> {
        let name = match meta.path.get_ident() {
            Some(id) => id.to_string(),
            // `crate` is a keyword: not an ident.
            None if meta.path.is_ident("crate") || meta.path.segments.len() == 1 => {
                meta.path.segments[0].ident.to_string()
            }
            None => String::new(),
        };
        match name.as_str() {
            "key" => {
                let v = string(&meta, "key", "\"order:{id}\"")?;
                once(&mut self.key, &meta, "key", v)
            }
            "keys" => {
                let expr: Expr = meta.value()?.parse()?;
                let example = "`keys = [\"account:{from}\", \"account:{to}\"]`";
                let Expr::Array(array) = expr else {
                    return Err(syn::Error::new_spanned(
                        expr,
                        format!("`keys` takes an array of string literals, e.g. {example}"),
                    ));
                };
                let mut keys = Vec::new();
                for elem in &array.elems {
                    match elem {
                        Expr::Lit(ExprLit {
                            lit: Lit::Str(s), ..
                        }) => keys.push(s.clone()),
                        other => {
                            return Err(syn::Error::new_spanned(
                                other,
                                format!("each of `keys` is a string literal, e.g. {example}"),
                            ))
                        }
                    }
                }
                if keys.is_empty() {
                    return Err(syn::Error::new_spanned(
                        &array,
                        format!("`keys` needs at least one key, e.g. {example}"),
                    ));
                }
                once(&mut self.keys, &meta, "keys", keys)
            }
            "lease" => {
                let lit = string(&meta, "lease", "\"30s\"")?;
                let d = duration(&lit, "lease", false)?;
                once(&mut self.lease, &meta, "lease", d)
            }
            "wait" => {
                let lit = string(&meta, "wait", "\"5s\"")?;
                let d = duration(&lit, "wait", true)?;
                once(&mut self.wait, &meta, "wait", d)
            }
            "on_lost" => {
                let lit = string(&meta, "on_lost", "\"abort\"")?;
                let cont = match lit.value().as_str() {
                    "abort" => false,
                    "continue" => true,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!("`on_lost = \"{other}\"` is not an option; write \"abort\" (stop the body) or \"continue\" (log and finish)"),
                        ))
                    }
                };
                once(&mut self.on_lost, &meta, "on_lost", cont)
            }
            "mode" => {
                let lit = string(&meta, "mode", "\"read\"")?;
                let read = match lit.value().as_str() {
                    "read" => true,
                    "write" => false,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!("`mode = \"{other}\"` is not an option; write \"read\" (shared with other readers) or \"write\" (exclusive, the default)"),
                        ))
                    }
                };
                once(&mut self.mode, &meta, "mode", (read, lit))
            }
            "permits" => {
                let (n, lit) = permits(&meta)?;
                if self.permits.is_some() {
                    // On the second value: the one to take out.
                    return Err(syn::Error::new(
                        lit.span(),
                        "`permits` is given twice; keep one",
                    ));
                }
                self.permits = Some((n, lit));
                Ok(())
            }
            "on_busy" => {
                let lit = string(&meta, "on_busy", "\"skip\"")?;
                let skip = match lit.value().as_str() {
                    "error" => false,
                    "skip" => true,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!("`on_busy = \"{other}\"` is not an option; write \"error\" (return `Err(LockError::Timeout)`) or \"skip\" (return `Ok(T::default())` without running the body)"),
                        ))
                    }
                };
                once(&mut self.on_busy, &meta, "on_busy", skip)
            }
            "min_hold" => {
                let lit = string(&meta, "min_hold", "\"50s\"")?;
                let d = duration(&lit, "min_hold", false)?;
                once(&mut self.min_hold, &meta, "min_hold", d)
            }
            "max_hold" => {
                let lit = string(&meta, "max_hold", "\"10m\"")?;
                let d = duration(&lit, "max_hold", false)?;
                once(&mut self.max_hold, &meta, "max_hold", (d, lit))
            }
            "fence" => {
                let expr: Expr = meta.value()?.parse()?;
                let fence = match &expr {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => b.value,
                    other => {
                        return Err(syn::Error::new_spanned(
                            other,
                            "`fence` takes `true` (the default: every body gets a fencing token) or `false` (no token; the lock costs no more than a bare `SET NX PX`)",
                        ))
                    }
                };
                once(&mut self.fence, &meta, "fence", fence)
            }
            "client" => {
                // Any expression: its type (`LockClient` or `&LockClient`)
                // is checked where it is used, in the fn's scope.
                let expr: Expr = meta.value()?.parse()?;
                once(&mut self.client, &meta, "client", expr)
            }
            "crate" => {
                let lit = string(&meta, "crate", "\"lock_runtime\"")?;
                let path: Path = lit.parse().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        format!("`crate = \"{}\"` is not a path; write the name the runtime is imported as, e.g. \"my_locks\"", lit.value()),
                    )
                })?;
                once(&mut self.krate, &meta, "crate", path)
            }
            _ => {
                let given = path_text(&meta.path);
                let hint = suggestion(&given)
                    .map(|(name, why)| format!("did you mean `{name}`{why}? "))
                    .unwrap_or_default();
                Err(syn::Error::new_spanned(
                    &meta.path,
                    format!("unknown option `{given}`; {hint}valid options: {OPTIONS}"),
                ))
            }
        }
    }
}

/// The option a user probably meant: names other lock libraries use for
/// it, else one a typo away.
fn suggestion(given: &str) -> Option<(&'static str, &'static str)> {
    let lower = given.to_ascii_lowercase();
    let known: &[(&str, &str, &str)] = &[
        ("ttl", "lease", " (the lock's TTL in Redis)"),
        ("expire", "lease", " (the lock's TTL in Redis)"),
        ("expiry", "lease", " (the lock's TTL in Redis)"),
        ("lease_time", "lease", " (the lock's TTL in Redis)"),
        ("lock_at_most_for", "max_hold", ""),
        ("lock_at_least_for", "min_hold", ""),
        ("timeout", "wait", " (how long to wait for a busy lock)"),
        ("wait_time", "wait", " (how long to wait for a busy lock)"),
        (
            "acquire_timeout",
            "wait",
            " (how long to wait for a busy lock)",
        ),
        ("name", "key", ""),
        ("skip", "on_busy", " = \"skip\""),
        ("lock_client", "client", ""),
        ("with_client", "client", ""),
        ("shared", "mode", " = \"read\""),
        ("read", "mode", " = \"read\""),
        ("limit", "permits", ""),
        ("max_concurrent", "permits", ""),
        ("concurrency", "permits", ""),
        ("max_holders", "permits", ""),
        ("max_concurrency", "permits", ""),
        ("semaphore", "permits", " (a semaphore of N permits)"),
    ];
    if let Some((_, name, why)) = known.iter().find(|(alias, _, _)| *alias == lower) {
        return Some((name, why));
    }
    OPTIONS
        .split(", ")
        .map(|name| (distance(&lower, name), name))
        .filter(|(d, name)| *d <= 2 && *d < name.len())
        .min()
        .map(|(_, name)| (name, ""))
}

/// Edit distance (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn path_text(p: &Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn parses_all_options() {
        let a = Args::parse(quote!(
            key = "k:{id}",
            lease = "30s",
            wait = "0s",
            on_lost = "continue",
            crate = "my_locks"
        ))
        .unwrap();
        assert_eq!(a.key.value(), "k:{id}");
        assert_eq!(a.lease, Some(Duration::from_secs(30)));
        assert_eq!(a.wait, Some(Duration::ZERO));
        assert!(a.on_lost_continue);
        assert!(a.krate.is_some());
        assert!(a.client.is_none());
        let c = Args::parse(quote!(key = "k", client = app.locks)).unwrap();
        assert!(c.client.is_some());
        let b = Args::parse(quote!(
            keys = ["a:{x}", "b:{y}"],
            on_busy = "skip",
            mode = "read",
            min_hold = "50s",
            max_hold = "10m"
        ))
        .unwrap();
        assert_eq!(b.key.value(), "a:{x}");
        assert_eq!(b.more_keys.len(), 1);
        assert!(b.skip_if_busy);
        assert!(b.read);
        assert!(!a.read);
        assert_eq!(b.min_hold, Some(Duration::from_secs(50)));
        assert_eq!(b.max_hold, Some(Duration::from_secs(600)));
    }

    #[test]
    fn rejects_bad_input() {
        let e = |t| Args::parse(t).err().unwrap().to_string();
        assert!(e(quote!(lease = "1s")).contains("missing `key`"));
        assert!(e(quote!(key = "k", lease = "0s")).contains("longer than zero"));
        assert!(e(quote!(key = "k", lease = "soon")).contains("not a duration"));
        assert!(e(quote!(key = "k", lease = "10us")).contains("1 ms"));
        assert!(e(quote!(key = "k", on_lost = "retry")).contains("\"abort\""));
        assert!(e(quote!(key = "k", ttl = "1s"))
            .contains("valid options: key, keys, mode, permits, lease"));
        assert!(e(quote!(key = "k", ttl = "1s")).contains("did you mean `lease`"));
        assert!(e(quote!(key = "k", wiat = "1s")).contains("did you mean `wait`"));
        assert!(e(quote!(key = "k", timeout = "1s")).contains("did you mean `wait`"));
        assert!(!e(quote!(key = "k", zzz = "1s")).contains("did you mean"));
        assert!(e(quote!(key = "k", on_busy = "wait")).contains("\"skip\""));
        assert!(e(quote!(key = "k", mode = "shared")).contains("\"read\""));
        assert!(e(quote!(key = "k", mode = "read", mode = "write")).contains("twice"));
        assert!(
            e(quote!(key = "k", lease = "30s", max_hold = "10s")).contains("shorter than `lease`")
        );
        assert!(e(quote!(key = "k", min_hold = "2m", max_hold = "1m"))
            .contains("shorter than `min_hold`"));
        assert!(e(quote!(keys = [])).contains("at least one key"));
        assert!(e(quote!(key = "a", keys = ["b"])).contains("not both"));
        assert!(e(quote!(key = "k", key = "j")).contains("twice"));
        assert!(e(quote!(key = 5)).contains("string literal"));
        assert!(e(quote!(key = "k", fence = "no")).contains("`false`"));
        assert!(e(quote!(key = "k", fence = false, fence = true)).contains("twice"));
        assert!(
            e(quote!(key = "k", client = a.locks, client = b)).contains("`client` is given twice")
        );
        assert!(e(quote!(key = "k", lock_client = a)).contains("did you mean `client`"));
    }

    #[test]
    fn permits_make_a_semaphore_of_one_key() {
        let a = Args::parse(quote!(key = "render:{tenant}", permits = 4, lease = "10s")).unwrap();
        assert_eq!(a.permits, Some(4));
        assert!(!a.read);
        assert_eq!(Args::parse(quote!(key = "k")).unwrap().permits, None);
        let max = Args::parse(quote!(key = "k", permits = 4_294_967_295u32)).unwrap();
        assert_eq!(max.permits, Some(u32::MAX));
    }

    #[test]
    fn rejects_bad_permits() {
        let e = |t| Args::parse(t).err().unwrap().to_string();
        assert!(e(quote!(key = "k", permits = 0)).contains("at least 1"));
        assert!(e(quote!(key = "k", permits = 4_294_967_296)).contains("does not fit in a `u32`"));
        assert!(e(quote!(key = "k", permits = -1)).contains("positive integer literal"));
        assert!(e(quote!(key = "k", permits = "4")).contains("positive integer literal"));
        assert!(e(quote!(key = "k", permits = N)).contains("client.semaphore(key, n)"));
        assert!(e(quote!(key = "k", permits = 2.0)).contains("positive integer literal"));
        assert!(e(quote!(key = "k", permits = 2, permits = 3)).contains("`permits` is given twice"));
        assert!(e(quote!(keys = ["a", "b"], permits = 2)).contains("not `keys`"));
        assert!(e(quote!(key = "k", mode = "read", permits = 2)).contains("`mode = \"read\"`"));
        assert!(e(quote!(key = "k", permits = 2, mode = "write")).contains("`mode = \"write\"`"));
        assert!(e(quote!(key = "k", limit = 2)).contains("did you mean `permits`"));
        assert!(e(quote!(key = "k", permit = 2)).contains("did you mean `permits`"));
        assert!(e(quote!(key = "k", semaphore = 2)).contains("did you mean `permits`"));
    }

    #[test]
    fn fence_false_asks_for_no_token() {
        assert!(
            Args::parse(quote!(key = "k", fence = false))
                .unwrap()
                .unfenced
        );
        assert!(
            !Args::parse(quote!(key = "k", fence = true))
                .unwrap()
                .unfenced
        );
        assert!(!Args::parse(quote!(key = "k")).unwrap().unfenced);
    }
}
