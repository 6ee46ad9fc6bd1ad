//! Exit codes shared by every subcommand: 0 success, 1 the world failed or
//! refused (a BMC, the API server), 2 bad input (a file, a flag, a document).
//! A reader that closed stdout early (`| head`) ends a command quietly, with
//! 0, as ripgrep does.

use std::process::ExitCode;

/// Why a subcommand failed, which decides the exit code.
#[derive(Debug)]
pub enum Failure {
    /// The input was wrong: a flag, a file, a document. Exit code 2.
    BadInput(anyhow::Error),
    /// The world failed or refused: a BMC, the API server. Exit code 1.
    World(anyhow::Error),
    /// Stdout was closed by its reader: nothing more to say. Exit code 0.
    OutputClosed,
}

impl Failure {
    pub fn bad_input(err: impl Into<anyhow::Error>) -> Self {
        Failure::BadInput(err.into())
    }
    pub fn world(err: impl Into<anyhow::Error>) -> Self {
        Failure::World(err.into())
    }
}

/// Prints the whole error chain and maps the failure to its exit code.
pub fn report(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
        Err(Failure::World(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
        Err(Failure::OutputClosed) => ExitCode::SUCCESS,
    }
}
