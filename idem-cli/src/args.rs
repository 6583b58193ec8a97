//! The arguments several commands share: one store (`--store URL`), a key's
//! scope, and several named stores (`--store NAME=URL`) opened together.

use clap::Args;
use idem_runtime::Scope;

use crate::exit::Failure;
use crate::store::{OpenMode, Store, StoreSpec};

#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// The store: a postgres:// or mysql:// URL, a sqlite: URL or a SQLite file path.
    #[arg(long, value_name = "URL", env = "IDEM_STORE")]
    pub(crate) store: StoreSpec,
}

/// The scope a key lives in.
#[derive(Debug, Args, Clone)]
pub(crate) struct ScopeArgs {
    /// A scope part, outermost first: the tenant, then a caller if the
    /// service scopes by one (`--scope acme --scope billing-api`).
    #[arg(long = "scope", value_name = "PART")]
    parts: Vec<String>,
    /// The scope as stored in the table (`4:acme/11:billing-api`), instead of --scope.
    #[arg(long, value_name = "SCOPE", conflicts_with = "parts")]
    stored_scope: Option<String>,
}

impl ScopeArgs {
    pub(crate) fn stored(&self) -> Option<String> {
        if let Some(stored) = &self.stored_scope {
            return Some(stored.clone());
        }
        (!self.parts.is_empty())
            .then(|| Scope::from_parts(self.parts.iter().map(String::as_str)).to_string())
    }

    pub(crate) fn required(&self) -> Result<String, Failure> {
        self.stored().ok_or(Failure::Usage(
            "give the key's scope: --scope TENANT (repeat for more parts) or --stored-scope".into(),
        ))
    }
}

/// Opens every store of `--store NAME=URL ...`, refusing two of one name.
pub(crate) async fn open_all(specs: &[StoreSpec]) -> Result<Vec<(StoreSpec, Store)>, Failure> {
    let mut names = std::collections::BTreeSet::new();
    let mut stores = Vec::new();
    for spec in specs {
        if !names.insert(spec.name.clone()) {
            return Err(Failure::Usage(format!(
                "two stores are named {}; name them: --store orders=URL --store payments=URL",
                spec.name
            )));
        }
        let store = Store::open(spec, OpenMode::Existing).await?;
        stores.push((spec.clone(), store));
    }
    Ok(stores)
}
