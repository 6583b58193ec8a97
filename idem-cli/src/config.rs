//! The config file the commands share (`--config idem.toml`, or
//! `IDEM_CONFIG`): each service's store, either one URL or the shards of a
//! service sharded by tenant and the router between them.
//!
//! ```toml
//! [services.orders]
//! store = "postgres://idem@db/orders"
//!
//! # Shards in the order of the router's indexes; the hash router.
//! [services.payments]
//! shards = ["postgres://idem@db0/payments", "postgres://idem@db1/payments"]
//!
//! # Routed by a directory table (idem_tenant_shards) on Postgres.
//! [services.ledger]
//! shards = ["postgres://idem@db0/ledger", "postgres://idem@db1/ledger", "postgres://idem@db2/ledger"]
//! directory = "postgres://idem@db0/directory"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;

use crate::exit::Failure;
use crate::store::StoreSpec;

/// `--config FILE`.
#[derive(Debug, Args, Clone)]
pub(crate) struct ConfigArg {
    /// A config file naming each service's store, or its shards and router
    /// (see `idem --help`).
    #[arg(long = "config", value_name = "FILE", env = "IDEM_CONFIG")]
    pub(crate) path: Option<PathBuf>,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    services: BTreeMap<String, Entry>,
}

/// One `[services.NAME]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    store: Option<String>,
    shards: Option<Vec<String>>,
    directory: Option<String>,
}

/// A service: where its key records live.
#[derive(Debug, Clone)]
pub(crate) struct Service {
    /// Its name, as shown in output.
    pub(crate) name: String,
    pub(crate) layout: Layout,
}

/// One store, or shards and their router.
#[derive(Debug, Clone)]
pub(crate) enum Layout {
    One(StoreSpec),
    Sharded {
        /// Shard `i` at index `i`, each named `NAME shard i`.
        shards: Vec<StoreSpec>,
        /// The directory's database (`NAME directory`); the hash router without one.
        directory: Option<StoreSpec>,
    },
}

impl Service {
    /// A service of one store given on the command line (`--store NAME=URL`).
    pub(crate) fn one(spec: StoreSpec) -> Self {
        Self {
            name: spec.name.clone(),
            layout: Layout::One(spec),
        }
    }
}

/// The services a config file names, by name.
#[derive(Debug)]
pub(crate) struct Config {
    path: PathBuf,
    services: Vec<Service>,
}

impl Config {
    /// Reads and checks the file at `path`; a file that cannot be read, is
    /// not TOML of this shape, or names no service is a usage error.
    pub(crate) fn load(path: &Path) -> Result<Self, Failure> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            Failure::Usage(format!(
                "config {}: cannot read it: {error}",
                path.display()
            ))
        })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, Failure> {
        let bad = |message: String| Failure::Usage(format!("config {}: {message}", path.display()));
        let file: File = toml::from_str(text).map_err(|error| bad(error.to_string()))?;
        if file.services.is_empty() {
            return Err(bad(
                "it names no service: add a table [services.NAME] with \
                 store = \"URL\", or shards = [\"URL0\", \"URL1\", ...]"
                    .into(),
            ));
        }
        let mut services = Vec::new();
        for (name, entry) in file.services {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(format!(
                    "service {name:?}: a name is letters, digits, `-` and `_`"
                )));
            }
            let layout = match (entry.store, entry.shards, entry.directory) {
                (Some(store), None, None) => Layout::One(StoreSpec {
                    name: name.clone(),
                    location: nonempty(&name, "store", store).map_err(bad)?,
                }),
                (None, Some(shards), directory) => {
                    if shards.is_empty() {
                        return Err(bad(format!("service {name}: shards = [] lists no shard")));
                    }
                    let mut specs = Vec::new();
                    for (index, url) in shards.into_iter().enumerate() {
                        let url = nonempty(&name, &format!("shard {index}"), url).map_err(bad)?;
                        specs.push(StoreSpec {
                            name: format!("{name} shard {index}"),
                            location: url,
                        });
                    }
                    let directory = match directory {
                        Some(url) if is_postgres(&url) => Some(StoreSpec {
                            name: format!("{name} directory"),
                            location: url,
                        }),
                        Some(url) => {
                            return Err(bad(format!(
                                "service {name}: directory {url:?} is not a postgres:// URL; \
                                 the directory table lives on Postgres"
                            )))
                        }
                        None => None,
                    };
                    Layout::Sharded {
                        shards: specs,
                        directory,
                    }
                }
                (Some(_), Some(_), _) => {
                    return Err(bad(format!(
                        "service {name}: give store = URL or shards = [...], not both"
                    )))
                }
                (Some(_), None, Some(_)) => {
                    return Err(bad(format!(
                        "service {name}: a directory routes between shards; \
                         give shards = [...] with it, or drop it"
                    )))
                }
                (None, None, _) => {
                    return Err(bad(format!(
                        "service {name} names no store: give store = \"URL\", \
                         or shards = [\"URL0\", \"URL1\", ...]"
                    )))
                }
            };
            services.push(Service { name, layout });
        }
        Ok(Self {
            path: path.to_owned(),
            services,
        })
    }

    /// The services named in `names`, or every one when `names` is empty.
    pub(crate) fn select(&self, names: &[String]) -> Result<Vec<Service>, Failure> {
        if names.is_empty() {
            return Ok(self.services.clone());
        }
        names
            .iter()
            .map(|name| {
                self.services
                    .iter()
                    .find(|service| &service.name == name)
                    .cloned()
                    .ok_or_else(|| {
                        Failure::Usage(format!(
                            "config {} has no service {name}; it names {}",
                            self.path.display(),
                            self.names()
                        ))
                    })
            })
            .collect()
    }

    /// The one service `name` names, or the config's only service.
    pub(crate) fn one(&self, name: Option<&str>) -> Result<Service, Failure> {
        match name {
            Some(name) => Ok(self.select(&[name.to_owned()])?.remove(0)),
            None if self.services.len() == 1 => Ok(self.services[0].clone()),
            None => Err(Failure::Usage(format!(
                "config {} names several services ({}): pick one with --service NAME",
                self.path.display(),
                self.names()
            ))),
        }
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.services.iter().map(|s| s.name.as_str()).collect();
        names.join(", ")
    }
}

fn nonempty(service: &str, what: &str, url: String) -> Result<String, String> {
    if url.trim().is_empty() {
        Err(format!("service {service}: the {what} URL is empty"))
    } else {
        Ok(url)
    }
}

/// Whether `url` names a Postgres database.
pub(crate) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("idem.toml"), text).map_err(|failure| match failure {
            Failure::Usage(message) => message,
            Failure::Store(error) => panic!("{error}"),
        })
    }

    #[test]
    fn reads_single_and_sharded_services() {
        let config = parse(
            r#"
            [services.orders]
            store = "orders.db"
            [services.payments]
            shards = ["postgres://h/p0", "postgres://h/p1"]
            directory = "postgres://h/dir"
            "#,
        )
        .unwrap();
        let services = config.select(&[]).unwrap();
        assert!(matches!(&services[0].layout, Layout::One(spec) if spec.location == "orders.db"));
        let Layout::Sharded { shards, directory } = &config.one(Some("payments")).unwrap().layout
        else {
            panic!("not sharded")
        };
        assert_eq!(shards[1].name, "payments shard 1");
        assert_eq!(shards[1].location, "postgres://h/p1");
        assert_eq!(directory.as_ref().unwrap().location, "postgres://h/dir");
        let Err(Failure::Usage(message)) = config.one(None) else {
            panic!("two services and none picked")
        };
        assert!(message.contains("--service NAME"), "{message}");
    }

    #[test]
    fn refuses_what_names_no_store() {
        assert!(parse("").unwrap_err().contains("names no service"));
        assert!(parse("[services.a]\n")
            .unwrap_err()
            .contains("a names no store"));
        assert!(parse("[services.a]\nshards = []\n")
            .unwrap_err()
            .contains("no shard"));
        assert!(parse("[services.a]\nstore = \"x\"\nshards = [\"y\"]\n")
            .unwrap_err()
            .contains("not both"));
        assert!(
            parse("[services.a]\nshards = [\"y\"]\ndirectory = \"d.db\"\n")
                .unwrap_err()
                .contains("not a postgres:// URL")
        );
        assert!(parse("[services.a]\nstor = \"x\"\n")
            .unwrap_err()
            .contains("unknown field"));
        assert!(parse("[services.a\n")
            .unwrap_err()
            .starts_with("config idem.toml: "));
    }
}
