//! Content that compresses and deduplicates like real data.
//!
//! Pure random bytes make compression useless and pure zeros make dedup
//! trivial; neither is what the papers measured. Their datasets are system
//! files and disk images (RevDedup §4.1), backups that "only get local
//! compression (an average of 2×)" in their first generation (Data Domain
//! §8.2.1), source trees (SiLo's Linux set) and VM disks (Parallel VM §5).
//! This module produces a mix of
//!
//! * **text** — words from a fixed vocabulary with Zipf frequencies (s ≈ 1),
//!   sentences, punctuation and lines of 40–100 characters;
//! * **source** — code-like lines: indentation, keywords, identifiers built
//!   from the vocabulary, numbers, operators, comments, braces;
//! * **binary** — structured records (repeated headers, counters, small
//!   integers, timestamps, names), integer tables, and machine-code-like
//!   bytes with short repeated idioms;
//! * **random** — incompressible bytes (compressed media, archives);
//! * **zeros** — padding and unused space.
//!
//! in configurable proportions ([`Mix`]), in pieces of about 6 KiB so that
//! the kinds interleave at the granularity of chunks. [`Mix::TYPICAL`] is
//! calibrated so that zstd level 3 compresses it about 2× (the Data Domain
//! generation-0 figure; see the test). Every byte is a function of the seed
//! and the buffer sizes used: the same calls give the same bytes. Two
//! different seeds give unrelated content, so no accidental duplicate chunks
//! arise except where a generator puts them on purpose.

use super::rng::{mix64, Rng};
use std::io::{self, Write};
use std::path::Path;
use std::sync::OnceLock;

/// Proportions (weights, need not sum to 1) of the content kinds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    pub text: f64,
    pub source: f64,
    pub binary: f64,
    pub random: f64,
    pub zeros: f64,
}

impl Mix {
    /// A typical mix of files/disk content: zstd -3 ratio ≈ 2.
    pub const TYPICAL: Mix = Mix {
        text: 0.27,
        source: 0.17,
        binary: 0.34,
        random: 0.20,
        zeros: 0.02,
    };
    /// Documents, logs, configuration.
    pub const TEXT: Mix = Mix {
        text: 0.92,
        source: 0.04,
        binary: 0.0,
        random: 0.04,
        zeros: 0.0,
    };
    /// Source code.
    pub const SOURCE: Mix = Mix {
        text: 0.08,
        source: 0.92,
        binary: 0.0,
        random: 0.0,
        zeros: 0.0,
    };
    /// Executables, libraries, databases.
    pub const BINARY: Mix = Mix {
        text: 0.10,
        source: 0.0,
        binary: 0.84,
        random: 0.02,
        zeros: 0.04,
    };
    /// Already-compressed data (media, archives, packages).
    pub const MEDIA: Mix = Mix {
        text: 0.0,
        source: 0.0,
        binary: 0.03,
        random: 0.97,
        zeros: 0.0,
    };
    /// Used blocks of a VM disk image: like TYPICAL with more zero padding.
    pub const DISK: Mix = Mix {
        text: 0.22,
        source: 0.10,
        binary: 0.34,
        random: 0.26,
        zeros: 0.08,
    };

    fn weights(&self) -> [f64; 5] {
        [self.text, self.source, self.binary, self.random, self.zeros].map(|w| {
            if w.is_finite() && w > 0.0 {
                w
            } else {
                0.0
            }
        })
    }
}

impl Default for Mix {
    fn default() -> Self {
        Mix::TYPICAL
    }
}

/// The kind of a file, chosen from its extension; decides its [`Mix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    Text,
    Source,
    Binary,
    Media,
}

impl FileKind {
    pub const ALL: [FileKind; 4] = [
        FileKind::Text,
        FileKind::Source,
        FileKind::Binary,
        FileKind::Media,
    ];

    pub fn mix(self) -> Mix {
        match self {
            FileKind::Text => Mix::TEXT,
            FileKind::Source => Mix::SOURCE,
            FileKind::Binary => Mix::BINARY,
            FileKind::Media => Mix::MEDIA,
        }
    }

    /// Typical extensions ("" = no extension).
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            FileKind::Text => &["txt", "conf", "md", "html", "xml", "log", "json", "csv", ""],
            FileKind::Source => &["c", "h", "py", "sh", "pl", "rs", "js", "cpp", "mk"],
            FileKind::Binary => &["so", "bin", "o", "db", "dat", "a", "mo", ""],
            FileKind::Media => &["gz", "png", "jpg", "deb", "xz", "zip", "ogg", "ttf"],
        }
    }

    /// The kind of an existing file from its extension (unknown → Binary).
    pub fn from_path(p: &Path) -> FileKind {
        let ext = p
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        for k in [FileKind::Source, FileKind::Media, FileKind::Text] {
            if !ext.is_empty() && k.extensions().contains(&ext.as_str()) {
                return k;
            }
        }
        match ext.as_str() {
            "rst" | "yaml" | "yml" | "toml" | "ini" | "cfg" | "tex" => FileKind::Text,
            "cc" | "hpp" | "java" | "go" | "s" | "dts" | "dtsi" | "kconfig" | "makefile" => {
                FileKind::Source
            }
            "bz2" | "zst" | "mp3" | "mp4" | "jpeg" | "gif" | "rpm" | "jar" | "woff" => {
                FileKind::Media
            }
            _ => FileKind::Binary,
        }
    }
}

// ---------------------------------------------------------------------------
// Vocabulary

const COMMON: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "data",
    "system",
    "file",
    "time",
    "new",
    "use",
    "first",
    "may",
    "also",
    "some",
    "into",
    "two",
    "than",
    "other",
    "only",
    "its",
    "then",
    "these",
    "our",
    "out",
    "about",
    "any",
    "each",
    "used",
    "such",
    "set",
    "number",
    "user",
    "value",
    "should",
    "must",
    "between",
    "block",
    "disk",
    "backup",
    "server",
    "version",
    "memory",
    "process",
    "storage",
    "table",
    "index",
    "chunk",
    "segment",
    "network",
    "client",
    "error",
    "state",
    "read",
    "write",
    "update",
    "list",
    "size",
    "page",
    "node",
    "key",
    "group",
    "level",
    "point",
    "result",
    "order",
    "case",
    "type",
    "support",
    "change",
    "work",
    "part",
    "section",
    "however",
    "where",
    "because",
    "through",
    "after",
    "before",
    "under",
    "over",
    "while",
    "both",
    "most",
    "many",
    "same",
    "different",
    "large",
    "small",
    "high",
    "low",
    "per",
    "without",
    "against",
    "since",
    "within",
    "during",
    "using",
    "based",
    "given",
    "following",
    "above",
    "below",
    "each",
    "make",
    "like",
    "just",
    "what",
    "how",
    "up",
    "down",
    "very",
    "well",
    "way",
    "even",
    "because",
    "any",
    "these",
    "give",
    "day",
    "week",
    "year",
    "people",
    "program",
    "function",
    "method",
    "service",
    "request",
    "report",
    "config",
    "option",
];

const CODE: &[&str] = &[
    "int", "char", "void", "struct", "return", "static", "const", "unsigned", "long", "len", "buf",
    "ptr", "ctx", "dev", "err", "ret", "flags", "lock", "init", "free", "alloc", "count", "offset",
    "addr", "req", "resp", "inode", "cpu", "irq", "dma", "reg", "mask", "shift", "tmp", "idx",
    "cur", "prev", "next", "head", "tail", "entry", "ops", "priv", "desc", "handle", "queue",
    "timer", "event", "sync", "fd", "opt", "arg", "str", "map", "hash", "bit", "max", "min",
    "status",
];

const SYLLABLES: &[&str] = &[
    "ka", "ro", "ti", "men", "ex", "ul", "sta", "ber", "lin", "qu", "or", "an", "de", "ri", "on",
    "ta", "el", "com", "pro", "ver", "ing", "tion", "al", "es", "ter", "con", "mi", "na", "po",
    "ly", "sen", "tra", "ca", "vi", "lo", "ge", "ment", "is", "ur", "ba", "ne", "sa", "ple", "ry",
    "di", "op", "im", "ab", "ad", "si", "mo", "ni", "ze", "fa", "hu", "wo",
];

const VOCAB_SIZE: usize = 4096;
const TABLE_BITS: u32 = 16;

struct Vocab {
    words: Vec<Box<[u8]>>,
    /// 2^16 slots mapping a uniform 16-bit value to a Zipf-distributed rank.
    table: Vec<u16>,
}

fn vocab() -> &'static Vocab {
    static V: OnceLock<Vocab> = OnceLock::new();
    V.get_or_init(|| {
        let mut words: Vec<Box<[u8]>> = Vec::with_capacity(VOCAB_SIZE);
        // Interleave English and code words at the top ranks.
        let (mut i, mut j) = (0, 0);
        while i < COMMON.len() || j < CODE.len() {
            for _ in 0..3 {
                if i < COMMON.len() {
                    words.push(COMMON[i].as_bytes().into());
                    i += 1;
                }
            }
            if j < CODE.len() {
                words.push(CODE[j].as_bytes().into());
                j += 1;
            }
        }
        // A fixed seed: the vocabulary is the same for every workload seed.
        let mut r = Rng::new(0x766f_6361_6275_6c61);
        while words.len() < VOCAB_SIZE {
            let n = 1 + r.below(4) as usize;
            let mut w = Vec::new();
            for _ in 0..n {
                w.extend_from_slice(r.choose(SYLLABLES).unwrap().as_bytes());
            }
            words.push(w.into());
        }
        let weights: Vec<f64> = (0..VOCAB_SIZE)
            .map(|k| 1.0 / (k as f64 + 2.0).powf(1.1))
            .collect();
        let total: f64 = weights.iter().sum();
        let slots = 1usize << TABLE_BITS;
        let mut table = Vec::with_capacity(slots);
        let mut rank = 0usize;
        let mut cum = weights[0];
        for s in 0..slots {
            let target = (s as f64 + 0.5) / slots as f64 * total;
            while cum < target && rank + 1 < VOCAB_SIZE {
                rank += 1;
                cum += weights[rank];
            }
            table.push(rank as u16);
        }
        Vocab { words, table }
    })
}

/// A word of the fixed vocabulary chosen uniformly by `bits` (for names).
pub fn vocab_word(bits: u64) -> &'static str {
    let v = vocab();
    std::str::from_utf8(&v.words[(bits % VOCAB_SIZE as u64) as usize]).unwrap_or("x")
}

/// A word of the fixed vocabulary with Zipf frequencies (low 16 bits used).
pub fn zipf_word(bits: u64) -> &'static str {
    std::str::from_utf8(word(vocab(), bits)).unwrap_or("x")
}

#[inline]
fn word(v: &Vocab, bits: u64) -> &[u8] {
    &v.words[v.table[(bits & 0xffff) as usize] as usize]
}

/// Copies as much of `src` as fits into `out[*pos..]`.
#[inline]
fn put(out: &mut [u8], pos: &mut usize, src: &[u8]) {
    let n = src.len().min(out.len() - *pos);
    out[*pos..*pos + n].copy_from_slice(&src[..n]);
    *pos += n;
}

// ---------------------------------------------------------------------------
// The generator

/// Generates mixed content deterministically from a seed.
#[derive(Clone, Debug)]
pub struct ContentGen {
    rng: Rng,
    weights: [f64; 5],
    line: Vec<u8>,
    indent: usize,
    /// Recently used phrases / identifiers (as the random bits that
    /// generate them): real text and code repeat themselves locally.
    phrases: [u64; POOL],
    idents: [u64; POOL],
}

const POOL: usize = 32;

const PIECE_MEDIAN: f64 = 6144.0;
const PIECE_MIN: usize = 512;
const PIECE_MAX: usize = 64 * 1024;

impl ContentGen {
    pub fn new(seed: u64, mix: Mix) -> ContentGen {
        let mut rng = Rng::new(mix64(seed ^ 0xc0_47e4_7c0d_e5ee));
        let mut phrases = [0u64; POOL];
        let mut idents = [0u64; POOL];
        for i in 0..POOL {
            phrases[i] = rng.next_u64();
            idents[i] = rng.next_u64();
        }
        ContentGen {
            rng,
            weights: mix.weights(),
            line: Vec::with_capacity(256),
            indent: 0,
            phrases,
            idents,
        }
    }

    /// The next `len` bytes as a vector.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(&mut v);
        v
    }

    /// Fills `buf` with pieces of the mix's kinds.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut pos = 0;
        while pos < buf.len() {
            let want = self
                .rng
                .lognormal(PIECE_MEDIAN, 0.9)
                .clamp(PIECE_MIN as f64, PIECE_MAX as f64) as usize;
            let end = (pos + want).min(buf.len());
            let kind = self.rng.choose_weighted(&self.weights);
            let piece = &mut buf[pos..end];
            match kind {
                0 => self.text(piece),
                1 => self.source(piece),
                2 => self.binary(piece),
                3 => self.rng.fill_bytes(piece),
                _ => piece.fill(0),
            }
            pos = end;
        }
    }

    /// Writes `len` bytes to `w` (in 64 KiB buffers).
    pub fn write_to<W: Write + ?Sized>(&mut self, w: &mut W, len: u64) -> io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            self.fill(&mut buf[..n]);
            w.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    }

    /// Text-only bytes (for line-oriented edits of text files).
    pub fn fill_text(&mut self, buf: &mut [u8]) {
        self.text(buf)
    }

    /// Source-like bytes.
    pub fn fill_source(&mut self, buf: &mut [u8]) {
        self.source(buf)
    }

    fn text(&mut self, out: &mut [u8]) {
        let v = vocab();
        let mut pos = 0;
        let mut col = 0usize;
        let mut width = 40 + self.rng.below(60) as usize;
        let mut cap = true;
        while pos < out.len() {
            let mut r = self.rng.next_u64();
            // About a third of the word triples repeat a recent phrase.
            let slot = (r >> 58) as usize % POOL;
            if r & 0xc000 != 0xc000 && r & 0x100 == 0 {
                r = self.phrases[slot] | 0xc000;
            } else if r & 0x3000 == 0 {
                self.phrases[slot] = r;
            }
            for k in 0..3 {
                if pos >= out.len() {
                    break;
                }
                let w = word(v, r >> (16 * k));
                let start = pos;
                put(out, &mut pos, w);
                if cap && start < pos {
                    out[start] = out[start].to_ascii_uppercase();
                    cap = false;
                }
                col += w.len() + 1;
                let p = (r >> 48) as u16 >> (5 * k);
                let sep: &[u8] = match p & 31 {
                    0 | 1 => {
                        cap = true;
                        b". "
                    }
                    2 | 3 => b", ",
                    _ => b" ",
                };
                if col >= width {
                    if sep != b" " {
                        put(out, &mut pos, &sep[..1]);
                    }
                    put(out, &mut pos, b"\n");
                    if (r >> 60) == 0 {
                        put(out, &mut pos, b"\n");
                        cap = true;
                    }
                    col = 0;
                    width = 40 + ((r >> 40) & 63) as usize;
                } else {
                    put(out, &mut pos, sep);
                }
            }
        }
    }

    fn ident(&mut self, line: &mut Vec<u8>) {
        let v = vocab();
        let mut r = self.rng.next_u64();
        // Most identifiers are local ones used again and again.
        let slot = (r >> 59) as usize % POOL;
        if r & 7 != 0 {
            r = self.idents[slot];
        } else {
            self.idents[slot] = r;
        }
        let n = 1 + (r >> 62) as usize % 3;
        for k in 0..n {
            if k > 0 {
                line.push(b'_');
            }
            line.extend_from_slice(word(v, r >> (16 * k)));
        }
    }

    fn number(&mut self, line: &mut Vec<u8>) {
        let r = self.rng.next_u64();
        let x = match r & 3 {
            0 => r >> 60,
            1 => (r >> 56) & 0xff,
            2 => 1 << ((r >> 58) & 15),
            _ => (r >> 40) & 0xffff,
        };
        if (r >> 2) & 7 == 0 {
            line.extend_from_slice(format!("0x{x:x}").as_bytes());
        } else {
            line.extend_from_slice(x.to_string().as_bytes());
        }
    }

    fn source(&mut self, out: &mut [u8]) {
        const OPS: [&[u8]; 8] = [
            b" + ", b" - ", b" & ", b" | ", b" == ", b" != ", b" < ", b" >> ",
        ];
        const TYPES: [&[u8]; 6] = [
            b"int ",
            b"unsigned long ",
            b"struct ",
            b"char *",
            b"u32 ",
            b"static int ",
        ];
        let mut pos = 0;
        let mut line = std::mem::take(&mut self.line);
        while pos < out.len() {
            line.clear();
            let r = self.rng.next_u64();
            let kind = r & 15;
            if kind == 15 && self.indent > 0 {
                self.indent -= 1;
            }
            line.resize(self.indent, b'\t');
            match kind {
                0 | 1 => {
                    line.extend_from_slice(TYPES[(r >> 8) as usize % TYPES.len()]);
                    self.ident(&mut line);
                    line.extend_from_slice(b" = ");
                    self.ident(&mut line);
                    line.extend_from_slice(OPS[(r >> 12) as usize % OPS.len()]);
                    self.number(&mut line);
                    line.extend_from_slice(b";\n");
                }
                2 | 3 => {
                    self.ident(&mut line);
                    line.extend_from_slice(b"->");
                    self.ident(&mut line);
                    line.extend_from_slice(b" = ");
                    self.ident(&mut line);
                    line.push(b'(');
                    self.ident(&mut line);
                    line.extend_from_slice(b", ");
                    self.number(&mut line);
                    line.extend_from_slice(b");\n");
                }
                4 | 5 if self.indent < 5 => {
                    line.extend_from_slice(if r & 0x100 == 0 { b"if (" } else { b"while (" });
                    self.ident(&mut line);
                    line.extend_from_slice(OPS[(r >> 12) as usize % OPS.len()]);
                    self.number(&mut line);
                    line.extend_from_slice(b") {\n");
                    self.indent += 1;
                }
                6 => {
                    line.extend_from_slice(b"return ");
                    self.ident(&mut line);
                    line.extend_from_slice(b";\n");
                }
                7 | 8 => {
                    line.extend_from_slice(b"/* ");
                    let v = vocab();
                    let n = 3 + (r >> 20) % 8;
                    for k in 0..n {
                        if k > 0 {
                            line.push(b' ');
                        }
                        let bits = self.rng.next_u64();
                        line.extend_from_slice(word(v, bits));
                    }
                    line.extend_from_slice(b" */\n");
                }
                9 if self.indent == 0 => {
                    line.extend_from_slice(b"\nstatic int ");
                    self.ident(&mut line);
                    line.extend_from_slice(b"(struct ");
                    self.ident(&mut line);
                    line.extend_from_slice(b" *");
                    self.ident(&mut line);
                    line.extend_from_slice(b", int ");
                    self.ident(&mut line);
                    line.extend_from_slice(b")\n{\n");
                    self.indent = 1;
                }
                10 if self.indent == 0 => {
                    line.extend_from_slice(b"#include <linux/");
                    self.ident(&mut line);
                    line.extend_from_slice(b".h>\n");
                }
                11 => line.push(b'\n'),
                12 | 13 => {
                    self.ident(&mut line);
                    line.push(b'(');
                    self.ident(&mut line);
                    line.extend_from_slice(b");\n");
                }
                15 => line.extend_from_slice(b"}\n"),
                _ => {
                    self.ident(&mut line);
                    line.extend_from_slice(b" |= ");
                    self.ident(&mut line);
                    line.extend_from_slice(b" << ");
                    self.number(&mut line);
                    line.extend_from_slice(b";\n");
                }
            }
            put(out, &mut pos, &line);
        }
        self.line = line;
    }

    fn binary(&mut self, out: &mut [u8]) {
        match self.rng.below(8) {
            0..=2 => self.records(out),
            3..=5 => self.code(out),
            _ => self.table(out),
        }
    }

    /// Fixed-size records with a repeated header, counters, small integers,
    /// timestamps and names (database pages, logs in binary formats).
    fn records(&mut self, out: &mut [u8]) {
        let v = vocab();
        let size = [16usize, 24, 32, 48, 64][self.rng.below(5) as usize];
        let magic = self.rng.next_u32().to_le_bytes();
        let mut counter = self.rng.next_u32();
        let mut ts = self.rng.next_u64() >> 24;
        let types = 1 + self.rng.below(6);
        let mut val = self.rng.below(1000) as i32 - 500;
        let mut rec = [0u8; 64];
        let mut pos = 0;
        while pos < out.len() {
            let r = self.rng.next_u64();
            rec.fill(0);
            rec[0..4].copy_from_slice(&magic);
            rec[4..8].copy_from_slice(&counter.to_le_bytes());
            rec[8..10].copy_from_slice(&((r % types) as u16).to_le_bytes());
            rec[10] = if (r >> 8) & 7 == 0 {
                1 << ((r >> 11) & 7)
            } else {
                0
            };
            ts += (r >> 16) & 0x3f;
            rec[12..16].copy_from_slice(&((ts & 0xffff_ffff) as u32).to_le_bytes());
            if size > 16 {
                val += ((r >> 32) & 0xf) as i32 - 7;
                rec[16..20].copy_from_slice(&val.to_le_bytes());
                rec[20..24].copy_from_slice(&(((r >> 42) & 0x7) as u32 * 100).to_le_bytes());
            }
            if size > 24 {
                let w = word(v, r >> 48);
                let n = w.len().min(size - 24);
                rec[24..24 + n].copy_from_slice(&w[..n]);
            }
            counter = counter.wrapping_add(1);
            put(out, &mut pos, &rec[..size]);
        }
    }

    /// Machine-code-like bytes: a skewed byte distribution with short idioms
    /// repeated from the recent past.
    fn code(&mut self, out: &mut [u8]) {
        const COMMON_BYTES: [u8; 16] = [
            0x00, 0xff, 0x48, 0x89, 0x8b, 0xe8, 0x0f, 0x85, 0x84, 0x45, 0x24, 0xc3, 0x83, 0x74,
            0x75, 0x01,
        ];
        let mut pos = 0;
        while pos < out.len() {
            let r = self.rng.next_u64();
            if r & 1 == 0 && pos >= 64 {
                // Repeat an idiom from the last KiB.
                let back = 8 + ((r >> 8) as usize % pos.min(1024).saturating_sub(8).max(1));
                let len = 4 + ((r >> 24) & 15) as usize;
                let src = pos - back.min(pos);
                for i in 0..len {
                    if pos >= out.len() {
                        break;
                    }
                    out[pos] = out[src + i];
                    pos += 1;
                }
            } else {
                let n = 2 + ((r >> 2) & 3) as usize;
                for k in 0..n {
                    if pos >= out.len() {
                        break;
                    }
                    let b = (r >> (8 + 12 * k)) as u16 & 0xfff;
                    out[pos] = if b & 0xc00 != 0 {
                        COMMON_BYTES[(b & 15) as usize]
                    } else {
                        (b >> 2) as u8
                    };
                    pos += 1;
                }
            }
        }
    }

    /// Tables of integers: sorted offsets with small deltas, or 16-bit
    /// samples of a slowly varying signal with noise.
    fn table(&mut self, out: &mut [u8]) {
        let mut pos = 0;
        if self.rng.chance(0.5) {
            let mut x = self.rng.next_u32() >> 8;
            let step = 1 << (1 + self.rng.below(10));
            while pos < out.len() {
                x = x.wrapping_add(self.rng.below(step as u64) as u32);
                put(out, &mut pos, &x.to_le_bytes());
            }
        } else {
            let mut phase = self.rng.f64() * std::f64::consts::TAU;
            let freq = 0.001 + self.rng.f64() * 0.05;
            let amp = 200.0 + self.rng.f64() * 8000.0;
            while pos < out.len() {
                let r = self.rng.next_u64();
                for k in 0..4 {
                    phase += freq;
                    let noise = ((r >> (16 * k)) & 0x3f) as f64 - 32.0;
                    let s = (amp * phase.sin() + noise) as i16;
                    put(out, &mut pos, &s.to_le_bytes());
                }
            }
        }
    }
}

/// Fills `buf` with the content of unit `id` of a content source: a
/// convenience for generators that address content by (seed, id).
pub fn fill_unit(seed: u64, id: u64, mix: Mix, buf: &mut [u8]) {
    ContentGen::new(super::rng::derive_seed(seed, &[id]), mix).fill(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(data: &[u8]) -> f64 {
        let c = zstd::bulk::compress(data, 3).unwrap();
        data.len() as f64 / c.len() as f64
    }

    #[test]
    fn deterministic() {
        let a = ContentGen::new(5, Mix::TYPICAL).bytes(100_000);
        let b = ContentGen::new(5, Mix::TYPICAL).bytes(100_000);
        let c = ContentGen::new(6, Mix::TYPICAL).bytes(100_000);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn typical_mix_compresses_about_2x() {
        // Several seeds, 4 MiB in 64 KiB buffers as the generators write it.
        for seed in [1u64, 2, 3] {
            let mut g = ContentGen::new(seed, Mix::TYPICAL);
            let mut data = Vec::new();
            g.write_to(&mut data, 4 << 20).unwrap();
            let r = ratio(&data);
            assert!((1.6..3.0).contains(&r), "seed {seed}: zstd-3 ratio {r:.2}");
        }
    }

    #[test]
    fn kinds_compress_as_expected() {
        let r = |m: Mix| ratio(&ContentGen::new(9, m).bytes(1 << 20));
        let (text, src, bin, media) = (r(Mix::TEXT), r(Mix::SOURCE), r(Mix::BINARY), r(Mix::MEDIA));
        assert!(text > 2.2, "text {text:.2}");
        assert!(src > 2.5, "source {src:.2}");
        assert!(bin > 1.3, "binary {bin:.2}");
        assert!(media < 1.1, "media {media:.2}");
    }

    #[test]
    fn text_looks_like_text() {
        let mut buf = vec![0u8; 20_000];
        ContentGen::new(1, Mix::TEXT).fill_text(&mut buf);
        assert!(buf.iter().all(|b| b.is_ascii()));
        let lines = buf.iter().filter(|&&b| b == b'\n').count();
        assert!(lines > 150, "{lines}");
        let s = String::from_utf8_lossy(&buf);
        assert!(s.contains(" the ") || s.contains("The "));
        let mut buf = vec![0u8; 20_000];
        ContentGen::new(1, Mix::SOURCE).fill_source(&mut buf);
        let s = String::from_utf8_lossy(&buf);
        assert!(s.contains(';') && s.contains('{') && s.contains('}'));
    }

    #[test]
    fn no_accidental_duplicate_blocks() {
        // 4 KiB blocks of different seeds / positions never coincide.
        let a = ContentGen::new(1, Mix::TYPICAL).bytes(1 << 20);
        let b = ContentGen::new(2, Mix::TYPICAL).bytes(1 << 20);
        let mut set = std::collections::HashSet::new();
        let mut dups = 0;
        for blk in a.chunks(4096).chain(b.chunks(4096)) {
            if blk.iter().any(|&x| x != 0) && !set.insert(blk.to_vec()) {
                dups += 1;
            }
        }
        assert_eq!(dups, 0);
    }

    #[test]
    fn file_kinds() {
        assert_eq!(FileKind::from_path(Path::new("a/b.c")), FileKind::Source);
        assert_eq!(FileKind::from_path(Path::new("x.PNG")), FileKind::Media);
        assert_eq!(FileKind::from_path(Path::new("README.txt")), FileKind::Text);
        assert_eq!(
            FileKind::from_path(Path::new("libfoo.so")),
            FileKind::Binary
        );
    }
}
