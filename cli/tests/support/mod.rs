//! What the `decode` tests (cli/tests/*.rs) share: [`run_decode`], the binary run with
//! arguments and stdin.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs the `decode` binary with `args`, `stdin` written to it (closed at once when
/// `None`), and returns its exit status and output.
pub fn run_decode(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_decode"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}
