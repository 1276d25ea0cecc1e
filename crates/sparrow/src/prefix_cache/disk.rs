//! The prefix cache's disk tier: one file per block in `--cache-dir`, bound to the model
//! and the cache's settings, checksummed, within a byte budget, found again after a
//! restart.
//!
//! A block file (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SPRWPFX\n` |
//! | 4 | format version ([`VERSION`]) |
//! | 32 | the cache's root: SHA-256 of the model fingerprint, KV types, block size and the prefill attention (see `PrefixCache::root`) |
//! | 32 | the block's key (its chain hash) |
//! | 4 + 4 + 4 | block index, positions per block, layers |
//! | 4 | KV width |
//! | 1 + 1 + 2 | key and value type codes (as prompt cache files), 2 zero bytes |
//! | layers | 1 when the layer's rows follow, else 0 |
//! | … | the present layers' keys then values, raw |
//! | 32 | SHA-256 of everything above |
//!
//! The name is the key in hex. A scan reads headers only; the checksum is checked when a
//! block is read for use, and a file that fails it is removed with a warning.

use super::block::{Block, BlockKey, BlockShape, Rows};
use crate::kv::KvType;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// File magic.
pub const MAGIC: &[u8; 8] = b"SPRWPFX\n";
/// Format version written and read.
pub const VERSION: u32 = 1;
const FIXED: usize = 8 + 4 + 32 + 32 + 4 + 4 + 4 + 4 + 4;
const EXTENSION: &str = "sprb";
/// Extension of a block being written (after the writer's process id).
const TMP: &str = "tmp";
/// A file being written that is older than this was left by a process that died.
const STALE: std::time::Duration = std::time::Duration::from_secs(3600);

fn type_code(t: KvType) -> u8 {
    match t {
        KvType::F16 => 0,
        KvType::F32 => 1,
        KvType::Q8_0 => 2,
    }
}

fn hex(key: &BlockKey) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A block file on disk.
#[derive(Clone, Debug)]
struct Entry {
    bytes: u64,
    /// Last use (the scheduler's clock; files found at start are ordered by mtime).
    used: u64,
}

/// The file format of one cache's blocks: its root and block shape, which every file's
/// header repeats.
#[derive(Clone, Debug)]
pub struct BlockFormat {
    pub root: BlockKey,
    pub shape: BlockShape,
}

impl BlockFormat {
    /// The bytes a file of a block holding `present` layers takes.
    fn file_bytes(&self, present: usize) -> u64 {
        (FIXED + self.shape.n_layer + present * self.shape.layer_bytes() + 32) as u64
    }

    /// The header of block `index` named `key` holding the `present` layers.
    fn header(&self, key: &BlockKey, index: usize, present: &[bool]) -> Vec<u8> {
        let s = &self.shape;
        let mut h = Vec::with_capacity(FIXED + s.n_layer);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&self.root);
        h.extend_from_slice(key);
        for v in [index, s.block, s.n_layer, s.kv_dim] {
            h.extend_from_slice(&(v as u32).to_le_bytes());
        }
        h.extend_from_slice(&[type_code(s.types.k), type_code(s.types.v), 0, 0]);
        h.extend(present.iter().map(|&p| p as u8));
        h
    }

    /// Write the file of block `index` named `key` to `out`: header, rows, checksum.
    pub fn write(
        &self,
        key: &BlockKey,
        index: usize,
        block: &Block,
        out: &mut impl Write,
    ) -> std::io::Result<()> {
        let header = self.header(key, index, &block.present);
        let mut hash = Sha256::new();
        hash.update(&header);
        hash.update(&block.data[..]);
        out.write_all(&header)?;
        out.write_all(&block.data)?;
        out.write_all(&hash.finalize())
    }

    /// The block in a file's `bytes`, if they are a whole, intact block `key` of this
    /// cache; else what is wrong.
    pub fn read(&self, key: &BlockKey, mut bytes: Vec<u8>) -> Result<Block, String> {
        let (present, rows) = self.check(key, &bytes)?;
        // The rows in place: the file's bytes without header and checksum.
        bytes.truncate(rows.end);
        bytes.drain(..rows.start);
        Ok(Block {
            present,
            data: Rows::Owned(bytes),
        })
    }

    /// [`BlockFormat::read`] over a mapping of the file: the block's rows stay in the map.
    pub fn read_mapped(&self, key: &BlockKey, map: memmap2::Mmap) -> Result<Block, String> {
        let (present, at) = self.check(key, &map)?;
        Ok(Block {
            present,
            data: Rows::Mapped { map, at },
        })
    }

    /// The layers a file's `bytes` hold and where their rows are, if the bytes are a whole,
    /// intact block `key` of this cache.
    fn check(&self, key: &BlockKey, bytes: &[u8]) -> Result<(Vec<bool>, Range<usize>), String> {
        let n_layer = self.shape.n_layer;
        if bytes.len() < FIXED + n_layer + 32 {
            return Err("truncated".into());
        }
        let body = bytes.len() - 32;
        let sum: [u8; 32] = Sha256::digest(&bytes[..body]).into();
        if sum[..] != bytes[body..] {
            return Err("checksum mismatch (corrupted)".into());
        }
        let present: Vec<bool> = bytes[FIXED..FIXED + n_layer]
            .iter()
            .map(|&p| p == 1)
            .collect();
        let index = u32_at(bytes, 76) as usize;
        let expect = self.header(key, index, &present);
        if bytes[..FIXED + n_layer] != expect[..] {
            return Err("its header does not match this cache".into());
        }
        if bytes.len() as u64 != self.file_bytes(present.iter().filter(|&&p| p).count()) {
            return Err("wrong size".into());
        }
        Ok((present, FIXED + n_layer..body))
    }
}

/// The files of one cache in a directory, and the budget they keep to.
pub struct DiskTier {
    dir: PathBuf,
    format: BlockFormat,
    budget: u64,
    entries: HashMap<BlockKey, Entry>,
    used_bytes: u64,
}

/// What a scan of the directory found besides this cache's blocks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// This cache's blocks, indexed.
    pub blocks: usize,
    /// Block files of another model or other settings (left alone).
    pub foreign: usize,
    /// This cache's files that cannot be right (wrong size, unreadable header): removed.
    pub removed: usize,
    /// Blocks removed to bring the directory within the budget.
    pub evicted: usize,
}

impl DiskTier {
    /// Open (creating it if needed) `dir` for blocks of `shape` under `root`, at most
    /// `budget` bytes of them, and index the blocks already there.
    pub fn open(
        dir: &Path,
        root: BlockKey,
        shape: BlockShape,
        budget: u64,
    ) -> Result<(DiskTier, ScanReport), String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the cache directory {}: {e}", dir.display()))?;
        let mut tier = DiskTier {
            dir: dir.to_path_buf(),
            format: BlockFormat { root, shape },
            budget,
            entries: HashMap::new(),
            used_bytes: 0,
        };
        let mut report = ScanReport::default();
        let listing = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read the cache directory {}: {e}", dir.display()))?;
        let mut found = Vec::new();
        for item in listing.flatten() {
            let path = item.path();
            let extension = path.extension().and_then(|e| e.to_str());
            if extension == Some(TMP) {
                let age = item
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok());
                if age.is_some_and(|a| a > STALE) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if extension != Some(EXTENSION) {
                continue;
            }
            match tier.scan_one(&path) {
                Scanned::Ours(key, bytes, mtime) => found.push((mtime, key, bytes)),
                Scanned::Foreign => report.foreign += 1,
                Scanned::Broken => {
                    let _ = std::fs::remove_file(&path);
                    report.removed += 1;
                }
            }
        }
        // Oldest first: their order of use is their clock.
        found.sort();
        for (i, (_, key, bytes)) in found.into_iter().enumerate() {
            tier.entries.insert(
                key,
                Entry {
                    bytes,
                    used: i as u64,
                },
            );
            tier.used_bytes += bytes;
        }
        report.blocks = tier.entries.len();
        report.evicted = tier.make_room(0);
        report.blocks -= report.evicted;
        Ok((tier, report))
    }

    fn path(&self, key: &BlockKey) -> PathBuf {
        self.dir.join(format!("{}.{EXTENSION}", hex(key)))
    }

    fn scan_one(&self, path: &Path) -> Scanned {
        let Ok(mut file) = std::fs::File::open(path) else {
            return Scanned::Foreign;
        };
        let mut head = vec![0u8; FIXED];
        if file.read_exact(&mut head).is_err() {
            // Too short to say whose it is; a name of ours could be a crash's leftover.
            return Scanned::Foreign;
        }
        let format = &self.format;
        if &head[..8] != MAGIC || u32_at(&head, 8) != VERSION || head[12..44] != format.root {
            return Scanned::Foreign;
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(&head[44..76]);
        let expect = format.header(&key, u32_at(&head, 76) as usize, &[]);
        let mut present = vec![0u8; format.shape.n_layer];
        let (Ok(meta), Ok(())) = (file.metadata(), file.read_exact(&mut present)) else {
            return Scanned::Broken;
        };
        let n_present = present.iter().filter(|&&p| p == 1).count();
        let sane = head[..FIXED] == expect[..FIXED]
            && present.iter().all(|&p| p <= 1)
            && meta.len() == format.file_bytes(n_present)
            && path.file_stem().and_then(|s| s.to_str()) == Some(hex(&key).as_str());
        if !sane {
            return Scanned::Broken;
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        Scanned::Ours(key, meta.len(), mtime)
    }

    /// Whether the tier has block `key`.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Bytes of blocks on disk.
    pub fn bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Blocks on disk.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no block is on disk.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Write block `index` (named `key`) unless it is there already or cannot fit the
    /// budget; older blocks are removed to make room. Last used at `now`.
    pub fn put(&mut self, key: &BlockKey, index: usize, block: &Block, now: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            e.used = now;
            return;
        }
        let present = block.present.iter().filter(|&&p| p).count();
        let bytes = self.format.file_bytes(present);
        if bytes > self.budget {
            return;
        }
        self.make_room(bytes);
        let path = self.path(key);
        // Named for this process: two servers sharing the directory never write one file.
        let tmp = path.with_extension(format!("{}.{TMP}", std::process::id()));
        let written = (|| -> std::io::Result<()> {
            let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            self.format.write(key, index, block, &mut out)?;
            out.into_inner().map_err(|e| e.into_error())?.sync_data()?;
            std::fs::rename(&tmp, &path)
        })();
        match written {
            Ok(()) => {
                self.entries.insert(*key, Entry { bytes, used: now });
                self.used_bytes += bytes;
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                eprintln!(
                    "warning: prefix cache: cannot write {}: {e} (the block stays in RAM only)",
                    path.display()
                );
            }
        }
    }

    /// Read block `key`, checking everything: a file that fails is removed (with a
    /// warning) and `None` returned, so the block is recomputed.
    pub fn get(&mut self, key: &BlockKey, now: u64) -> Option<Block> {
        self.entries.get(key)?;
        let path = self.path(key);
        let block = std::fs::File::open(&path)
            .and_then(|file| {
                // SAFETY: a read-only private mapping of a file this cache wrote; its bytes
                // are checked (size, checksum) before use. Another process truncating the
                // file while it is mapped would fault reads past the new end — the same
                // contract as the model's mapping and prompt cache files.
                unsafe { memmap2::Mmap::map(&file) }
            })
            .map_err(|e| e.to_string())
            .and_then(|map| self.format.read_mapped(key, map));
        match block {
            Ok(b) => {
                if let Some(e) = self.entries.get_mut(key) {
                    e.used = now;
                }
                Some(b)
            }
            Err(why) => {
                eprintln!(
                    "warning: prefix cache: ignoring {}: {why}; it is removed and the block recomputed",
                    path.display()
                );
                self.remove(key);
                None
            }
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(e) = self.entries.remove(key) {
            self.used_bytes -= e.bytes;
            let _ = std::fs::remove_file(self.path(key));
        }
    }

    /// Remove least recently used blocks until `incoming` more bytes fit the budget;
    /// returns how many were removed.
    fn make_room(&mut self, incoming: u64) -> usize {
        let mut removed = 0;
        while self.used_bytes + incoming > self.budget {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.remove(&oldest);
            removed += 1;
        }
        removed
    }

    /// Record that block `key` was used at `now` (its file's time too, so the order of
    /// use survives a restart).
    pub fn touch(&mut self, key: &BlockKey, now: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            e.used = now;
            if let Ok(f) = std::fs::File::options().write(true).open(self.path(key)) {
                let _ = f.set_modified(SystemTime::now());
            }
        }
    }
}

enum Scanned {
    Ours(BlockKey, u64, SystemTime),
    Foreign,
    Broken,
}
