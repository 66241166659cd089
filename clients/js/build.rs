//! Links the cdylib the way Node expects an addon (napi symbols resolved at load time).
fn main() {
    napi_build::setup();
}
