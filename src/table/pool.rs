//! Node memory recycled per thread.
//!
//! Under churn every write at capacity allocates a node and, once the readers that could
//! have seen it have unpinned, frees the victim's. Through the allocator each of those costs
//! a `malloc` and a `free`, and the collector frees its nodes in batches that overflow
//! glibc's per-thread cache into its fast bins, which the next large allocation (the
//! collector's own bags, a table migration) consolidates, touching every freed chunk again. So a thread keeps the node blocks its
//! collector frees, up to [`KEEP`] per layout, and its next writes take them back: a push and
//! a pop on a thread-local stack instead of an allocator round trip.
//!
//! A block is allocated and freed with the global allocator and the node's own `Layout`,
//! exactly as a `Box` of the node would be, so pooled and boxed nodes mix freely: a block
//! taken from the pool may be freed as a `Box` (crossbeam's `Owned` does that with an unused
//! node) and a boxed node's memory may join the pool. Blocks of at most [`CLASSES`] layouts
//! are kept per thread (one per node type in use); others go straight back to the allocator.
//! A thread's blocks are freed when it exits (where the platform runs thread-local
//! destructors; std documents that the main thread's may not run). Blocks stay pooled after
//! the caches that used them are dropped: at most `KEEP` × `CLASSES` blocks per thread.
//! Under loom, nodes are plain boxes.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Blocks kept per layout and thread: what one collection frees at most (crossbeam collects
/// every 128 pins, up to 8 bags of 64 deferred frees); 512 nodes of 64 bytes are 32 KiB.
#[cfg_attr(herdcache_loom, allow(dead_code))]
const KEEP: usize = 512;

/// Node layouts kept per thread.
#[cfg_attr(herdcache_loom, allow(dead_code))]
const CLASSES: usize = 4;

/// A free block of `Layout`, taken from this thread's pool, or `None` if it has none.
#[cfg(not(herdcache_loom))]
#[inline]
pub(super) fn take(layout: Layout) -> Option<NonNull<u8>> {
    imp::POOL
        .try_with(|pool| pool.try_borrow_mut().ok()?.take(layout))
        .ok()
        .flatten()
}

/// Keeps `block` (of `layout`, allocated by the global allocator, its contents dropped) in
/// this thread's pool; `false` if the pool is full or gone, and the caller frees it.
#[cfg(not(herdcache_loom))]
#[inline]
pub(super) fn give(block: NonNull<u8>, layout: Layout) -> bool {
    imp::POOL
        .try_with(|pool| {
            pool.try_borrow_mut()
                .is_ok_and(|mut pool| pool.give(block, layout))
        })
        .unwrap_or(false)
}

#[cfg(herdcache_loom)]
pub(super) fn take(_: Layout) -> Option<NonNull<u8>> {
    None
}

#[cfg(herdcache_loom)]
pub(super) fn give(_: NonNull<u8>, _: Layout) -> bool {
    false
}

#[cfg(not(herdcache_loom))]
mod imp {
    use std::alloc::{dealloc, Layout};
    use std::cell::RefCell;
    use std::ptr::NonNull;

    use super::{CLASSES, KEEP};

    std::thread_local! {
        pub(super) static POOL: RefCell<Pool> = const { RefCell::new(Pool { classes: Vec::new() }) };
    }

    /// One thread's free blocks, by layout.
    pub(super) struct Pool {
        classes: Vec<(Layout, Vec<NonNull<u8>>)>,
    }

    impl Pool {
        #[inline]
        pub(super) fn take(&mut self, layout: Layout) -> Option<NonNull<u8>> {
            self.classes
                .iter_mut()
                .find(|(l, _)| *l == layout)
                .and_then(|(_, blocks)| blocks.pop())
        }

        #[inline]
        pub(super) fn give(&mut self, block: NonNull<u8>, layout: Layout) -> bool {
            let class = match self.classes.iter().position(|(l, _)| *l == layout) {
                Some(i) => i,
                None if self.classes.len() < CLASSES => {
                    let mut blocks = Vec::new();
                    if blocks.try_reserve_exact(KEEP).is_err() {
                        return false;
                    }
                    self.classes.push((layout, blocks));
                    self.classes.len() - 1
                }
                None => return false,
            };
            let blocks = &mut self.classes[class].1;
            if blocks.len() == KEEP {
                return false;
            }
            // No reallocation: `KEEP` was reserved when the class was added.
            blocks.push(block);
            true
        }
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            for (layout, blocks) in self.classes.drain(..) {
                for block in blocks {
                    // SAFETY: every pooled block was allocated by the global allocator with
                    // `layout` (see `give`'s contract) and is owned by the pool alone.
                    unsafe { dealloc(block.as_ptr(), layout) };
                }
            }
        }
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use std::alloc::{alloc, dealloc, Layout};

    use super::*;

    /// Runs `f` on a thread of its own, whose pool nothing else has used.
    fn on_fresh_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().expect("the test's thread");
    }

    #[test]
    fn a_given_block_is_taken_back_by_its_layout_only() {
        on_fresh_thread(given_block_is_taken_back_by_its_layout_only);
    }

    fn given_block_is_taken_back_by_its_layout_only() {
        let layout = Layout::new::<[u64; 9]>();
        let other = Layout::new::<[u64; 3]>();
        // SAFETY: a non-zero size.
        let block = NonNull::new(unsafe { alloc(layout) }).expect("allocated");
        assert!(give(block, layout), "an empty pool keeps a block");
        assert_eq!(
            take(other),
            None,
            "a block is never handed out for another layout"
        );
        assert_eq!(take(layout), Some(block));
        assert_eq!(take(layout), None, "each block is handed out once");
        // SAFETY: allocated above with `layout`, and no longer pooled.
        unsafe { dealloc(block.as_ptr(), layout) };
    }

    #[test]
    fn a_released_node_lends_its_memory_to_the_next_one_and_drops_its_contents_once() {
        on_fresh_thread(released_node_lends_its_memory_to_the_next_one);
    }

    fn released_node_lends_its_memory_to_the_next_one() {
        use std::sync::Arc;

        use super::super::Node;

        let value = Arc::new(7u64);
        let first = Node::owned(1, 10u64, Arc::clone(&value)).into_box();
        let raw = Box::into_raw(first);
        // SAFETY: a `Box` of the node, ours alone, released once.
        unsafe { Node::release(raw) };
        assert_eq!(
            Arc::strong_count(&value),
            1,
            "the released node dropped its value"
        );
        let second = Node::owned(2, 20u64, Arc::clone(&value)).into_box();
        assert_eq!(&*second as *const Node<u64, Arc<u64>>, raw.cast_const());
        assert_eq!((second.hash, second.key, *second.value), (2, 20, 7));
        drop(second);
        assert_eq!(Arc::strong_count(&value), 1, "a pooled node frees as a box");
    }

    #[test]
    fn a_node_whose_drop_panics_with_a_panicking_payload_still_gives_back_its_memory() {
        on_fresh_thread(node_with_panicking_payload_gives_back_its_memory);
    }

    fn node_with_panicking_payload_gives_back_its_memory() {
        use std::panic::{catch_unwind, panic_any, AssertUnwindSafe};

        use super::super::Node;

        struct Payload;
        impl Drop for Payload {
            fn drop(&mut self) {
                panic!("the payload's own drop panics");
            }
        }
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic_any(Payload);
            }
        }
        let raw = Box::into_raw(Node::owned(1, 1u64, Bomb).into_box());
        // SAFETY: a `Box` of the node, ours alone, released once.
        let escaped = catch_unwind(AssertUnwindSafe(|| unsafe { Node::release(raw) }));
        assert!(escaped.is_err(), "the payload's panic leaves `release`");
        let layout = Layout::new::<Node<u64, Bomb>>();
        let block = take(layout).expect("the node's memory was pooled all the same");
        assert_eq!(block.as_ptr(), raw.cast::<u8>());
        // SAFETY: a block of `layout`, no longer pooled.
        unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
    }

    #[test]
    fn a_full_pool_hands_the_block_back_to_the_caller() {
        on_fresh_thread(full_pool_hands_the_block_back_to_the_caller);
    }

    fn full_pool_hands_the_block_back_to_the_caller() {
        let layout = Layout::new::<[u64; 5]>();
        let mut kept = Vec::new();
        loop {
            // SAFETY: a non-zero size.
            let block = NonNull::new(unsafe { alloc(layout) }).expect("allocated");
            if !give(block, layout) {
                // SAFETY: refused, so still ours.
                unsafe { dealloc(block.as_ptr(), layout) };
                break;
            }
            kept.push(block);
            assert!(kept.len() <= KEEP, "the pool keeps at most {KEEP} blocks");
        }
        assert_eq!(kept.len(), KEEP);
        while let Some(block) = take(layout) {
            assert!(kept.contains(&block));
            // SAFETY: allocated above with `layout`, and no longer pooled.
            unsafe { dealloc(block.as_ptr(), layout) };
        }
    }
}
