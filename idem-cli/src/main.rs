//! The `idem` binary; see the library's docs for the commands.

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
