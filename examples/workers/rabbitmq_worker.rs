//! A RabbitMQ worker whose effect happens once per message, whatever the broker delivers:
//! manual acks under a prefetch, each message run through
//! [`Idempotent`](tower_idempotency::Idempotent) and acknowledged only once its value is
//! stored. A delivery while another attempt holds its key is requeued after a pause; one whose
//! key belongs to another message is rejected.
//!
//! ```text
//! cargo run --example rabbitmq_worker --features rabbitmq -- --queue labels --store memory
//! cargo run --example rabbitmq_worker --features rabbitmq -- --queue labels --publish 500 --duplicate-every 10
//! ```
//!
//! Flags: `--broker URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`), `--queue NAME`
//! (declared durable if missing), `--store URL` (`memory`, `redis://…`, `postgres://…`,
//! `mysql://…`, `sqlite://PATH`; built with that store's feature), `--transactional` (the
//! effect commits with the stored value: PostgreSQL or MySQL), `--work-delay-ms N`,
//! `--key-from-header` (the key is the message's `message_id` property, not the body's `id`),
//! `--prefetch N`, `--lease-ms N`, `--worker NAME`, `--close-channel-every N` (closes the
//! channel after N deliveries, their acks pending: the broker delivers them again); `--publish
//! N --duplicate-every K --id-prefix P` feeds the queue instead; `--report` prints how many
//! messages the queue holds ready (not those delivered and unacknowledged); `--delete` deletes
//! the queue.
//!
//! Messages are `{"id": "...", "parcel_id": "..."}`; the effect of each is a row of
//! `labels_by_message` in the store's database, or on memory and Redis a printed line
//! `effect LABEL MESSAGE WORKER`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

#[path = "../common/mod.rs"]
mod common;
mod worker;

use worker::{Options, Verdict, Worker};

const USAGE: &str = "usage: rabbitmq_worker [--broker URL] [--queue NAME] [--store URL] \
    [--transactional] [--work-delay-ms N] [--key-from-header] [--prefetch N] [--lease-ms N] \
    [--worker NAME] [--close-channel-every N] | --publish N [--duplicate-every K] [--id-prefix P] \
    | --report | --delete";

#[tokio::main]
async fn main() {
    worker::init_tracing();
    let options = Options::from_args(USAGE, "amqp://guest:guest@127.0.0.1:5672/%2f");
    if let Err(error) = run(&options).await {
        eprintln!("rabbitmq worker: {error}");
        std::process::exit(1);
    }
}

/// A channel with the queue declared.
async fn channel(connection: &Connection, options: &Options) -> Result<(Channel, u32), String> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let queue = channel
        .queue_declare(
            options.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("the queue {}: {e}", options.queue))?;
    Ok((channel, queue.message_count()))
}

async fn run(options: &Options) -> Result<(), String> {
    let connection = Connection::connect(&options.broker, ConnectionProperties::default())
        .await
        .map_err(|e| format!("{}: {e}", options.broker))?;
    if options.publish.is_some() {
        let (channel, _) = channel(&connection, options).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        for message in options.messages() {
            let body = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
            let properties = BasicProperties::default()
                .with_message_id(message.id.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            channel
                .basic_publish(
                    "".into(),
                    options.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?;
        }
        println!("published {}", options.messages().len());
        return Ok(());
    }
    if options.delete {
        let (channel, _) = channel(&connection, options).await?;
        channel
            .queue_delete(options.queue.as_str().into(), Default::default())
            .await
            .map_err(|e| format!("deleting {}: {e}", options.queue))?;
        return Ok(());
    }
    if options.report {
        let (_, ready) = channel(&connection, options).await?;
        println!("pending {ready}");
        return Ok(());
    }
    let worker = Worker::open(options).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        worker::terminated().await;
        let _ = stop.send(true);
    });
    let received = AtomicU64::new(0);
    tracing::info!(queue = %options.queue, store = %options.store, worker = %options.worker, "rabbitmq worker consuming");
    // One channel after another: a channel closed (by `--close-channel-every`, or the broker)
    // ends its consumer, and its unacknowledged deliveries go back to the queue.
    while !*stopped.borrow() {
        let (channel, _) = channel(&connection, options).await?;
        channel
            .basic_qos(options.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let consumer = channel
            .basic_consume(
                options.queue.as_str().into(),
                options.worker.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consuming: {e}"))?;
        let mut stopping = stopped.clone();
        // Stops taking deliveries on SIGTERM; the ones in hand finish and are acknowledged.
        consumer
            .take_until(async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            })
            .for_each_concurrent(usize::from(options.prefetch), |delivery| async {
                let delivery = match delivery {
                    Ok(delivery) => delivery,
                    Err(error) => {
                        tracing::warn!(%error, "receiving");
                        return;
                    }
                };
                let n = received.fetch_add(1, Ordering::Relaxed) + 1;
                if options
                    .close_channel_every
                    .is_some_and(|every| n.is_multiple_of(every))
                {
                    tracing::info!(received = n, "closing the channel, its acks pending");
                    let _ = channel.close(200, "forced redelivery".into()).await;
                }
                let key = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.as_str());
                let acked = match worker
                    .handle(&delivery.data, key, delivery.redelivered)
                    .await
                {
                    Verdict::Ack => delivery.acker.ack(BasicAckOptions::default()).await,
                    Verdict::Retry => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let requeue = BasicNackOptions {
                            requeue: true,
                            ..Default::default()
                        };
                        delivery.acker.nack(requeue).await
                    }
                    Verdict::Reject(_) => {
                        delivery
                            .acker
                            .reject(BasicRejectOptions { requeue: false })
                            .await
                    }
                };
                if let Err(error) = acked {
                    tracing::warn!(%error, "acknowledging; the broker delivers it again");
                }
            })
            .await;
    }
    tracing::info!("rabbitmq worker stopped");
    Ok(())
}
