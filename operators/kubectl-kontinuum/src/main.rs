//! `kubectl-kontinuum`: see the library for everything.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(kubectl_kontinuum::main_with_args(std::env::args_os()))
}
