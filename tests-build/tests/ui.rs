//! Compile-time errors of `#[distributed_lock]`: each file in ui/fail must
//! fail with the reviewed message in its .stderr; each in ui/pass must build.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
