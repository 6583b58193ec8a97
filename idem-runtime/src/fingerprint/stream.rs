//! SHA-256 fed straight by the encoder.
//!
//! The encoder writes a few bytes at a time, so the stream keeps its own
//! 64-byte block and hands whole blocks to `sha2::compress256`. A stream can
//! also resume from the state after a first block computed earlier (see
//! `header`).

use sha2::digest::generic_array::GenericArray;

/// SHA-256's block size.
pub(super) const BLOCK: usize = 64;

/// SHA-256's initial state.
const INITIAL: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// A SHA-256 computation in progress.
pub(super) struct Sha256Stream {
    state: [u32; 8],
    block: [u8; BLOCK],
    filled: usize,
    compressed_blocks: u64,
}

impl Sha256Stream {
    /// An empty stream.
    pub(super) fn new() -> Self {
        Self {
            state: INITIAL,
            block: [0; BLOCK],
            filled: 0,
            compressed_blocks: 0,
        }
    }

    /// The stream after one whole block whose resulting state is `state`
    /// (from [`state_after_block`]).
    pub(super) fn after_block(state: [u32; 8]) -> Self {
        Self {
            state,
            block: [0; BLOCK],
            filled: 0,
            compressed_blocks: 1,
        }
    }

    /// Appends one byte.
    #[inline]
    pub(super) fn byte(&mut self, byte: u8) {
        if self.filled == BLOCK {
            self.compress();
        }
        self.block[self.filled] = byte;
        self.filled += 1;
    }

    /// Appends bytes.
    #[inline]
    pub(super) fn bytes(&mut self, mut bytes: &[u8]) {
        loop {
            let room = BLOCK - self.filled;
            if bytes.len() <= room {
                self.block[self.filled..self.filled + bytes.len()].copy_from_slice(bytes);
                self.filled += bytes.len();
                return;
            }
            let (head, rest) = bytes.split_at(room);
            self.block[self.filled..].copy_from_slice(head);
            self.filled = BLOCK;
            self.compress();
            bytes = rest;
        }
    }

    /// Appends a fixed number of bytes (copied without a call when they fit).
    #[inline]
    pub(super) fn array<const N: usize>(&mut self, bytes: [u8; N]) {
        match self.block.get_mut(self.filled..self.filled + N) {
            Some(room) => {
                room.copy_from_slice(&bytes);
                self.filled += N;
            }
            None => self.bytes(&bytes),
        }
    }

    /// Appends `value` as an unsigned LEB128 varint (7 bits per byte, low
    /// bits first, the high bit set on every byte but the last).
    #[inline]
    pub(super) fn varint(&mut self, mut value: u128) {
        if value < 0x80 {
            self.byte(value as u8);
            return;
        }
        while value >= 0x80 {
            self.byte(value as u8 | 0x80);
            value >>= 7;
        }
        self.byte(value as u8);
    }

    /// Appends zero bytes up to the next block boundary.
    pub(super) fn zero_to_block_end(&mut self) {
        if self.filled > 0 {
            self.block[self.filled..].fill(0);
            self.filled = BLOCK;
            self.compress();
        }
    }

    /// The digest: SHA-256's padding (`0x80`, zeros, the bit length) and the
    /// final state, big-endian.
    pub(super) fn finish(mut self) -> [u8; 32] {
        let bits = (self.compressed_blocks * BLOCK as u64 + self.filled as u64) * 8;
        self.byte(0x80);
        if self.filled > BLOCK - 8 {
            self.zero_to_block_end();
        }
        self.block[self.filled..BLOCK - 8].fill(0);
        self.block[BLOCK - 8..].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &self.block);
        let mut digest = [0u8; 32];
        for (out, word) in digest.chunks_exact_mut(4).zip(self.state) {
            out.copy_from_slice(&word.to_be_bytes());
        }
        digest
    }

    #[cold]
    fn compress(&mut self) {
        compress(&mut self.state, &self.block);
        self.filled = 0;
        self.compressed_blocks += 1;
    }
}

/// SHA-256's state after the single block `block`.
pub(super) fn state_after_block(block: &[u8; BLOCK]) -> [u32; 8] {
    let mut state = INITIAL;
    compress(&mut state, block);
    state
}

/// One block into `state`, without copying the block.
#[inline]
fn compress(state: &mut [u32; 8], block: &[u8; BLOCK]) {
    sha2::compress256(state, std::slice::from_ref(GenericArray::from_slice(block)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    proptest! {
        #[test]
        fn matches_sha2_for_any_split(data in proptest::collection::vec(any::<u8>(), 0..300), cuts in proptest::collection::vec(0usize..300, 0..6)) {
            let mut stream = Sha256Stream::new();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut start = 0;
            for cut in cuts {
                stream.bytes(&data[start..cut]);
                start = cut;
            }
            stream.bytes(&data[start..]);
            prop_assert_eq!(stream.finish(), <[u8; 32]>::from(Sha256::digest(&data)));
        }

        #[test]
        fn resuming_after_a_first_block_hashes_like_its_bytes(first in proptest::collection::vec(any::<u8>(), 64), tail in proptest::collection::vec(any::<u8>(), 0..100)) {
            let block: [u8; BLOCK] = first.clone().try_into().unwrap();
            let mut stream = Sha256Stream::after_block(state_after_block(&block));
            stream.bytes(&tail);
            let whole: Vec<u8> = first.iter().chain(&tail).copied().collect();
            prop_assert_eq!(stream.finish(), <[u8; 32]>::from(Sha256::digest(&whole)));
        }
    }

    #[test]
    fn padding_at_every_length_near_a_block_boundary() {
        for len in 50..=130 {
            let data = vec![0xa5u8; len];
            let mut stream = Sha256Stream::new();
            for byte in &data {
                stream.byte(*byte);
            }
            assert_eq!(
                stream.finish(),
                <[u8; 32]>::from(Sha256::digest(&data)),
                "length {len}"
            );
        }
    }

    #[test]
    fn varints_are_leb128() {
        let mut stream = Sha256Stream::new();
        for value in [0u128, 127, 128, 300, u128::MAX] {
            stream.varint(value);
        }
        let mut expected = vec![0x00, 0x7f, 0x80, 0x01, 0xac, 0x02];
        expected.extend([0xff; 18]);
        expected.push(0x03);
        assert_eq!(stream.finish(), <[u8; 32]>::from(Sha256::digest(&expected)));
    }
}
