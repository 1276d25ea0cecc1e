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
//! so the counted work runs in a coroutine on the caller's thread ([`super::isolate`]): when
//! an allocation would take it past its cap, the allocator does not make it — it switches
//! back to the caller, which abandons the coroutine for good (its memory, at most the cap,
//! stays with it) and returns an error naming the limit. Threads that are not armed pay one
//! thread-local read per allocation.
//!
//! An abandoned render keeps whatever locks it holds. minijinja takes none that outlive a
//! render (its closures' and namespaces' mutexes belong to the render), the allocator
//! switches out before the system allocator takes its own, and a panicking render is never
//! stopped (the panic hook holds the process's backtrace lock), so nothing later waits on
//! an abandoned one.

use corosensei::Yielder;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;

/// The global allocator that lets a chat template's render be capped in memory: the system
/// allocator plus a per-thread count while a render is armed. A binary installs it with
/// `#[global_allocator] static A: sparrow::chat::TemplateAllocator = sparrow::chat::TemplateAllocator;`;
/// without it, renders run uncapped in memory (the other limits still hold).
pub struct TemplateAllocator;

thread_local! {
    /// Whether this thread's allocations are counted: the one test an unarmed thread pays.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated net of frees since arming (negative when the thread frees what it
    /// did not allocate).
    static USED: Cell<isize> = const { Cell::new(0) };
    /// The cap on [`USED`].
    static CAP: Cell<isize> = const { Cell::new(0) };
    /// How to leave the work when the cap would be passed: the coroutine it runs in.
    static STOP: Cell<*const Yielder<(), ()>> = const { Cell::new(std::ptr::null()) };
}

/// Run `work` with this thread's allocations counted: past `cap` bytes of net growth the
/// allocation that would pass it is never made — `stop` (the coroutine `work` runs in) is
/// suspended inside it, for its caller to abandon. `None` when `work` panicked.
pub fn armed_while<T>(cap: usize, stop: &Yielder<(), ()>, work: impl FnOnce() -> T) -> Option<T> {
    arm(cap, stop);
    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).ok();
    disarm();
    value
}

/// Count this thread's allocations from now on, against `cap`; `stop` is read only while
/// the thread stays armed, which [`armed_while`] ends before `stop` can go.
fn arm(cap: usize, stop: *const Yielder<(), ()>) {
    USED.set(0);
    CAP.set(isize::try_from(cap).unwrap_or(isize::MAX));
    STOP.set(stop);
    ARMED.set(true);
}

/// Stop counting this thread's allocations.
fn disarm() {
    let _ = ARMED.try_with(|a| a.set(false));
}

/// Whether [`TemplateAllocator`] is this process's global allocator (probed once, by
/// arming the calling thread around one small allocation).
pub fn installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // No way to stop: the cap cannot be reached.
        arm(usize::MAX >> 1, std::ptr::null());
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

/// The allocation that would pass the cap is never made: the work's coroutine is suspended
/// here and never resumed. Nothing here allocates (the thread is disarmed first, in case
/// something did).
#[cold]
#[inline(never)]
fn over_cap() -> ! {
    ARMED.set(false);
    let stop = STOP.get();
    if stop.is_null() {
        // Only the probe in `installed` arms without a way to stop, with a cap it cannot reach.
        std::process::abort();
    }
    loop {
        // SAFETY: `stop` was set by `arm` from the live coroutine's yielder, which outlives
        // the armed span (`armed_while` disarms before its coroutine returns), and this
        // thread was armed until the line above.
        unsafe { (*stop).suspend(()) };
    }
}

// SAFETY: every call is passed to `System` unchanged; the accounting only reads and writes
// a thread-local cell (and, past the cap, leaves the work's coroutine without returning).
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
