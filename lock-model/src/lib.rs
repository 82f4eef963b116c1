//! The lock protocol, model-checked: the project's real Lua scripts run in
//! an embedded Lua 5.1 over a model keyspace, the clients make the
//! runtime's own decisions (`lock_runtime::__protocol`), and a hostile
//! network reorders, loses and repeats what they send. See `README.md` for
//! what is checked and within which bounds.

pub mod calls;
pub mod check;
pub mod decide;
pub mod defects;
pub mod host;
pub mod keyspace;
pub mod plan;
pub mod properties;
pub mod scenarios;
pub mod state;
pub mod world;

/// The checker's binaries allocate with mimalloc (see `Cargo.toml`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
