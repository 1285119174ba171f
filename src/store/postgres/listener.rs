//! Where a PostgreSQL store hears of changes: `LISTEN` on a connection of its own.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::notifier::Source;

use super::Sql;

/// Where a PostgreSQL store hears of changes: a connection of its own, outside the pool, that
/// listens on the table's channel.
#[derive(Clone)]
pub(super) struct Listener {
    pub(super) config: tokio_postgres::Config,
    pub(super) sql: Arc<Sql>,
}

impl Source for Listener {
    type Session = (
        tokio_postgres::Client,
        tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
    );

    async fn listen(&self) -> Option<Self::Session> {
        let (client, mut connection) = self.config.connect(NoTls).await.ok()?;
        // The connection runs the statement only while it is polled.
        let listening = {
            let mut listen = std::pin::pin!(client.batch_execute(&self.sql.listen));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(result) = listen.as_mut().poll(cx) {
                    return Poll::Ready(result.is_ok());
                }
                loop {
                    match std::task::ready!(connection.poll_message(cx)) {
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return Poll::Ready(false),
                    }
                }
            })
            .await
        };
        listening.then_some((client, connection))
    }

    fn poll_changed(
        (_, connection): &mut Self::Session,
        cx: &mut Context<'_>,
    ) -> Poll<Option<String>> {
        loop {
            match std::task::ready!(connection.poll_message(cx)) {
                Some(Ok(AsyncMessage::Notification(notification))) => {
                    return Poll::Ready(Some(notification.payload().to_owned()));
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Poll::Ready(None),
            }
        }
    }
}
