//! Every store against the public conformance suite and its own guarantees: memory, the boxed store, Redis and Redis Cluster, PostgreSQL and MySQL (plain and transactional), and SQLite. The service-backed ones run behind their features.

#[path = "../common/mod.rs"]
mod common;

mod dyn_store;
mod memory_store;
mod mysql_store;
mod mysql_transactional;
mod mysql_upkeep;
mod postgres_maintenance;
mod postgres_store;
mod postgres_transactional;
mod postgres_waiting;
mod redis_cluster;
mod redis_replicas;
mod redis_store;
mod redis_waiting;
mod sqlite_store;
mod sqlite_upkeep;
mod transactional_cases;
mod transactional_runs;
