//! Declared steps, the steps `#[idempotent]` uses, and the startup check that
//! ties them to the store.
//!
//! Step names are a contract: renaming `charge-card.v1` while retries with
//! keys under the old name are still in flight makes those retries execute a
//! second time. So steps are declared once, as constants (with the `steps!`
//! macro of the `idem` crate), and every declaration and every use is
//! collected at link time with [`inventory`]. At startup, [`validate`] checks
//! them all and reports every problem at once:
//!
//! - a malformed name (not `name.vN`),
//! - a name declared twice (every location is listed),
//! - a step used by an `#[idempotent]` function but never declared,
//! - against the store: a step that still has unexpired keys but is no longer
//!   declared (a rename during the retry window). Keep the old name declared,
//!   marked `#[retired]`, until its keys expire.
//!
//! [`check`] runs the same checks without a store.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::check_step_name;
use crate::engine::Engine;
use crate::store::Backend;

/// Where something was written in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// The item's path, e.g. `my_service::steps::CHARGE_CARD` or `my_service::charge`.
    pub item: &'static str,
    /// The source file.
    pub file: &'static str,
    /// The line in `file`.
    pub line: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` at {}:{}", self.item, self.file, self.line)
    }
}

/// One step declaration, as registered by `steps!`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDeclaration {
    /// The step's name.
    pub name: &'static str,
    /// Whether the step is retired: kept declared only until its keys expire.
    pub retired: bool,
    /// Where it was declared.
    pub at: Location,
}

impl StepDeclaration {
    /// Used by the generated code of `steps!`.
    #[doc(hidden)]
    pub const fn new(name: &'static str, retired: bool, at: Location) -> Self {
        Self { name, retired, at }
    }
}

/// One use of a step by an `#[idempotent]` function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepUse {
    /// The step's name.
    pub name: &'static str,
    /// The annotated function.
    pub at: Location,
}

impl StepUse {
    /// Used by the generated code of `#[idempotent]`.
    #[doc(hidden)]
    pub const fn new(name: &'static str, at: Location) -> Self {
        Self { name, at }
    }
}

inventory::collect!(StepDeclaration);
inventory::collect!(StepUse);

/// Every step declared in the program, sorted by name, then location.
pub fn declared() -> Vec<StepDeclaration> {
    let mut all: Vec<StepDeclaration> = inventory::iter::<StepDeclaration>().copied().collect();
    all.sort_by(|a, b| (a.name, a.at).cmp(&(b.name, b.at)));
    all
}

/// Every use of a step by an `#[idempotent]` function, sorted by name, then location.
pub fn used() -> Vec<StepUse> {
    let mut all: Vec<StepUse> = inventory::iter::<StepUse>().copied().collect();
    all.sort_by(|a, b| (a.name, a.at).cmp(&(b.name, b.at)));
    all
}

/// One thing wrong with the program's steps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RegistryProblem {
    /// A declared name is not of the form `name.vN`.
    Malformed {
        /// The name.
        name: &'static str,
        /// Where it was declared.
        at: Location,
    },
    /// A name is declared more than once.
    DeclaredTwice {
        /// The name.
        name: &'static str,
        /// Every declaration, sorted.
        at: Vec<Location>,
    },
    /// An `#[idempotent]` function uses a step that no `steps!` declares.
    Undeclared {
        /// The name.
        name: &'static str,
        /// Every function using it, sorted.
        used_at: Vec<Location>,
    },
    /// The store still holds unexpired keys for a step that is no longer
    /// declared: retries under those keys would run again.
    LiveKeysForUndeclaredStep {
        /// The step name found in the store.
        name: String,
    },
    /// The store could not be asked for its live steps.
    StoreUnavailable {
        /// The store's error.
        error: String,
    },
}

impl fmt::Display for RegistryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryProblem::Malformed { name, at } => write!(
                f,
                "step `{name}` declared at {at} is malformed: {}",
                check_step_name(name).err().map(|e| e.to_string()).unwrap_or_default()
            ),
            RegistryProblem::DeclaredTwice { name, at } => {
                write!(f, "step `{name}` is declared {} times; declare each step once:", at.len())?;
                for location in at {
                    write!(f, "\n    {location}")?;
                }
                Ok(())
            }
            RegistryProblem::Undeclared { name, used_at } => {
                write!(f, "step `{name}` is used but not declared; add it to a `steps!` block. Used by:")?;
                for location in used_at {
                    write!(f, "\n    {location}")?;
                }
                Ok(())
            }
            RegistryProblem::LiveKeysForUndeclaredStep { name } => write!(
                f,
                "the store holds unexpired keys for step `{name}`, which is no longer declared; retries under those keys \
                 would run again. Declare it again as `#[retired] const ... = \"{name}\";` until its keys expire"
            ),
            RegistryProblem::StoreUnavailable { error } => {
                write!(f, "could not read the live steps from the store: {error}")
            }
        }
    }
}

/// Everything [`validate`] or [`check`] found wrong, sorted, all at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryErrors {
    /// The problems, sorted.
    pub problems: Vec<RegistryProblem>,
}

impl fmt::Display for RegistryErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} problem(s) with idempotent steps:",
            self.problems.len()
        )?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RegistryErrors {}

/// Checks the program's declared and used steps, without a store.
///
/// ```
/// idem_runtime::registry::check().expect("steps are consistent");
/// ```
pub fn check() -> Result<(), RegistryErrors> {
    print_declarations_if_asked();
    into_result(problems(&declared(), &used(), None))
}

/// Checks the program's steps, and against `engine`'s store, that no step with
/// unexpired keys has vanished from the code. Call it at startup, after
/// migrating; it reports every problem at once.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = idem_runtime::Engine::<sqlx::Sqlite>::open_sqlite("app.db").await?;
/// engine.migrate().await?;
/// idem_runtime::registry::validate(&engine).await?;
/// # Ok(()) }
/// ```
pub async fn validate<DB: Backend>(engine: &Engine<DB>) -> Result<(), RegistryErrors> {
    print_declarations_if_asked();
    let live = engine.live_steps().await.map_err(|error| {
        if is_missing_table(&error) {
            format!("idem's tables are missing: run `engine.migrate()` first ({error})")
        } else {
            error.to_string()
        }
    });
    into_result(problems(&declared(), &used(), Some(live)))
}

/// When this environment variable is set, [`check`] and [`validate`] print
/// the program's step declarations to standard output, one line each
/// (`idem-step <name> active|retired`), and exit the process with status 0.
/// This is how `idem steps --declared-by <binary>` learns which steps a build
/// declares without a store or a running service.
pub const PRINT_STEPS_ENV: &str = "IDEM_PRINT_STEPS";

/// The line [`PRINT_STEPS_ENV`] prints for one declaration.
///
/// ```
/// use idem_runtime::registry::{declaration_line, Location, StepDeclaration};
/// let at = Location { item: "app::CHARGE", file: "src/steps.rs", line: 3 };
/// let line = declaration_line(&StepDeclaration::new("charge-card.v1", true, at));
/// assert_eq!(line, "idem-step charge-card.v1 retired");
/// ```
pub fn declaration_line(declaration: &StepDeclaration) -> String {
    let state = if declaration.retired {
        "retired"
    } else {
        "active"
    };
    format!("idem-step {} {state}", declaration.name)
}

fn print_declarations_if_asked() {
    if std::env::var_os(PRINT_STEPS_ENV).is_some() {
        for declaration in declared() {
            println!("{}", declaration_line(&declaration));
        }
        std::process::exit(0);
    }
}

fn into_result(problems: Vec<RegistryProblem>) -> Result<(), RegistryErrors> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RegistryErrors { problems })
    }
}

/// The checks themselves, on explicit inputs.
#[doc(hidden)]
pub fn problems(
    declared: &[StepDeclaration],
    used: &[StepUse],
    live: Option<Result<Vec<String>, String>>,
) -> Vec<RegistryProblem> {
    let mut problems = Vec::new();
    let mut by_name: BTreeMap<&'static str, Vec<Location>> = BTreeMap::new();
    for declaration in declared {
        if check_step_name(declaration.name).is_err() {
            problems.push(RegistryProblem::Malformed {
                name: declaration.name,
                at: declaration.at,
            });
        }
        by_name
            .entry(declaration.name)
            .or_default()
            .push(declaration.at);
    }
    for (name, mut at) in by_name.clone() {
        if at.len() > 1 {
            at.sort();
            problems.push(RegistryProblem::DeclaredTwice { name, at });
        }
    }
    let mut undeclared: BTreeMap<&'static str, Vec<Location>> = BTreeMap::new();
    for step_use in used {
        if !by_name.contains_key(step_use.name) {
            undeclared
                .entry(step_use.name)
                .or_default()
                .push(step_use.at);
        }
    }
    for (name, mut used_at) in undeclared {
        used_at.sort();
        problems.push(RegistryProblem::Undeclared { name, used_at });
    }
    match live {
        None => {}
        Some(Ok(live)) => {
            let live: BTreeSet<String> = live.into_iter().collect();
            for name in live {
                if !by_name.contains_key(name.as_str()) {
                    problems.push(RegistryProblem::LiveKeysForUndeclaredStep { name });
                }
            }
        }
        Some(Err(error)) => problems.push(RegistryProblem::StoreUnavailable { error }),
    }
    problems.sort();
    problems
}

/// Whether `error` says a table does not exist: the database was never
/// migrated (SQLite's "no such table", Postgres's `42P01`, MySQL's `42S02`).
fn is_missing_table(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("42P01" | "42S02"))
                || db.message().contains("no such table")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(item: &'static str, line: u32) -> Location {
        Location {
            item,
            file: "src/lib.rs",
            line,
        }
    }

    #[test]
    fn reports_everything_at_once_sorted() {
        let declared = [
            StepDeclaration::new("charge.v1", false, at("a::CHARGE", 3)),
            StepDeclaration::new("charge.v1", false, at("b::CHARGE", 9)),
            StepDeclaration::new("Bad", false, at("a::BAD", 4)),
            StepDeclaration::new("old.v1", true, at("a::OLD", 5)),
        ];
        let used = [
            StepUse::new("refund.v1", at("a::refund", 20)),
            StepUse::new("charge.v1", at("a::charge", 30)),
        ];
        let live = vec![
            "old.v1".to_owned(),
            "renamed.v1".to_owned(),
            "charge.v1".to_owned(),
        ];
        let problems = problems(&declared, &used, Some(Ok(live)));
        assert_eq!(
            problems,
            vec![
                RegistryProblem::Malformed {
                    name: "Bad",
                    at: at("a::BAD", 4)
                },
                RegistryProblem::DeclaredTwice {
                    name: "charge.v1",
                    at: vec![at("a::CHARGE", 3), at("b::CHARGE", 9)]
                },
                RegistryProblem::Undeclared {
                    name: "refund.v1",
                    used_at: vec![at("a::refund", 20)]
                },
                RegistryProblem::LiveKeysForUndeclaredStep {
                    name: "renamed.v1".to_owned()
                },
            ]
        );
        let report = RegistryErrors { problems }.to_string();
        assert!(report.contains("`b::CHARGE` at src/lib.rs:9"), "{report}");
    }

    #[test]
    fn a_consistent_program_passes() {
        let declared = [StepDeclaration::new("charge.v1", false, at("a::CHARGE", 3))];
        let used = [StepUse::new("charge.v1", at("a::charge", 30))];
        assert!(problems(&declared, &used, Some(Ok(vec!["charge.v1".into()]))).is_empty());
    }
}
