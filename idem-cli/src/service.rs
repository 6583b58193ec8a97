//! A service's stores opened, and a tenant routed among its shards as the
//! runtime's `Shards` routes it: by [`HashRouter`], or by the directory table
//! ([`DirectoryRouter`]), a tenant mid-move included.

use idem_runtime::shard::{DirectoryEntry, DirectoryRouter, HashRouter};
use serde_json::{json, Value};

use crate::args::ScopeArgs;
use crate::config::{Layout, Service};
use crate::exit::Failure;
use crate::store::{OpenMode, Place, Store, StoreError, StoreSpec};

/// How a tenant's shard was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoutedBy {
    /// The hash router.
    Hash,
    /// The directory's row of the tenant.
    Directory,
    /// The directory does not list the tenant: the hash of its name, as
    /// the directory router falls back to.
    NotInDirectory,
}

/// A tenant's shard, and a move's other shard while one is unfinished.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) tenant: String,
    pub(crate) shard: usize,
    pub(crate) by: RoutedBy,
    /// A move fenced the tenant and will copy it there (requests refused).
    pub(crate) moving_to: Option<usize>,
    /// A move flipped the route from there and has not deleted the copies.
    pub(crate) moved_from: Option<usize>,
}

impl Route {
    /// The shards that may hold the tenant's records: its shard, then a
    /// move's other one.
    pub(crate) fn holders(&self) -> Vec<usize> {
        let mut shards = vec![self.shard];
        shards.extend(self.moving_to.filter(|&s| s != self.shard));
        shards.extend(self.moved_from.filter(|&s| s != self.shard));
        shards
    }

    /// Why a record of the tenant on `shard` is there: `None` for a shard
    /// the route does not explain (a copy left by an interrupted move, or
    /// a directory changed by hand).
    pub(crate) fn why(&self, shard: usize) -> Option<&'static str> {
        if shard == self.shard {
            Some("the tenant's shard")
        } else if self.moving_to == Some(shard) {
            Some("the target of the tenant's unfinished move")
        } else if self.moved_from == Some(shard) {
            Some("the source of the tenant's unfinished move: the move deletes this copy")
        } else {
            None
        }
    }

    /// One line for people: `tenant acme: shard 1 (directory)`, and a move in progress.
    pub(crate) fn describe(&self) -> String {
        let by = match self.by {
            RoutedBy::Hash => "hash router",
            RoutedBy::Directory => "directory",
            RoutedBy::NotInDirectory => "not in the directory: placed by the hash of its name",
        };
        let mut line = format!("tenant {}: shard {} ({by})", self.tenant, self.shard);
        if let Some(target) = self.moving_to {
            line.push_str(&format!(
                ", moving to shard {target}: its requests are refused until the move flips \
                 the route (run `idem tenant move` again if it stopped)"
            ));
        }
        if let Some(source) = self.moved_from {
            line.push_str(&format!(
                ", moved from shard {source}: the move has not deleted the copies there yet \
                 (run `idem tenant move` again if it stopped)"
            ));
        }
        line
    }

    /// The route as JSON.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "tenant": self.tenant,
            "shard": self.shard,
            "router": if self.by == RoutedBy::Hash { "hash" } else { "directory" },
            // Whether the directory lists the tenant (unlisted ones go by hash).
            "listed": match self.by {
                RoutedBy::Hash => None,
                by => Some(by == RoutedBy::Directory),
            },
            "moving_to": self.moving_to,
            "moved_from": self.moved_from,
        })
    }
}

impl Service {
    /// Its stores with their places: the one store, or every shard by index.
    pub(crate) fn stores(&self) -> Vec<(Place, &StoreSpec)> {
        match &self.layout {
            Layout::One(spec) => vec![(self.place(None), spec)],
            Layout::Sharded { shards, .. } => shards
                .iter()
                .enumerate()
                .map(|(index, spec)| (self.place(Some(index)), spec))
                .collect(),
        }
    }

    /// Whether it has shards.
    pub(crate) fn is_sharded(&self) -> bool {
        matches!(self.layout, Layout::Sharded { .. })
    }

    fn place(&self, shard: Option<usize>) -> Place {
        Place {
            service: self.name.clone(),
            shard,
        }
    }

    /// Opens every store, in order.
    pub(crate) async fn open_all(&self) -> Result<Vec<(Place, Store)>, StoreError> {
        let mut opened = Vec::new();
        for (place, spec) in self.stores() {
            opened.push((place, Store::open(spec, OpenMode::Existing).await?));
        }
        Ok(opened)
    }

    /// The route of `scope`'s tenant, for a sharded service (`None` for one store).
    pub(crate) async fn route(&self, scope: &ScopeArgs) -> Result<Option<Route>, Failure> {
        let Layout::Sharded { shards, directory } = &self.layout else {
            return Ok(None);
        };
        let tenant = &scope.tenant()?;
        let hashed = HashRouter::index(tenant, shards.len());
        let Some(spec) = directory else {
            return Ok(Some(Route {
                tenant: tenant.to_owned(),
                shard: hashed,
                by: RoutedBy::Hash,
                moving_to: None,
                moved_from: None,
            }));
        };
        let Store::Postgres(pool) = Store::open(spec, OpenMode::Existing).await? else {
            unreachable!("the config accepts only a postgres:// directory")
        };
        let entry = DirectoryRouter::new(pool)
            .entry(tenant)
            .await
            .map_err(|source| StoreError::Query {
                name: spec.name.clone(),
                source,
                hint: " (is the directory table idem_tenant_shards there?)",
            })?;
        let route = match entry {
            None => Route {
                tenant: tenant.to_owned(),
                shard: hashed,
                by: RoutedBy::NotInDirectory,
                moving_to: None,
                moved_from: None,
            },
            Some(DirectoryEntry {
                shard,
                moving_to,
                moved_from,
            }) => Route {
                tenant: tenant.to_owned(),
                shard,
                by: RoutedBy::Directory,
                moving_to,
                moved_from,
            },
        };
        if let Some(beyond) = route.holders().into_iter().find(|&s| s >= shards.len()) {
            return Err(Failure::Usage(format!(
                "{}: the directory names shard {beyond} for tenant {tenant}, and the config \
                 lists {} shard(s) for {}",
                spec.name,
                shards.len(),
                self.name
            )));
        }
        Ok(Some(route))
    }

    /// The stores that hold `scope`'s records: the one store, or the
    /// shards of its tenant's route (its shard, and a move's other one).
    pub(crate) async fn open_for(
        &self,
        scope: &ScopeArgs,
    ) -> Result<(Option<Route>, Vec<(Place, Store)>), Failure> {
        let Some(route) = self.route(scope).await? else {
            return Ok((None, self.open_all().await?));
        };
        let stores = self.stores();
        let mut opened = Vec::new();
        for shard in route.holders() {
            let (place, spec) = &stores[shard];
            opened.push((place.clone(), Store::open(spec, OpenMode::Existing).await?));
        }
        Ok((Some(route), opened))
    }
}
