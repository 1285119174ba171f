//! Where a PostgreSQL store hears of changes: `LISTEN` on a connection of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPool, PgPoolOptions};

use tower_idempotency_core::backend::notifier::Source;

use super::Sql;

/// Where a PostgreSQL store hears of changes: a connection of its own, made with the pool's
/// connect options but outside the pool, that listens on the table's channel.
#[derive(Clone)]
pub(super) struct Listener {
    options: Arc<PgConnectOptions>,
    sql: Arc<Sql>,
}

impl Listener {
    pub(super) fn new(pool: &PgPool, sql: &Arc<Sql>) -> Self {
        Self {
            options: pool.connect_options(),
            sql: Arc::clone(sql),
        }
    }
}

/// The next notification a listener receives, with the listener back once it did.
type Next =
    Pin<Box<dyn Future<Output = (PgListener, Result<Option<PgNotification>, sqlx::Error>)> + Send>>;

/// A listening connection: the wait for its next notification.
pub(super) struct Session(Next);

fn next(mut listener: PgListener) -> Next {
    Box::pin(async move {
        let received = listener.try_recv().await;
        (listener, received)
    })
}

impl Source for Listener {
    type Session = Session;

    async fn listen(&self) -> Option<Self::Session> {
        let options = (*self.options).clone();
        // Told apart from the pool's connections in `pg_stat_activity`.
        let name = match options.get_application_name() {
            Some(name) => format!("{name} listener"),
            None => "tower-idempotency listener".to_owned(),
        };
        let options = options.application_name(&name);
        // A pool of one, the listener's alone: its connection is never the application's.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&pool).await.ok()?;
        // A lost connection ends the session (the notifier listens again, and its waiters look
        // again), rather than a reconnection that would hide the notifications lost meanwhile.
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        listener.listen(&self.sql.channel).await.ok()?;
        Some(Session(next(listener)))
    }

    fn poll_changed(session: &mut Self::Session, cx: &mut Context<'_>) -> Poll<Option<String>> {
        let (listener, received) = std::task::ready!(session.0.as_mut().poll(cx));
        match received {
            Ok(Some(notification)) => {
                let key = notification.payload().to_owned();
                session.0 = next(listener);
                Poll::Ready(Some(key))
            }
            Ok(None) | Err(_) => Poll::Ready(None),
        }
    }
}
