//! How a command ends: its exit status, and the failures that stop it.

use std::process::ExitCode;

use crate::store::StoreError;

/// Exit status: done, nothing to report.
pub(crate) const OK: u8 = 0;
/// Exit status: found something that needs attention.
pub(crate) const FOUND: u8 = 1;
/// Exit status: the command line was wrong.
pub(crate) const USAGE: u8 = 2;
/// Exit status: a store could not be opened or queried.
const STORE: u8 = 3;

/// Why a command stopped.
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Store(error)
    }
}

/// The process's exit status for a command's result; a failure is told on
/// stderr first.
pub(crate) fn status(result: Result<u8, Failure>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Usage(message)) => {
            eprintln!("idem: {message}");
            ExitCode::from(USAGE)
        }
        Err(Failure::Store(error)) => {
            eprintln!("idem: {error}");
            ExitCode::from(STORE)
        }
    }
}
