mod protocol;
mod recovery;
mod simulation;
mod steering;
pub mod support;
mod turn;
