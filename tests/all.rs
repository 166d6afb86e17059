//! Native integration tests: one binary, modules under `tests/suite/`.
//! Run one invariant with `cargo test <slug>`.

mod suite;
