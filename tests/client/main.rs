//! The client side: one key per intent, retried within a budget.

mod answers;
mod client;
mod end_to_end;
mod through_reqwest;
