//! The client side: one key per intent, retried within a budget.

mod client;
