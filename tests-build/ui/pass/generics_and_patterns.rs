use std::fmt::Display;

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:{name}")]
async fn run_job<T: Display + Send, F>(name: T, work: F) -> Result<String, LockError>
where
    F: FnOnce() -> String + Send,
{
    Ok(format!("{name}: {}", work()))
}

#[distributed_lock(key = "user:{user}")]
async fn greet(user: impl Display + Send) -> Result<String, LockError> {
    Ok(format!("hi {user}"))
}

struct Pair {
    a: u32,
    b: u32,
}

#[distributed_lock(key = "pair:{a}-{b}:{t.0}")]
async fn destructured(Pair { a, b }: Pair, t: (u8, u8)) -> Result<u32, LockError> {
    Ok(a + b + t.1 as u32)
}

#[distributed_lock(key = "borrowed:{s}")]
async fn borrowed<'a>(s: &'a str) -> Result<&'a str, LockError> {
    Ok(s)
}

#[distributed_lock(key = "display:{n}")]
async fn returns_impl(n: u32) -> Result<impl Display, LockError> {
    Ok(n)
}

fn main() {
    drop(run_job("x", || String::new()));
    drop(greet("bob"));
    drop(destructured(Pair { a: 1, b: 2 }, (3, 4)));
    drop(borrowed("s"));
    drop(returns_impl(1));
}
