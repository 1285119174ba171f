//! A NATS JetStream worker whose effect happens once per message, whatever the broker
//! delivers: a durable pull consumer with explicit acks, each message run through
//! [`Idempotent`](tower_idempotency::Idempotent) and acknowledged only once its value is
//! stored. A delivery while another attempt holds its key is asked again later (`Nak` with a
//! delay); one whose key belongs to another message is terminated.
//!
//! ```text
//! cargo run --example nats_worker --features nats -- --queue labels --store memory
//! cargo run --example nats_worker --features nats -- --queue labels --publish 500 --duplicate-every 10
//! ```
//!
//! Flags: `--broker URL` (default `nats://127.0.0.1:4222`), `--queue NAME` (the stream and its
//! subject, made if missing), `--store URL` (`memory`, `redis://…`, `postgres://…`,
//! `mysql://…`, `sqlite://PATH`; built with that store's feature), `--transactional` (the
//! effect commits with the stored value: PostgreSQL or MySQL), `--work-delay-ms N`,
//! `--key-from-header` (the key is the producer's `Message-Id` header, not the body's `id`),
//! `--ack-wait-ms N`, `--lease-ms N`, `--prefetch N`, `--worker NAME`; `--publish N
//! --duplicate-every K --id-prefix P` feeds the stream instead; `--report` prints what the
//! consumer has not had acknowledged; `--delete` deletes the stream.
//!
//! Messages are `{"id": "...", "parcel_id": "..."}`; the effect of each is a row of
//! `labels_by_message` in the store's database, or on memory and Redis a printed line
//! `effect LABEL MESSAGE WORKER`.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use futures_util::StreamExt as _;

#[path = "../common/mod.rs"]
mod common;
mod worker;

use worker::{Options, Verdict, Worker};

const USAGE: &str = "usage: nats_worker [--broker URL] [--queue NAME] [--store URL] \
    [--transactional] [--work-delay-ms N] [--key-from-header] [--ack-wait-ms N] [--lease-ms N] \
    [--prefetch N] [--worker NAME] | --publish N [--duplicate-every K] [--id-prefix P] | --report \
    | --delete";

/// The header that carries the producer's message id.
const MESSAGE_ID: &str = "Message-Id";

/// The durable consumer every worker of a stream shares.
const CONSUMER: &str = "workers";

#[tokio::main]
async fn main() {
    worker::init_tracing();
    let options = Options::from_args(USAGE, "nats://127.0.0.1:4222");
    if let Err(error) = run(&options).await {
        eprintln!("nats worker: {error}");
        std::process::exit(1);
    }
}

async fn run(options: &Options) -> Result<(), String> {
    let client = async_nats::connect(&options.broker)
        .await
        .map_err(|e| format!("{}: {e}", options.broker))?;
    let jetstream = jetstream::new(client);
    if options.delete {
        jetstream
            .delete_stream(&options.queue)
            .await
            .map_err(|e| format!("deleting {}: {e}", options.queue))?;
        return Ok(());
    }
    let stream = jetstream
        .get_or_create_stream(jetstream::stream::Config {
            name: options.queue.clone(),
            subjects: vec![options.queue.clone()],
            ..Default::default()
        })
        .await
        .map_err(|e| format!("the stream {}: {e}", options.queue))?;
    if options.publish.is_some() {
        for message in options.messages() {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(MESSAGE_ID, message.id.as_str());
            let body = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
            jetstream
                .publish_with_headers(options.queue.clone(), headers, body.into())
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?;
        }
        println!("published {}", options.messages().len());
        return Ok(());
    }
    let mut consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: options.ack_wait,
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("the consumer: {e}"))?;
    if options.report {
        let info = consumer.info().await.map_err(|e| e.to_string())?;
        println!(
            "pending {} unacknowledged {}",
            info.num_pending, info.num_ack_pending
        );
        return Ok(());
    }
    let worker = Worker::open(options).await?;
    tracing::info!(queue = %options.queue, store = %options.store, worker = %options.worker, "nats worker consuming");
    let messages = consumer
        .messages()
        .await
        .map_err(|e| format!("consuming: {e}"))?;
    // Stops taking messages on SIGTERM; the ones in hand finish and are acknowledged.
    messages
        .take_until(worker::terminated())
        .for_each_concurrent(usize::from(options.prefetch), |message| async {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    tracing::warn!(%error, "receiving");
                    return;
                }
            };
            let key = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(MESSAGE_ID))
                .map(|value| value.as_str().to_owned());
            let redelivered = message.info().is_ok_and(|info| info.delivered > 1);
            let ack = match worker
                .handle(&message.payload, key.as_deref(), redelivered)
                .await
            {
                Verdict::Ack => AckKind::Ack,
                Verdict::Retry => AckKind::Nak(Some(Duration::from_millis(300))),
                Verdict::Reject(_) => AckKind::Term,
            };
            if let Err(error) = message.ack_with(ack).await {
                tracing::warn!(%error, "acknowledging");
            }
        })
        .await;
    tracing::info!("nats worker stopped");
    Ok(())
}
