//! Deterministic id generation: a seeded SplitMix64 stream.
//!
//! The browser driver seeds it from `getrandom`; tests seed it with a
//! constant, so a simulation replays identically from its seed.

#[derive(Debug, Clone)]
pub struct IdGen {
    state: u64,
}

impl IdGen {
    pub fn new(seed: u64) -> Self {
        IdGen { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `prefix` followed by 16 hex digits.
    pub fn next_id(&mut self, prefix: &str) -> String {
        format!("{prefix}{:016x}", self.next_u64())
    }
}
