//! A cap on one thread's heap growth, kept by the global allocator: how a chat template's
//! render is bounded in memory whatever the template does.
//!
//! Why an allocator and not checks on the template's values: minijinja has no hook on its
//! operators (`~`, `+`, `*`), on captured blocks (`{% set x %}…{% endset %}`, macro
//! output) or on the raw text a loop emits into them, so a check on values can only cover
//! the filters and functions a template happens to call — and a template can double a
//! string thirty times in straight-line code without calling any. Every one of those
//! grows the heap, so counting the heap catches all of them with one rule.
//!
//! An allocator cannot hand an error back to minijinja (a null return aborts the process),
//! so the counted thread is a worker of its own ([`super::isolate`]): when an allocation
//! would take it past its cap, the allocator does not make it — it tells the waiting caller
//! and stops the worker for good (it sleeps; its memory, at most the cap, stays with it).
//! The caller returns an error naming the limit. Threads that are not armed pay one
//! thread-local read per allocation.
//!
//! A worker stopped inside an allocation keeps whatever locks it holds. minijinja takes
//! none that outlive a render (its closures' and namespaces' mutexes belong to the
//! render), and a panicking thread is never stopped (the panic hook holds the process's
//! backtrace lock), so no other thread waits on a stopped one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The global allocator that lets a chat template's render be capped in memory: the system
/// allocator plus a per-thread count while a render is armed. A binary installs it with
/// `#[global_allocator] static A: sparrow::chat::TemplateAllocator = sparrow::chat::TemplateAllocator;`;
/// without it, renders run uncapped in memory (the other limits still hold).
pub struct TemplateAllocator;

/// How a capped run ended, as its [`Signal`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Still running.
    Running,
    /// The work returned (or panicked); its result is wherever it put it.
    Finished,
    /// An allocation would have passed the cap: the worker is stopped for good.
    OverCap,
}

/// Where a capped worker says how it ended; the caller waits on it. Signalling takes a
/// mutex and a condition variable, neither of which allocates, so the allocator can do it.
pub struct Signal {
    ending: Mutex<Ending>,
    changed: Condvar,
}

impl Signal {
    /// A signal saying [`Ending::Running`].
    pub fn new() -> Self {
        Signal {
            ending: Mutex::new(Ending::Running),
            changed: Condvar::new(),
        }
    }

    /// Report `ending`.
    pub fn set(&self, ending: Ending) {
        let mut e = self.ending.lock().unwrap_or_else(|p| p.into_inner());
        *e = ending;
        self.changed.notify_all();
    }

    /// Wait until the run has ended, and say how.
    pub fn wait(&self) -> Ending {
        let e = self.ending.lock().unwrap_or_else(|p| p.into_inner());
        let e = self
            .changed
            .wait_while(e, |e| *e == Ending::Running)
            .unwrap_or_else(|p| p.into_inner());
        *e
    }
}

impl Default for Signal {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// Whether this thread's allocations are counted: the one test an unarmed thread pays.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated net of frees since arming (negative when the thread frees what it
    /// did not allocate).
    static USED: Cell<isize> = const { Cell::new(0) };
    /// The cap on [`USED`].
    static CAP: Cell<isize> = const { Cell::new(0) };
    /// Whom to tell when the cap would be passed.
    static SIGNAL: Cell<*const Signal> = const { Cell::new(std::ptr::null()) };
}

/// Count this thread's allocations from now on; past `cap` bytes of net growth the thread
/// reports [`Ending::OverCap`] on `signal` and stops for ever, inside the allocation.
///
/// # Safety
/// `signal` must outlive the thread, or [`disarm`] must be called before it is dropped.
pub unsafe fn arm(cap: usize, signal: *const Signal) {
    USED.set(0);
    CAP.set(isize::try_from(cap).unwrap_or(isize::MAX));
    SIGNAL.set(signal);
    ARMED.set(true);
}

/// Stop counting this thread's allocations.
pub fn disarm() {
    let _ = ARMED.try_with(|a| a.set(false));
}

/// Whether [`TemplateAllocator`] is this process's global allocator (probed once, by
/// arming the calling thread around one small allocation).
pub fn installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let signal = Signal::new();
        // SAFETY: disarmed below, before `signal` is dropped.
        unsafe { arm(usize::MAX >> 1, &signal) };
        let probe = std::hint::black_box(vec![0u8; 64]);
        let counted = USED.get();
        disarm();
        drop(probe);
        counted >= 64
    })
}

/// Whether this thread is armed (false while its thread-locals are being torn down).
#[inline]
fn armed() -> bool {
    ARMED.try_with(Cell::get).unwrap_or(false)
}

/// Charge `bytes` to an armed thread; never returns when they would pass its cap.
#[inline]
fn charge(bytes: usize) {
    if !armed() {
        return;
    }
    let used = USED
        .get()
        .saturating_add(isize::try_from(bytes).unwrap_or(isize::MAX));
    // A panicking thread is let through: the panic hook allocates (a backtrace) while
    // holding the process's backtrace and output locks, and a thread stopped there would
    // hold them for ever.
    if used > CAP.get() && !std::thread::panicking() {
        over_cap();
    }
    USED.set(used);
}

/// Give `bytes` back to an armed thread's account.
#[inline]
fn refund(bytes: usize) {
    if armed() {
        USED.set(
            USED.get()
                .saturating_sub(isize::try_from(bytes).unwrap_or(isize::MAX)),
        );
    }
}

/// The allocation that would pass the cap is never made: report it, then sleep for ever.
/// Nothing here allocates (the thread is disarmed first, in case something did).
#[cold]
#[inline(never)]
fn over_cap() -> ! {
    ARMED.set(false);
    // SAFETY: `arm`'s contract keeps the signal alive while the thread is armed.
    unsafe { (*SIGNAL.get()).set(Ending::OverCap) };
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

// SAFETY: every call is passed to `System` unchanged; the accounting only reads and writes
// a thread-local cell (and, past the cap, blocks the thread without returning).
unsafe impl GlobalAlloc for TemplateAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        System.alloc(layout)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        System.alloc_zeroed(layout)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        refund(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            refund(layout.size() - new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}
