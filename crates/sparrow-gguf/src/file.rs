//! `GgufFile`: a GGUF file opened over a memory map. The weights are never copied: tensor
//! data is handed out as slices of the map, which the OS pages in on demand and may drop
//! under memory pressure (it is file-backed, so it does not count as anonymous heap).

use crate::error::{GgufError, Result};
use crate::parse::{parse, Parsed};
use crate::tensor::TensorInfo;
use crate::value::Metadata;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

enum Backing {
    /// The file mapped read-only: pages come from (and return to) the page cache.
    Mapped(Mmap),
    /// The file read into anonymous memory (`--no-mmap`), held in a map so it can be
    /// locked like the other.
    Read(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) | Backing::Read(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An open, fully validated GGUF file.
pub struct GgufFile {
    path: Option<PathBuf>,
    backing: Backing,
    parsed: Parsed,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Open and validate `path`. The header, metadata and tensor table are parsed and every
    /// tensor's extent is checked against the file size before this returns.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path, true)
    }

    /// Open and validate `path`, mapped (`mmap`, as [`GgufFile::open`]) or read whole into
    /// anonymous memory (llama.cpp's `--no-mmap`: the weights then count as the process's
    /// own memory, which the OS cannot drop and re-read; for file systems where mapping is
    /// slow or unavailable).
    pub fn open_with(path: impl AsRef<Path>, mmap: bool) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let backing = if mmap {
            // SAFETY: the map is read-only and private to this process. Like every
            // mmap-based reader we rely on the file not being truncated or rewritten while
            // it is open; all offsets were validated against the length seen at map time.
            Backing::Mapped(unsafe { Mmap::map(&file) }.map_err(io)?)
        } else {
            Backing::Read(read_anon(&file).map_err(io)?)
        };
        let mut f = Self::from_backing(backing)?;
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    /// Parse a GGUF image held in memory (tests, tools and small generated files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile> {
        let parsed = parse(backing.bytes())?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: None,
            backing,
            parsed,
            by_name,
        })
    }

    /// The path the file was opened from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.parsed.alignment
    }

    /// Byte offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// Key/value metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// The metadata, to take values out of (see [`Metadata::take`]).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.parsed.metadata
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.parsed.tensors[i])
    }

    /// A tensor by name, or an error naming the missing tensor.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor from this file's table (bounds were checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = info.offset as usize;
        &self.backing.bytes()[start..start + info.size as usize]
    }

    /// Tells the OS that the bytes in `range` (clamped to the file) will not be read again,
    /// so their pages leave this process's resident set: used after a tensor was copied
    /// elsewhere (e.g. repacked into RAM). Reading them later is still correct (the pages
    /// are faulted in again from the file), only slower. A no-op for in-memory images, and
    /// best effort (an OS refusal is ignored: nothing depends on the pages going).
    pub fn release(&self, range: std::ops::Range<usize>) {
        // Only file-backed pages come back after being dropped: never the read copy's.
        let Backing::Mapped(map) = &self.backing else {
            return;
        };
        let end = range.end.min(map.len());
        if range.start >= end {
            return;
        }
        #[cfg(unix)]
        {
            // SAFETY: MADV_DONTNEED on this private, read-only file mapping (never written:
            // PROT_READ) only drops pages; the next access reads the same bytes back from
            // the file, so every slice handed out keeps its contents (under the same
            // assumption as the map itself: the file is not modified while open).
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    end - range.start,
                )
            };
        }
    }

    /// The whole file image (for fingerprinting).
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Whether the image is a file mapping (its pages are the page cache's, which the OS
    /// can drop and read again), rather than memory of this process.
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }

    /// Locks the whole image in RAM (`mlock`, llama.cpp's `--mlock`): its pages are read
    /// in now and never dropped or swapped out while the file is open. An in-memory image
    /// (`from_bytes`) has nothing to lock. Fails when the OS refuses, typically because the
    /// image is larger than `RLIMIT_MEMLOCK` (`ulimit -l`).
    pub fn lock(&self) -> std::io::Result<()> {
        match &self.backing {
            Backing::Mapped(m) | Backing::Read(m) => m.lock(),
            Backing::Owned(_) => Ok(()),
        }
    }
}

/// The whole of `file` read into a fresh anonymous map, then made read-only.
fn read_anon(file: &File) -> std::io::Result<Mmap> {
    use std::io::Read;
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| std::io::Error::other("file larger than the address space"))?;
    if len == 0 {
        // (the OS refuses a zero-length anonymous map)
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is empty",
        ));
    }
    let mut map = memmap2::MmapOptions::new().len(len).map_anon()?;
    (&*file).read_exact(&mut map)?;
    map.make_read_only()
}
