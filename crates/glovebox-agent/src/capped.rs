//! Output capping for one stream of a command: the first part is kept as it comes (and sent
//! live), the last part in a ring; at the end the ring follows a marker saying how many bytes
//! were dropped between the two. Head, marker and tail together never exceed the cap: the
//! marker takes its room from the tail.

use std::collections::VecDeque;

/// One stream's cap: what is kept of it, and how much it wrote in all.
pub struct Capped {
    /// Bytes the head may still take.
    head_room: u64,
    head: u64,
    tail: VecDeque<u8>,
    tail_cap: usize,
    /// Tail bytes delivered by [`Capped::finish`].
    tail_kept: u64,
    total: u64,
}

/// The line between head and tail.
pub fn marker(dropped: u64) -> String {
    format!("\n[glovebox: {dropped} bytes dropped]\n")
}

impl Capped {
    /// A cap of `cap` bytes, the last `tail` of them (at most `cap`) for the output's end.
    pub fn new(cap: u64, tail: u64) -> Capped {
        let tail = tail.min(cap);
        Capped {
            head_room: cap - tail,
            head: 0,
            tail: VecDeque::new(),
            tail_cap: usize::try_from(tail).unwrap_or(usize::MAX),
            tail_kept: 0,
            total: 0,
        }
    }

    /// Counts `bytes`; returns the part of them the head keeps (to send now). The rest goes
    /// to the tail ring, pushing out its oldest bytes.
    pub fn push<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        self.total += bytes.len() as u64;
        let n = bytes.len().min(usize::try_from(self.head_room).unwrap_or(usize::MAX));
        self.head_room -= n as u64;
        self.head += n as u64;
        let rest = &bytes[n..];
        if self.tail_cap > 0 && !rest.is_empty() {
            let rest = &rest[rest.len().saturating_sub(self.tail_cap)..];
            let over = (self.tail.len() + rest.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..over);
            self.tail.extend(rest);
        }
        &bytes[..n]
    }

    /// Ends the stream: the bytes that follow the head, that is the tail, after the marker
    /// if anything was dropped. Later pushes are only counted. When the tail's room cannot
    /// hold the marker (a tail of 0 keeps the head only), nothing follows the head.
    pub fn finish(&mut self) -> Vec<u8> {
        let ring: Vec<u8> = std::mem::take(&mut self.tail).into();
        let (cap, dropped) = (self.tail_cap, self.total - self.head - ring.len() as u64);
        self.head_room = 0;
        self.tail_cap = 0;
        if dropped == 0 {
            self.tail_kept = ring.len() as u64;
            return ring;
        }
        // The marker displaces as many tail bytes as it is long, which it counts as dropped
        // too; its length settles within a digit or two.
        let mut len = marker(dropped).len();
        let m = loop {
            let m = marker(dropped + len as u64);
            if m.len() == len {
                break m;
            }
            len = m.len();
        };
        if m.len() > cap {
            return Vec::new();
        }
        // Something was dropped, so the ring is full (`cap` bytes).
        let mut out = m.into_bytes();
        out.extend_from_slice(&ring[len..]);
        self.tail_kept = (ring.len() - len) as u64;
        out
    }

    /// Bytes of the output kept (head and tail, not the marker).
    pub fn kept(&self) -> u64 {
        self.head + self.tail_kept
    }

    /// Bytes the stream wrote in all.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `data` in pieces of `piece` bytes; returns the whole capped output.
    fn run(cap: u64, tail: u64, data: &[u8], piece: usize) -> (Vec<u8>, Capped) {
        let mut c = Capped::new(cap, tail);
        let mut out = Vec::new();
        for p in data.chunks(piece.max(1)) {
            out.extend_from_slice(c.push(p));
        }
        out.extend(c.finish());
        (out, c)
    }

    fn numbers(n: u32) -> Vec<u8> {
        (0..n).map(|i| format!("{i}\n")).collect::<String>().into_bytes()
    }

    #[test]
    fn output_within_the_cap_is_kept_whole_without_a_marker() {
        for piece in [1, 7, 4096] {
            let data = numbers(100);
            let (out, c) = run(data.len() as u64, data.len() as u64 / 2, &data, piece);
            assert_eq!(out, data);
            assert_eq!((c.kept(), c.total()), (data.len() as u64, data.len() as u64));
        }
    }

    #[test]
    fn head_marker_and_tail_fill_the_cap_exactly_and_count_the_drop() {
        let data = numbers(100_000);
        for piece in [1, 13, 65_536, data.len()] {
            let (out, c) = run(1000, 500, &data, piece);
            assert_eq!(out.len(), 1000, "piece {piece}");
            assert_eq!(&out[..500], &data[..500]);
            let text = String::from_utf8(out.clone()).unwrap();
            let at = text.find("\n[glovebox: ").unwrap();
            assert_eq!(at, 500);
            let rest = &text[at..];
            let end = rest.find(" bytes dropped]\n").unwrap();
            let dropped: u64 = rest["\n[glovebox: ".len()..end].parse().unwrap();
            let tail = &rest[end + " bytes dropped]\n".len()..];
            assert!(data.ends_with(tail.as_bytes()));
            assert_eq!(500 + dropped + tail.len() as u64, data.len() as u64, "the count is the true drop");
            assert_eq!(c.kept() + dropped, c.total());
            assert!(tail.ends_with("99999\n"));
        }
    }

    #[test]
    fn the_marker_length_settles_when_its_own_room_adds_a_digit() {
        // 999,980 bytes dropped before the marker displaces tail bytes: the count gains a digit.
        let data = vec![b'y'; 1_000_030];
        let (out, c) = run(50, 40, &data, 1 << 16);
        let want = format!("{}{}{}", "y".repeat(10), marker(1_000_015), "y".repeat(5));
        assert_eq!(String::from_utf8(out).unwrap(), want);
        assert_eq!((c.kept(), c.total()), (15, 1_000_030));
    }

    #[test]
    fn a_tail_of_zero_or_too_small_for_the_marker_keeps_the_head_only() {
        let data = numbers(1000);
        for tail in [0, 5] {
            let (out, c) = run(100, tail, &data, 64);
            assert_eq!(out, &data[..(100 - tail) as usize]);
            assert_eq!(c.kept(), 100 - tail);
        }
    }

    #[test]
    fn output_after_the_end_is_only_counted() {
        let mut c = Capped::new(10, 5);
        assert_eq!(c.push(b"abc"), b"abc");
        assert_eq!(c.finish(), b"");
        assert_eq!(c.push(b"late"), b"");
        assert_eq!(c.finish(), b"");
        assert_eq!((c.kept(), c.total()), (3, 7));
    }

    #[test]
    fn a_tail_longer_than_the_cap_is_the_whole_cap() {
        let data = numbers(1000);
        let (out, _) = run(60, 99, &data, 3);
        assert_eq!(out.len(), 60);
        assert!(out.starts_with(b"\n[glovebox: ") && data.ends_with(&out[out.len() - 10..]), "{out:?}");
    }
}
