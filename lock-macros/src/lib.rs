//! The `#[distributed_lock]` attribute. Depend on `lock-runtime`, which
//! re-exports it; this crate only turns the attribute into a call into
//! `lock_runtime::__private`.

use proc_macro::TokenStream;

mod attr;
mod expand;
mod key_template;

/// Run an async fn's body under a distributed lock.
///
/// ```ignore
/// #[distributed_lock(key = "order:{id}", lease = "30s", wait = "5s")]
/// async fn pay(id: u64) -> Result<Receipt, AppError> { /* ... */ }
/// ```
///
/// - `key` (required, unless `keys`): a template; `{name}` is a parameter,
///   `{name.field}` a field of one, `{self.field}` a field of the receiver,
///   each formatted with `Display`; `{{` and `}}` are literal braces.
/// - `keys = ["account:{from}", "account:{to}"]`: several keys, all held or
///   none (taken in sorted order, so no deadlock); instead of `key`.
/// - `mode`: `"write"` (default, exclusive) or `"read"` (shared with other
///   readers; a waiting writer keeps new readers out).
/// - `permits = N`: a semaphore instead of a lock: at most N bodies hold
///   the key at once, across every client and process (the call is
///   `client.semaphore(key, N)`); each permit has its own lease and fencing
///   token, and waiters are served in order. N is a positive integer
///   literal that fits in a `u32`, checked at compile time (a `const` is not
///   accepted; for an N known only at run time, call `client.semaphore`).
///   Goes with one `key`, not with `keys` or `mode`.
/// - `lease`: Redis TTL, renewed every lease/3 while the body runs. Default:
///   the client's (30 s).
/// - `wait`: how long to wait for a busy lock before `Err(Timeout)`; `"0s"`
///   tries once. Default: the client's (5 s); with `on_busy = "skip"`, 0 s.
/// - `on_lost`: `"abort"` (default) drops the body and returns `Err(Lost)`
///   when the lock is lost; `"continue"` lets it finish and logs the loss.
/// - `on_busy`: `"error"` (default) returns `Err(Timeout)` when the lock is
///   still busy after `wait`; `"skip"` returns `Ok(T::default())` without
///   running the body (a job scheduled on every instance).
/// - `min_hold`: the lock stays taken at least this long after it was
///   acquired; an earlier release leaves it to expire then.
/// - `max_hold`: renewals stop this long after acquisition and the body is
///   told `Err(MaxHoldReached)` (`on_lost` applies). At least `lease` and
///   `min_hold` (a compile error when written beside them); without
///   `lease`, the client's default lease is bounded by it (`max_hold =
///   "10s"` under a default of 30 s: a lease of 10 s).
/// - `fence`: `true` (default) hands the body a fencing token
///   (`current_fence()`); `false` takes the lock without one, as cheaply as
///   a bare `SET NX PX`.
/// - `client = <expr>`: the client to lock with, an expression in the fn's
///   scope of type `LockClient` or `&LockClient` (e.g. `client = app.locks`
///   with `State(app): State<App>` in an axum handler). Default: the
///   innermost `with_client` scope, else the global client of `init`.
/// - `crate`: path of the runtime crate if it is renamed.
///
/// The fn must be `async` and return `Result<T, E>` with
/// `E: From<LockError>` (an alias of one works too). Nested annotated calls in the same task on a held
/// key re-enter; the lock is released on every exit.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let original: proc_macro2::TokenStream = item.clone().into();
    let result = syn::parse::<syn::ItemFn>(item)
        .map_err(|e| {
            syn::Error::new(
                e.span(),
                "`#[distributed_lock]` goes on an `async fn` with a body",
            )
        })
        .and_then(|func| {
            let args = attr::Args::parse(args.into())?;
            expand::expand(args, func)
        });
    match result {
        Ok(tokens) => tokens.into(),
        // Keep the fn so the rest of the crate (and the IDE) still sees it;
        // the one error is the attribute's.
        Err(e) => {
            let err = e.to_compile_error();
            quote::quote!(#err #original).into()
        }
    }
}
