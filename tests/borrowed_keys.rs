//! Loading calls take the key by any borrowed form (`&str` for `String` keys), so a hit
//! through them allocates nothing; the key is made owned only when a load starts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;

/// Counts this thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the count is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

#[test]
fn a_hit_through_get_or_load_by_str_allocates_nothing() {
    let cache = common::bounded(100);
    let v = cache.get_or_load("key", |k: &String| Ok::<_, ()>(k.len() as u64));
    assert_eq!(v, Ok(3), "the miss loads, with the owned key");
    // Warm the thread's per-cache state first: its first use registers the thread.
    let _ = cache.get("key");
    let (v, n) = allocations_in(|| cache.get_or_load("key", |_| Err::<u64, ()>(())));
    assert_eq!(v, Ok(3));
    assert_eq!(n, 0, "a hit allocated {n} times");
    let (v, n) = allocations_in(|| {
        cache.get_or_load_timeout("key", std::time::Duration::from_secs(1), |_| {
            Err::<u64, ()>(())
        })
    });
    assert_eq!(v, Ok(3));
    assert_eq!(n, 0, "a hit allocated {n} times");
}

#[test]
fn a_hit_through_get_or_load_async_by_str_allocates_nothing() {
    let cache = common::bounded(100);
    let load = |k: &String| {
        let n = k.len() as u64;
        async move { Ok::<_, ()>(n) }
    };
    assert_eq!(
        common::poll_until_ready(cache.get_or_load_async("key", load)),
        Ok(3)
    );
    let _ = cache.get("key");
    let (v, n) = allocations_in(|| common::poll_until_ready(cache.get_or_load_async("key", load)));
    assert_eq!(v, Ok(3));
    assert_eq!(n, 0, "a hit allocated {n} times");
}

#[test]
fn an_owned_key_still_works_and_the_loader_sees_the_owned_form() {
    let cache = common::bounded(100);
    let key = String::from("abc");
    let v = cache.get_or_load(&key, |k: &String| Ok::<_, ()>(k.len() as u64));
    assert_eq!(v, Ok(3));
    assert_eq!(cache.get("abc"), Some(3));
}
