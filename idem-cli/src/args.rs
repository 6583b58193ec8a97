//! The arguments several commands share: one store (`--store URL`), one
//! service (that or a service of `--config FILE`), a key's scope, and
//! several named stores (`--store NAME=URL`) opened together.

use clap::Args;
use idem_runtime::Scope;

use crate::config::{Config, ConfigArg, Service};
use crate::exit::Failure;
use crate::store::{OpenMode, Store, StoreSpec};

#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// The store: a postgres:// or mysql:// URL, a sqlite: URL or a SQLite file path.
    #[arg(long, value_name = "URL", env = "IDEM_STORE")]
    pub(crate) store: StoreSpec,
}

/// One service: a store (`--store URL`), or a service of the config file,
/// one store or sharded.
#[derive(Debug, Args)]
pub(crate) struct ServiceArg {
    /// The store: a postgres:// or mysql:// URL, a sqlite: URL or a SQLite
    /// file path. Or give --config.
    #[arg(long, value_name = "URL", env = "IDEM_STORE")]
    store: Option<StoreSpec>,
    #[command(flatten)]
    config: ConfigArg,
    /// The config's service (needed when the config names several).
    #[arg(long, value_name = "NAME")]
    service: Option<String>,
}

impl ServiceArg {
    /// The service given: `--store`'s, or the config's.
    pub(crate) fn service(&self) -> Result<Service, Failure> {
        match (&self.store, &self.config.path) {
            (Some(_), Some(_)) => Err(Failure::Usage(
                "give --store URL or --config FILE, not both (IDEM_STORE and IDEM_CONFIG count)"
                    .into(),
            )),
            (Some(_), None) if self.service.is_some() => Err(Failure::Usage(
                "--service picks a service of --config FILE; with --store, drop it".into(),
            )),
            (Some(spec), None) => Ok(Service::one(spec.clone())),
            (None, Some(path)) => Config::load(path)?.one(self.service.as_deref()),
            (None, None) => Err(Failure::Usage(
                "give the store: --store URL, or --config FILE (or IDEM_STORE, IDEM_CONFIG)".into(),
            )),
        }
    }
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

    /// The scope's first part, the tenant shards are routed by.
    pub(crate) fn tenant(&self) -> Result<String, Failure> {
        let Some(stored) = &self.stored_scope else {
            return self.parts.first().cloned().ok_or(Failure::Usage(
                "give the key's scope: --scope TENANT (repeat for more parts) or --stored-scope"
                    .into(),
            ));
        };
        // `<len>:<part>/...`: the first part, as `Scope::first_part` reads it.
        stored
            .split_once(':')
            .and_then(|(len, rest)| rest.get(..len.parse().ok()?))
            .map(str::to_owned)
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "--stored-scope {stored}: no tenant to route by (a stored scope is `<len>:<tenant>/...`)"
                ))
            })
    }

    pub(crate) fn required(&self) -> Result<String, Failure> {
        self.stored().ok_or(Failure::Usage(
            "give the key's scope: --scope TENANT (repeat for more parts) or --stored-scope".into(),
        ))
    }
}

/// The names of the stores given so far, so that two of one name are refused.
#[derive(Debug, Default)]
pub(crate) struct StoreNames(std::collections::BTreeSet<String>);

impl StoreNames {
    /// Takes `name`, or refuses it if a store of that name was given.
    pub(crate) fn admit(&mut self, name: &str) -> Result<(), Failure> {
        if self.0.insert(name.to_owned()) {
            return Ok(());
        }
        Err(Failure::Usage(format!(
            "two stores are named {name}; name them: --store orders=URL --store payments=URL"
        )))
    }
}

/// Opens every store of `--store NAME=URL ...`, refusing two of one name.
pub(crate) async fn open_all(specs: &[StoreSpec]) -> Result<Vec<(StoreSpec, Store)>, Failure> {
    let mut names = StoreNames::default();
    let mut stores = Vec::new();
    for spec in specs {
        names.admit(&spec.name)?;
        let store = Store::open(spec, OpenMode::Existing).await?;
        stores.push((spec.clone(), store));
    }
    Ok(stores)
}
