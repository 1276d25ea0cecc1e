//! Where the thread that drives a forward pass should run: on a thread of the rayon pool
//! the kernels use.
//!
//! Every product of a forward pass is a parallel loop on the current rayon pool. Started
//! from a thread *outside* the pool, each one is injected into the pool's queue and the
//! caller sleeps on a lock until it is done: a wake-up of a pool thread and of the caller
//! per product, a hundred products a token. Started from a thread *of* the pool, the work
//! goes on that thread's own queue and the caller takes part in it. Measured on a two-core
//! host (Zen 4, one-token passes with the whole head timed both ways, two alternated
//! pairs): the 0.5B model's 12.2–13.2 ms from outside against 10.9–11.6 ms on the pool,
//! the 1.5B model's 27.4–27.7 against 26.8–26.9 ms; `sparrow run`'s decode 1.085× (0.5B)
//! and 1.049× (1.5B) once its main thread joined the pool (docs/performance.md).

/// Runs `f` on a thread of the current rayon pool and returns what it returns: directly if
/// the calling thread is one, else on one of the pool's threads while the caller waits
/// (which keeps that pool thread for as long as `f` runs — for a generation loop, its
/// whole life).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match rayon::current_thread_index() {
        Some(_) => f(),
        None => rayon::scope(|_| f()),
    }
}

#[cfg(test)]
mod tests {
    use super::on_pool;

    #[test]
    fn work_from_outside_the_pool_runs_on_one_of_its_threads() {
        // A thread of its own (not the pool's): `on_pool` moves the work onto the global
        // pool.
        let outside = std::thread::spawn(|| {
            assert_eq!(rayon::current_thread_index(), None);
            on_pool(|| (rayon::current_thread_index(), 6 * 7))
        })
        .join()
        .unwrap();
        assert!(outside.0.is_some(), "ran outside the pool");
        assert_eq!(outside.1, 42);
        // From a pool thread it runs right there.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (there, here) = pool.install(|| {
            let here = rayon::current_thread_index();
            (on_pool(rayon::current_thread_index), here)
        });
        assert_eq!(there, here);
    }
}
