mod approvals;
mod environment;
mod protocol;
mod recovery;
mod retry;
mod simulation;
mod steering;
pub mod support;
mod turn;
