//! A file of keys and values outside RAM, shared by the cold tiers: `regions` of `n_ctx`
//! rows each (a global layer's positions for the tiered store, a KV head's slots of an
//! arranged layer), keys of every region then values. It is created unnamed in a directory
//! (a crash leaves nothing behind) and sized once, sparse; rows are written with `pwrite`
//! (a full disk is an error naming the directory, never a fault on a mapped page) and read
//! in place from a read-only shared mapping, with advice to fetch or drop pages.

use super::types::{KvRows, KvType};
use memmap2::{Advice, Mmap, UncheckedAdvice};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Positioned writes to the cold file: a trait so tests can make a disk fill up or a write
/// come back short.
pub trait ColdWrite: Send + Sync {
    /// Write some of `buf` at `offset`; the bytes written (fewer than asked is allowed).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
}

impl ColdWrite for File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, offset)
    }
}

/// Stands in for a writer while it is being wrapped.
pub(super) struct NoWriter;

impl ColdWrite for NoWriter {
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<usize> {
        Err(io::Error::other("no writer"))
    }
}

impl ColdWrite for Box<dyn ColdWrite> {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        (**self).write_at(buf, offset)
    }
}

/// The file: keys of every region and row, then values.
pub(super) struct ColdFile {
    /// The file itself, for syncing and cache advice (writes go through `writer`).
    file: File,
    pub(super) writer: Box<dyn ColdWrite>,
    map: Mmap,
    dir: PathBuf,
    n_ctx: usize,
    pub(super) k_row: usize,
    pub(super) v_row: usize,
    /// Where the values start (after every global layer's keys, rounded to 64 bytes).
    v_base: usize,
}

impl ColdFile {
    pub(super) fn create(
        dir: &Path,
        n_global: usize,
        n_ctx: usize,
        k_row: usize,
        v_row: usize,
    ) -> Result<Self, String> {
        let size_err =
            || format!("a cold KV file for {n_global} layers × {n_ctx} positions is too large");
        let k_bytes = n_global
            .checked_mul(n_ctx)
            .and_then(|x| x.checked_mul(k_row))
            .ok_or_else(size_err)?;
        let v_base = k_bytes.checked_next_multiple_of(64).ok_or_else(size_err)?;
        let len = n_global
            .checked_mul(n_ctx)
            .and_then(|x| x.checked_mul(v_row))
            .and_then(|x| x.checked_add(v_base))
            .ok_or_else(size_err)?;
        let file = tempfile::tempfile_in(dir).map_err(|e| {
            format!(
                "cannot create the cold KV file in {}: {e} (set --kv-dir to a writable directory)",
                dir.display()
            )
        })?;
        file.set_len(len as u64).map_err(|e| {
            format!(
                "cannot size the cold KV file in {} to {len} bytes: {e}",
                dir.display()
            )
        })?;
        // SAFETY: the file was just created unnamed (or unlinked at once), so no other
        // process can reach it by name; it is sized once, above, and never truncated, so
        // every mapped page stays backed (holes read as zeros). Its owner writes it only
        // through `pwrite` from a store method taking `&mut self` (`TieredStore::flush`,
        // an arranged layer's segment sort): no slice borrowed from the map is alive while a
        // write changes the bytes under it.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| format!("cannot map the cold KV file in {}: {e}", dir.display()))?;
        // Reads are scattered (a sparse policy's blocks): a fault reads its own page, not
        // the kernel's read-around window; `prefetch` asks for exactly what a plan reads.
        let _ = map.advise(Advice::Random);
        let handle = file
            .try_clone()
            .map_err(|e| format!("cannot use the cold KV file in {}: {e}", dir.display()))?;
        Ok(ColdFile {
            file: handle,
            writer: Box::new(file),
            map,
            dir: dir.to_path_buf(),
            n_ctx,
            k_row,
            v_row,
            v_base,
        })
    }

    /// Write the file's dirty pages back, then drop its pages from this mapping and from
    /// the OS's page cache: the next read of a cold row goes to the disk.
    pub(super) fn drop_pages(&self) -> Result<(), String> {
        self.file
            .sync_data()
            .map_err(|e| format!("syncing the cold KV file in {}: {e}", self.dir.display()))?;
        // SAFETY: MADV_DONTNEED on a shared, read-only file mapping only unmaps its pages;
        // the next access faults the same bytes back in from the (synced) file, so no
        // borrowed slice ever sees other data.
        unsafe { self.map.unchecked_advise(UncheckedAdvice::DontNeed) }
            .map_err(|e| format!("dropping the cold KV file's pages: {e}"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on a file descriptor this struct owns; no memory is passed.
        let rc =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(format!(
                "dropping the cold KV file from the page cache: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    pub(super) fn k_at(&self, gl: usize, pos: usize) -> usize {
        (gl * self.n_ctx + pos) * self.k_row
    }

    pub(super) fn v_at(&self, gl: usize, pos: usize) -> usize {
        self.v_base + (gl * self.n_ctx + pos) * self.v_row
    }

    /// Write all of `buf` at `offset`, or say why not.
    pub(super) fn write(
        &self,
        buf: &[u8],
        offset: usize,
        what: impl Fn() -> String,
    ) -> Result<(), String> {
        let mut done = 0;
        while done < buf.len() {
            match self.writer.write_at(&buf[done..], (offset + done) as u64) {
                Ok(0) => {
                    return Err(format!(
                        "writing {} to the cold KV file in {}: the write stopped short ({done} of {} bytes)",
                        what(),
                        self.dir.display(),
                        buf.len()
                    ))
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(format!(
                        "writing {} to the cold KV file in {}: {e}",
                        what(),
                        self.dir.display()
                    ))
                }
            }
        }
        Ok(())
    }

    /// Ask the OS to start writing `bytes` back now, without waiting for it.
    ///
    /// Left alone, the kernel writes a dirty page back only when it is ~30 s old, so the
    /// pages a long prefill wrote are written back during the decode that follows, and
    /// the flusher's CPU time comes out of decode's (measured: 0.88× of RAM-only decode
    /// at depth 32K against 0.95× with writeback after 1 s). Starting writeback as each
    /// block is flushed moves that work next to the write that caused it.
    pub(super) fn start_writeback(&self, bytes: Range<usize>) {
        use std::os::fd::AsRawFd;
        if bytes.is_empty() {
            return;
        }
        // SAFETY: a plain syscall on a file descriptor this struct owns; no memory is
        // passed. SYNC_FILE_RANGE_WRITE only queues writeback and never waits for it.
        // A failure changes nothing but when the kernel writes the pages, so it is ignored.
        let _ = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                bytes.start as libc::off64_t,
                bytes.len() as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }

    pub(super) fn rows(&self, at: usize, n: usize, row: usize, ty: KvType) -> KvRows<'_> {
        rows_of(&self.map[at..at + n * row], ty)
    }

    /// Ask the OS to start reading `bytes` of the map (page-rounded) into the page cache.
    pub(super) fn will_need(&self, bytes: Range<usize>) {
        const PAGE: usize = 4096;
        let start = bytes.start / PAGE * PAGE;
        let end = bytes.end.min(self.map.len());
        if end > start {
            // A hint: failure changes nothing but speed.
            let _ = self.map.advise_range(Advice::WillNeed, start, end - start);
        }
    }
}

/// Raw little-endian row bytes as the kernel's typed rows.
pub(super) fn rows_of(bytes: &[u8], ty: KvType) -> KvRows<'_> {
    match ty {
        KvType::F16 => KvRows::F16(bytemuck::cast_slice(bytes)),
        KvType::F32 => KvRows::F32(bytemuck::cast_slice(bytes)),
        KvType::Q8_0 => KvRows::Q8_0(bytemuck::cast_slice(bytes)),
    }
}
