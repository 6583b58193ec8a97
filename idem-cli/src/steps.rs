//! `idem steps`: the steps each store holds records for, and, given what a
//! build declares, the live ones it no longer declares.
//!
//! The rule is the registry's ([`idem_runtime::registry`]): a step with
//! unexpired keys must stay declared (`#[retired]` is enough) until they
//! expire, or retries under those keys run again. A build's declarations come
//! from `--declared a.v1,b.v2`, or from `--declared-by BINARY`: the binary is
//! run with [`PRINT_STEPS_ENV`] set, and its call to `registry::check` or
//! `registry::validate` prints one `idem-step NAME active|retired` line per
//! declaration and exits before doing anything else.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use clap::Args;
use idem_runtime::registry::PRINT_STEPS_ENV;
use serde_json::json;

use crate::args::open_all;
use crate::exit::{Failure, FOUND, OK};
use crate::output::{json as print_json, table};
use crate::store::StoreSpec;

/// A step a build declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// Whether it is kept only until its keys expire.
    pub retired: bool,
}

/// Runs `binary` with [`PRINT_STEPS_ENV`] and reads its declarations.
pub fn declared_by(binary: &Path) -> Result<BTreeMap<String, Declared>, String> {
    let output = Command::new(binary)
        .env(PRINT_STEPS_ENV, "1")
        .output()
        .map_err(|error| format!("--declared-by {}: {error}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let declared = parse_declarations(&stdout);
    if !output.status.success() || !stdout.lines().any(|l| l.starts_with("idem-step ")) {
        if declared.is_empty() && output.status.success() {
            // A build with no steps prints nothing and exits 0.
            return Ok(declared);
        }
        return Err(format!(
            "--declared-by {}: exited with {} without printing its steps; it must call \
             idem::registry::check() or validate() at startup. Its stderr: {}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(declared)
}

/// The `idem-step NAME active|retired` lines of `text`; other lines are ignored.
pub fn parse_declarations(text: &str) -> BTreeMap<String, Declared> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("idem-step ")?.split_whitespace();
            let name = words.next()?;
            let retired = words.next() == Some("retired");
            Some((name.to_owned(), Declared { retired }))
        })
        .collect()
}

#[derive(Debug, Args)]
pub(crate) struct StepsArgs {
    /// A store, `NAME=URL`; repeat it.
    #[arg(long = "store", value_name = "NAME=URL", required = true)]
    pub(crate) stores: Vec<StoreSpec>,
    /// The steps a build declares (retired ones included), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "STEPS")]
    pub(crate) declared: Vec<String>,
    /// A binary built with idem: run with IDEM_PRINT_STEPS=1, it prints its
    /// declarations from `registry::check`/`validate` and exits.
    #[arg(long, value_name = "BINARY")]
    pub(crate) declared_by: Option<std::path::PathBuf>,
}

pub(crate) async fn run(json: bool, args: &StepsArgs) -> Result<u8, Failure> {
    let mut declared: Option<BTreeMap<String, Declared>> = None;
    if !args.declared.is_empty() {
        let mut listed = BTreeMap::new();
        for name in &args.declared {
            let name = name.trim();
            idem_runtime::check_step_name(name)
                .map_err(|error| Failure::Usage(format!("--declared {name}: {error}")))?;
            listed.insert(name.to_owned(), Declared { retired: false });
        }
        declared = Some(listed);
    }
    if let Some(binary) = &args.declared_by {
        let from_binary = declared_by(binary).map_err(Failure::Usage)?;
        declared
            .get_or_insert_with(BTreeMap::new)
            .extend(from_binary);
    }
    let stores = open_all(&args.stores).await?;
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let mut entries = Vec::new();
    for (spec, store) in &stores {
        for count in store.steps(&spec.name).await? {
            let verdict = match &declared {
                None => "",
                Some(declared) => match (declared.get(&count.step), count.live > 0) {
                    (None, true) => "LIVE KEYS, NOT DECLARED",
                    (None, false) => "not declared (no live keys)",
                    (Some(Declared { retired: true }), false) => "retired; can be removed",
                    (Some(Declared { retired: true }), true) => {
                        "retired; keep until its keys expire"
                    }
                    (Some(Declared { retired: false }), _) => "declared",
                },
            };
            if verdict == "LIVE KEYS, NOT DECLARED" {
                problems.push(format!(
                    "{}: step `{}` has {} live key(s) but is not declared; declare it again as \
                     `#[retired] const ... = \"{}\";` until they expire",
                    spec.name, count.step, count.live, count.step
                ));
            }
            entries.push(json!({
                "store": spec.name,
                "step": count.step,
                "live": count.live,
                "in_progress": count.in_progress,
                "total": count.total,
                "verdict": if verdict.is_empty() { None } else { Some(verdict) },
            }));
            rows.push(vec![
                spec.name.clone(),
                count.step.clone(),
                count.live.to_string(),
                count.in_progress.to_string(),
                count.total.to_string(),
                verdict.to_owned(),
            ]);
        }
    }
    if json {
        print_json(&json!({ "steps": entries, "problems": problems }));
    } else {
        table(
            &["store", "step", "live", "in progress", "total", "declared?"],
            &rows,
        );
        for problem in &problems {
            println!("problem: {problem}");
        }
    }
    Ok(if problems.is_empty() { OK } else { FOUND })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_declaration_lines() {
        let text =
            "starting\nidem-step charge-card.v1 active\nidem-step charge.v1 retired\nnoise\n";
        let declared = parse_declarations(text);
        assert_eq!(declared.len(), 2);
        assert!(declared["charge.v1"].retired);
        assert!(!declared["charge-card.v1"].retired);
    }
}
