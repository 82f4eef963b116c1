//! What an annotated fn turns into: the key built from the arguments, then
//! the original body as a future handed to the runtime.

use std::collections::BTreeSet;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{FnArg, ItemFn, ReturnType, Type};

use crate::attr::Args;
use crate::key_template::{span_of, KeyTemplate};

pub(crate) fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream> {
    let sig = &func.sig;
    if let Some(c) = &sig.constness {
        return Err(syn::Error::new_spanned(
            c,
            "`#[distributed_lock]` cannot go on a `const fn`",
        ));
    }
    if sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            sig.fn_token,
            "`#[distributed_lock]` needs an `async fn`: the lock is awaited; write `async fn`",
        ));
    }
    // Whether the return type can carry a lock error is checked by the
    // type system (`LockResult` in the expansion), so aliases such as
    // `type ApiResult<T> = Result<T, ApiError>` work.
    let ret = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            return Err(syn::Error::new_spanned(
                &sig.ident,
                "a `#[distributed_lock]` fn must return `Result<T, E>` with `E: From<lock_runtime::LockError>`; add `-> Result<(), YourError>`",
            ))
        }
    };

    // Every key's template, checked against the fn's parameters.
    let mut keys = Vec::new();
    for lit in std::iter::once(&args.key).chain(&args.more_keys) {
        let template = KeyTemplate::parse(&lit.value())
            .map_err(|e| syn::Error::new(span_of(lit, e.range), e.message))?;
        check_placeholders(lit, &template, &func)?;
        keys.push((lit, template));
    }

    let krate = args
        .krate
        .as_ref()
        .map(ToTokens::to_token_stream)
        .unwrap_or_else(|| quote!(::lock_runtime));
    let key_exprs: Vec<TokenStream> = keys
        .iter()
        .map(|(lit, template)| {
            let format = syn::LitStr::new(&template.format, lit.span());
            let key_args = template.args(lit.span());
            quote!(#krate::__private::format!(#format #(, #key_args)*))
        })
        .collect();
    // Metrics and spans name the lock by its template(s), never the key.
    let names: Vec<String> = keys.iter().map(|(lit, _)| lit.value()).collect();
    let template_name = syn::LitStr::new(&names.join(", "), args.key.span());
    // `permits` comes with one key and no `mode` (checked by `Args`).
    let (key_value, lock_method) = match (key_exprs.len(), args.read, args.permits) {
        (1, _, Some(_)) => (key_exprs[0].clone(), quote!(semaphore)),
        (1, false, _) => (key_exprs[0].clone(), quote!(lock)),
        (1, true, _) => (key_exprs[0].clone(), quote!(read_lock)),
        (_, false, _) => (quote!([#(#key_exprs),*]), quote!(lock_all)),
        (_, true, _) => (quote!([#(#key_exprs),*]), quote!(read_lock_all)),
    };
    // The semaphore's second argument: `client.semaphore(key, 4)`.
    let permits = args.permits.map(|n| {
        let n = proc_macro2::Literal::u32_unsuffixed(n);
        quote!(, #n)
    });
    let millis = |method: &str, d: Option<std::time::Duration>| match d {
        // Sub-millisecond waits round up: "try once" stays zero.
        Some(d) => {
            let ms = d.as_micros().div_ceil(1000) as u64;
            let method = syn::Ident::new(method, Span::mixed_site());
            quote!(.#method(#krate::__private::Duration::from_millis(#ms)))
        }
        None => quote!(),
    };
    let lease = millis("lease", args.lease);
    // `on_busy = "skip"` without a `wait` tries once: a job that another
    // instance runs now is skipped, not waited for.
    let wait = match (args.wait, args.skip_if_busy) {
        (None, true) => millis("wait", Some(std::time::Duration::ZERO)),
        (wait, _) => millis("wait", wait),
    };
    let min_hold = millis("min_hold", args.min_hold);
    let fence = if args.unfenced {
        quote!(.fence(false))
    } else {
        quote!()
    };
    let max_hold = millis("max_hold", args.max_hold);
    let on_lost = if args.on_lost_continue {
        quote!(#krate::OnLost::Continue)
    } else {
        quote!(#krate::OnLost::Abort)
    };
    // Name the return type so the body type-checks against the signature;
    // `impl Trait` cannot be named in a turbofish, so infer it then.
    let ret_ty = if mentions_impl_trait(ret) {
        quote!(_)
    } else {
        quote!(#ret)
    };
    let ident = |name: &str| syn::Ident::new(name, Span::mixed_site());
    let (key_var, fail, body_var, client, out, err) = (
        ident("__lock_key"),
        ident("__lock_fail"),
        ident("__lock_body"),
        ident("__lock_client"),
        ident("__lock_out"),
        ident("__lock_err"),
    );
    // Where the client comes from: `client = <expr>` (any `LockClient` or
    // `&LockClient` in the fn's scope, cloned before the body takes the
    // parameters), else the task's scope or the global one.
    let client_source = match &args.client {
        Some(expr) => {
            let from = quote_spanned! {expr.span()=>
                #krate::__private::lock_client(&(#expr))
            };
            quote!(::core::result::Result::Ok::<#krate::LockClient, #krate::LockError>(
                ::core::clone::Clone::clone(#from)
            ))
        }
        None => quote!(#krate::client()),
    };
    let block = &func.block;
    // `on_busy = "skip"`: busy is `Ok(T::default())`, checked on `T`
    // where it can be named (so the error points at it), else through the
    // return type (an alias).
    let (run, outcome) = if args.skip_if_busy {
        let skipped = match ok_type(ret).filter(|_| is_result(ret)) {
            Some(ok_ty) => {
                let default = quote_spanned! {ok_ty.span()=>
                    <#ok_ty as ::core::default::Default>::default()
                };
                quote!(::core::result::Result::Ok(#default))
            }
            None => quote_spanned! {ret.span()=>
                <#ret_ty as #krate::__private::SkipResult>::skipped()
            },
        };
        (
            quote!(run_or_skip),
            quote! {
                ::core::result::Result::Ok(::core::option::Option::Some(#out)) => #out,
                ::core::result::Result::Ok(::core::option::Option::None) => #skipped,
            },
        )
    } else {
        (
            quote!(run),
            quote!(::core::result::Result::Ok(#out) => #out,),
        )
    };
    // Glue code carries the return type's span: a wrong error type is
    // reported once, there. The body is typed as the fn's return type (so
    // `?` in it converts into that error type) and runs only under the
    // lock, through `LockRequest::run` of a body pinned in this fn's
    // future (`__private::run`: no box).
    let body = quote_spanned! {ret.span()=>
        let #key_var = #key_value;
        let #fail = <#ret_ty as #krate::__private::LockResult>::from_lock_error;
        let #client = #client_source;
        // (A body that always diverges, `panic!` say, is no warning here.)
        // Pinned in this fn's future: the runtime's layers pass a pointer
        // to it down, so the body is in this future once.
        #[allow(unreachable_code, clippy::diverging_sub_expression)]
        let #body_var = ::core::pin::pin!(async move {
            let #out: #ret_ty = #block;
            #out
        });
        match #client {
            ::core::result::Result::Ok(#client) => match #krate::__private::#run(
                #client
                    .#lock_method(#key_var #permits)
                    .name(#template_name)
                    .on_lost(#on_lost)
                    #lease
                    #wait
                    #min_hold
                    #max_hold
                    #fence,
                #body_var,
            )
            .await
            {
                #outcome
                ::core::result::Result::Err(#err) => #fail(#err),
            },
            ::core::result::Result::Err(#err) => #fail(#err),
        }
    };
    let ItemFn {
        attrs, vis, sig, ..
    } = func;
    Ok(quote! {
        #(#attrs)*
        #[allow(clippy::used_underscore_binding, clippy::let_and_return)]
        #vis #sig {
            #body
        }
    })
}

fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        _ => false,
    }
}

/// `T` of `Result<T, E>` (also of an alias with `T` first, e.g.
/// `anyhow::Result<T>`).
fn ok_type(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(p) => {
            let last = p.path.segments.last()?;
            match &last.arguments {
                syn::PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                    syn::GenericArgument::Type(t) => Some(t),
                    _ => None,
                }),
                _ => None,
            }
        }
        Type::Group(g) => ok_type(&g.elem),
        Type::Paren(p) => ok_type(&p.elem),
        _ => None,
    }
}

fn mentions_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'a> Visit<'a> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'a syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut f = Finder(false);
    f.visit_type(ty);
    f.0
}

/// Names the fn binds: parameters (through destructuring) and `self`.
fn bindings(func: &ItemFn) -> BTreeSet<String> {
    struct Binder(BTreeSet<String>);
    impl<'a> Visit<'a> for Binder {
        fn visit_pat_ident(&mut self, p: &'a syn::PatIdent) {
            self.0.insert(p.ident.to_string());
            syn::visit::visit_pat_ident(self, p);
        }
        // Types and expressions inside patterns bind nothing.
        fn visit_type(&mut self, _: &'a Type) {}
        fn visit_expr(&mut self, _: &'a syn::Expr) {}
    }
    let mut b = Binder(BTreeSet::new());
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(_) => {
                b.0.insert("self".into());
            }
            FnArg::Typed(t) => b.visit_pat(&t.pat),
        }
    }
    b.0
}

fn check_placeholders(key: &syn::LitStr, template: &KeyTemplate, func: &ItemFn) -> syn::Result<()> {
    let names = bindings(func);
    for p in &template.placeholders {
        let head = &p.path[0];
        if names.contains(head) {
            continue;
        }
        let span = span_of(key, p.range);
        let shown = p.path.join(".");
        let message = if head == "self" {
            format!("`{{{shown}}}` uses `self`, but `{}` is not a method; take the value as a parameter", func.sig.ident)
        } else {
            let params: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|n| *n != "_")
                .collect();
            if params.is_empty() {
                format!(
                    "`{{{shown}}}`: `{}` has no parameters to build the key from",
                    func.sig.ident
                )
            } else {
                format!(
                    "`{{{shown}}}` is not a parameter of `{}`; the key can use: {}",
                    func.sig.ident,
                    params.join(", ")
                )
            }
        };
        return Err(syn::Error::new(span, message));
    }
    Ok(())
}
