//! The header every fingerprint starts with: `"idem-fp-v2"`, the step name's
//! length (varint) and the step name, zero bytes up to a multiple of 64.
//!
//! A step name of up to 53 bytes makes a header of exactly one block, so the
//! SHA-256 state after it depends on the step name alone: each thread keeps
//! the states of the steps it hashed last, and a request's hash starts there.

use std::cell::RefCell;

use super::stream::{state_after_block, Sha256Stream, BLOCK};

/// The header's first bytes; the version changes whenever the encoding does.
pub(super) const VERSION: &[u8] = b"idem-fp-v2";

/// Where the step name starts in a one-block header (after its one-byte length).
const NAME_AT: usize = VERSION.len() + 1;

/// How many steps each thread remembers.
const CACHED_STEPS: usize = 8;

/// A stream that has taken `step`'s header.
pub(super) fn stream_after(step: &str) -> Sha256Stream {
    if NAME_AT + step.len() <= BLOCK {
        return Sha256Stream::after_block(STEPS.with(|steps| steps.borrow_mut().state(step)));
    }
    let mut stream = Sha256Stream::new();
    stream.bytes(VERSION);
    stream.varint(step.len() as u128);
    stream.bytes(step.as_bytes());
    stream.zero_to_block_end();
    stream
}

/// The one-block header of a step name of at most `BLOCK - NAME_AT` bytes
/// (whose length is then a one-byte varint).
fn one_block(step: &str) -> [u8; BLOCK] {
    let mut block = [0u8; BLOCK];
    block[..VERSION.len()].copy_from_slice(VERSION);
    block[VERSION.len()] = step.len() as u8;
    block[NAME_AT..NAME_AT + step.len()].copy_from_slice(step.as_bytes());
    block
}

/// Recently used one-block headers and the state after each; a new step
/// replaces the oldest.
struct StepStates {
    headers: [[u8; BLOCK]; CACHED_STEPS],
    states: [[u32; 8]; CACHED_STEPS],
    used: usize,
    next: usize,
}

thread_local! {
    static STEPS: RefCell<StepStates> = const {
        RefCell::new(StepStates {
            headers: [[0; BLOCK]; CACHED_STEPS],
            states: [[0; 8]; CACHED_STEPS],
            used: 0,
            next: 0,
        })
    };
}

impl StepStates {
    fn state(&mut self, step: &str) -> [u32; 8] {
        let name = step.as_bytes();
        let cached = self.headers[..self.used].iter().position(|header| {
            usize::from(header[VERSION.len()]) == name.len()
                && &header[NAME_AT..NAME_AT + name.len()] == name
        });
        if let Some(at) = cached {
            return self.states[at];
        }
        let header = one_block(step);
        let state = state_after_block(&header);
        self.headers[self.next] = header;
        self.states[self.next] = state;
        self.next = (self.next + 1) % CACHED_STEPS;
        self.used = (self.used + 1).min(CACHED_STEPS);
        state
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    /// The header's bytes as the module docs describe them, then `true`.
    fn expected(step: &str) -> [u8; 32] {
        let mut bytes = VERSION.to_vec();
        let mut n = step.len();
        while n >= 0x80 {
            bytes.push(n as u8 | 0x80);
            n >>= 7;
        }
        bytes.push(n as u8);
        bytes.extend(step.as_bytes());
        bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
        bytes.extend([b'b', 1]);
        Sha256::digest(&bytes).into()
    }

    fn hashed(step: &str) -> [u8; 32] {
        let mut stream = stream_after(step);
        stream.bytes(&[b'b', 1]);
        stream.finish()
    }

    #[test]
    fn step_names_around_the_one_block_limit() {
        for len in 0..200 {
            let step = "s".repeat(len);
            assert_eq!(hashed(&step), expected(&step), "step of {len} bytes");
        }
    }

    #[test]
    fn more_steps_than_the_cache_holds_and_names_that_share_a_prefix() {
        for round in 0..3 {
            for n in 0..CACHED_STEPS * 2 {
                for step in [
                    format!("step-{n}.v1"),
                    format!("step-{n}.v10"),
                    format!("step-{n}"),
                ] {
                    assert_eq!(hashed(&step), expected(&step), "{step}, round {round}");
                }
            }
        }
    }
}
