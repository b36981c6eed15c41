//! Gym environments in the state store, so that a hub restart keeps them:
//! the env's configuration once, its episode state after every call. The
//! local backend's [`EnvStore`].

use rusqlite::{params, OptionalExtension, Row};
use sandhub_client::Result;

use super::{json, Store};
use crate::{
    backend::{EnvStore, Episode, GymEnvRow},
    local::Hub,
};

/// Created by `Store::open` on every database, old ones included: a table
/// that is only ever added needs no migration beyond `IF NOT EXISTS`.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS gym_envs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    spec TEXT NOT NULL,
    episode TEXT NOT NULL,
    idle_timeout_seconds INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    last_used INTEGER NOT NULL
);
"#;

const COLUMNS: &str = "id, tenant, spec, episode, idle_timeout_seconds, created_at, last_used";

fn from_row(r: &Row<'_>) -> rusqlite::Result<GymEnvRow> {
    let spec: String = r.get(2)?;
    let episode: String = r.get(3)?;
    // A row this code cannot read is reported, never half-restored: a
    // different reward config would silently change an experiment.
    let bad = |col: usize, e: serde_json::Error| {
        rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, Box::new(e))
    };
    Ok(GymEnvRow {
        id: r.get(0)?,
        tenant: r.get(1)?,
        spec: serde_json::from_str(&spec).map_err(|e| bad(2, e))?,
        episode: serde_json::from_str(&episode).map_err(|e| bad(3, e))?,
        idle_timeout_seconds: r.get::<_, i64>(4)?.max(0) as u64,
        created_at: r.get(5)?,
        last_used: r.get(6)?,
    })
}

impl Store {
    pub fn insert_gym_env(&self, e: &GymEnvRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                &format!("INSERT INTO gym_envs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![
                    e.id,
                    e.tenant,
                    json(&e.spec),
                    json(&e.episode),
                    e.idle_timeout_seconds as i64,
                    e.created_at,
                    e.last_used,
                ],
            )
            .map(|_| ())
        })
    }

    /// Records an environment's episode state after a call; a closed
    /// (deleted) environment stays deleted.
    pub fn save_gym_episode(&self, id: &str, episode: &Episode, now: i64) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE gym_envs SET episode = ?2, last_used = MAX(last_used, ?3) WHERE id = ?1",
                params![id, json(episode), now],
            )
            .map(|_| ())
        })
    }

    /// An environment of `tenant`; another tenant's is simply not found.
    pub fn get_gym_env(&self, tenant: &str, id: &str) -> Result<Option<GymEnvRow>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM gym_envs WHERE id = ?1 AND tenant = ?2"),
                params![id, tenant],
                from_row,
            )
            .optional()
        })
    }

    pub fn delete_gym_env(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM gym_envs WHERE id = ?1", params![id])
                .map(|_| ())
        })
    }

    /// Ids and tenants of environments unused for their idle timeout at `now`.
    pub fn idle_gym_envs(&self, now: i64) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, tenant FROM gym_envs \
                 WHERE last_used + idle_timeout_seconds * 1000 <= ?1 ORDER BY last_used, id",
            )?;
            let rows = stmt.query_map(params![now], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }
}

/// The local backend keeps envs in its SQLite store, next to their sandboxes.
#[async_trait::async_trait]
impl EnvStore for Hub {
    async fn insert(&self, row: &GymEnvRow) -> Result<()> {
        self.store.insert_gym_env(row)
    }

    async fn save(&self, id: &str, episode: &Episode, now: i64) -> Result<()> {
        self.store.save_gym_episode(id, episode, now)
    }

    async fn get(&self, tenant: &str, id: &str) -> Result<Option<GymEnvRow>> {
        self.store.get_gym_env(tenant, id)
    }

    async fn delete(&self, id: &str) -> Result<()> {
        self.store.delete_gym_env(id)
    }

    async fn idle(&self, now: i64) -> Result<Vec<(String, String)>> {
        self.store.idle_gym_envs(now)
    }
}

#[cfg(test)]
mod tests {
    use sandhub_api::gym::{CreateEnv, Matcher, Task};

    use super::*;

    fn env(id: &str, tenant: &str) -> GymEnvRow {
        GymEnvRow {
            id: id.into(),
            tenant: tenant.into(),
            spec: CreateEnv {
                task: Some(Task {
                    prompt: Some("fix it".into()),
                    ..Task::default()
                }),
                reward: vec![Matcher::ExitCode {
                    equals: 0,
                    weight: 0.25,
                }],
                max_episode_steps: Some(7),
                ..CreateEnv::default()
            },
            episode: Episode::default(),
            idle_timeout_seconds: 60,
            created_at: 1_000,
            last_used: 1_000,
        }
    }

    #[test]
    fn an_env_survives_reopen_with_its_episode_and_only_for_its_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let episode = Episode {
            sandbox: Some("sb-1".into()),
            step: 3,
            episode: 2,
            seed: Some(u64::MAX),
            done: true,
            broken: false,
        };
        {
            let s = Store::open(&path).unwrap();
            s.insert_gym_env(&env("env-a", "t1")).unwrap();
            s.save_gym_episode("env-a", &episode, 5_000).unwrap();
        }
        let s = Store::open(&path).unwrap();
        let got = s.get_gym_env("t1", "env-a").unwrap().unwrap();
        assert_eq!(got.spec, env("env-a", "t1").spec);
        assert_eq!(got.episode, episode);
        assert_eq!(got.last_used, 5_000);
        assert!(s.get_gym_env("t2", "env-a").unwrap().is_none());
        s.delete_gym_env("env-a").unwrap();
        assert!(s.get_gym_env("t1", "env-a").unwrap().is_none());
        // A save after the delete does not bring it back.
        s.save_gym_episode("env-a", &episode, 6_000).unwrap();
        assert!(s.get_gym_env("t1", "env-a").unwrap().is_none());
    }

    #[test]
    fn a_database_from_before_gym_envs_opens_and_gains_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let s = Store::open(&path).unwrap();
            s.with(|c| c.execute_batch("DROP TABLE gym_envs")).unwrap();
            assert!(s.get_gym_env("t", "env-a").is_err(), "the table is gone");
        }
        let s = Store::open(&path).unwrap();
        s.insert_gym_env(&env("env-a", "t")).unwrap();
        assert!(s.get_gym_env("t", "env-a").unwrap().is_some());
    }

    #[test]
    fn idle_envs_are_those_unused_for_their_own_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        s.insert_gym_env(&env("env-a", "t1")).unwrap();
        let mut long = env("env-b", "t2");
        long.idle_timeout_seconds = 3600;
        s.insert_gym_env(&long).unwrap();
        assert!(s.idle_gym_envs(1_000 + 59_999).unwrap().is_empty());
        assert_eq!(
            s.idle_gym_envs(1_000 + 60_000).unwrap(),
            vec![("env-a".to_string(), "t1".to_string())]
        );
        // Use restarts the clock.
        s.save_gym_episode("env-a", &Episode::default(), 50_000)
            .unwrap();
        assert!(s.idle_gym_envs(61_000).unwrap().is_empty());
        assert_eq!(s.idle_gym_envs(1_000 + 3_600_000).unwrap().len(), 2);
    }

    #[test]
    fn an_unreadable_row_is_an_error_not_a_default() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        s.insert_gym_env(&env("env-a", "t")).unwrap();
        s.with(|c| c.execute("UPDATE gym_envs SET spec = '{\"reward\": 3}'", []))
            .unwrap();
        let e = s.get_gym_env("t", "env-a").unwrap_err();
        assert_eq!(e.code, sandhub_api::error::Code::Internal, "{e}");
    }
}
