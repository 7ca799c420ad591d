//! The command line: `trigd run | replay | send | record | convert | simulate | eval`.

use std::process::ExitCode;

pub fn main() -> ExitCode {
    ExitCode::SUCCESS
}
