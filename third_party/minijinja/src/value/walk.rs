//! Bounds on the engine's walks over nested values (a qkv patch, see
//! `QKV-PATCH.md` at the root of this crate).
//!
//! Formatting, comparing and hashing a value walk it recursively and cannot
//! return an error.  Two kinds of value make such a walk unbounded although
//! they cost little fuel to build: a list shared by reference (`[x, x]`
//! nested forty times stands for 2^40 items in forty lists), and a list
//! nested hundreds of thousands of levels deep (deeper than any stack).
//!
//! While an evaluation with fuel runs on this thread, these walks charge the
//! items they visit to its fuel and refuse to go deeper than [`MAX_DEPTH`].
//! When either bound is hit the walk stops with a partial result and the
//! fuel is used up, so that the evaluation fails with
//! [`ErrorKind::OutOfFuel`](crate::ErrorKind::OutOfFuel) at its next check
//! and the partial result is never seen.  Without fuel nothing is bounded,
//! as before.
use std::cell::Cell;

/// How deep a walk may go: Python's default recursion limit.
pub(crate) const MAX_DEPTH: usize = 1000;

std::thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// One level of a walk on this thread, left when dropped.
pub(crate) struct Level {
    depth: usize,
}

impl Level {
    /// Enters one level deeper (charging [`LEVEL_UNITS`]), or gives `None`
    /// (and uses up the fuel) past [`MAX_DEPTH`] levels or when the fuel is
    /// gone.
    pub(crate) fn enter() -> Option<Level> {
        let depth = DEPTH.with(|d| d.replace(d.get() + 1)) + 1;
        let level = Level { depth };
        if depth > MAX_DEPTH && has_fuel() {
            give_up();
            return None;
        }
        if !charge(LEVEL_UNITS) {
            return None;
        }
        Some(level)
    }

    /// How many levels deep this one is (1 for the outermost).
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Charges `units` of fuel for visiting an item; `false` once the fuel is
/// gone (always `true` without fuel).
#[inline]
pub(crate) fn charge(units: u64) -> bool {
    #[cfg(feature = "fuel")]
    {
        crate::vm::fuel::charge_current(units)
    }
    #[cfg(not(feature = "fuel"))]
    {
        let _ = units;
        true
    }
}

/// Is an evaluation with fuel running on this thread?
fn has_fuel() -> bool {
    #[cfg(feature = "fuel")]
    {
        crate::vm::fuel::has_current()
    }
    #[cfg(not(feature = "fuel"))]
    {
        false
    }
}

/// Uses up the fuel of the evaluation running on this thread.
fn give_up() {
    charge(u64::MAX);
}

/// The fuel units a walk charges per item visited.
pub(crate) const ITEM_UNITS: u64 = 32;

/// The fuel units a walk charges per container it enters (setting up the
/// iteration over a container costs far more than visiting an item).
const LEVEL_UNITS: u64 = 256;

std::thread_local! {
    // Items of released containers waiting to be dropped, and whether a
    // release further up this thread's stack is dropping them.
    static PENDING: std::cell::RefCell<Vec<crate::value::Value>> =
        const { std::cell::RefCell::new(Vec::new()) };
    static DRAINING: Cell<bool> = const { Cell::new(false) };
}

/// Drops one reference to an object.
///
/// Dropping the last reference to a list nested a million levels deep would
/// recurse a million times.  When `object` is the last reference to a list,
/// tuple, map or namespace, its items are instead queued, and the outermost
/// release on this thread drops the queue item by item, so that the stack
/// stays flat however deep the value.
pub(crate) fn release<T: Send + Sync + 'static>(object: std::sync::Arc<T>) {
    use crate::value::{namespace_object::Namespace, Tuple, Value, ValueMap};
    use std::any::Any;
    use std::sync::Arc;

    fn unique<U: Send + Sync + 'static>(
        any: Arc<dyn Any + Send + Sync>,
    ) -> Result<Option<U>, Arc<dyn Any + Send + Sync>> {
        match any.downcast::<U>() {
            Ok(arc) => Ok(Arc::try_unwrap(arc).ok()),
            Err(any) => Err(any),
        }
    }
    fn pairs(map: impl IntoIterator<Item = (Value, Value)>) -> Vec<Value> {
        map.into_iter().flat_map(|(k, v)| [k, v]).collect()
    }

    let any: Arc<dyn Any + Send + Sync> = object;
    let items: Vec<Value> = match unique::<Vec<Value>>(any) {
        Ok(list) => list.unwrap_or_default(),
        Err(any) => match unique::<ValueMap>(any) {
            Ok(map) => map.map(pairs).unwrap_or_default(),
            Err(any) => match unique::<Tuple>(any) {
                Ok(tuple) => tuple.map(Tuple::into_vec).unwrap_or_default(),
                Err(any) => match unique::<Namespace>(any) {
                    Ok(ns) => ns
                        .map(|ns| ns.into_data().into_values().collect::<Vec<Value>>())
                        .unwrap_or_default(),
                    // other objects drop their fields as usual
                    Err(_) => return,
                },
            },
        },
    };
    if items.is_empty() {
        return;
    }
    if DRAINING.try_with(|d| d.get()).unwrap_or(false) {
        // a release further up drops the queue; if the queue is gone (the
        // thread is exiting), the items drop here as usual
        let _ = PENDING.try_with(|p| p.borrow_mut().extend(items));
        return;
    }
    if DRAINING.try_with(|d| d.set(true)).is_err() {
        return; // the thread is exiting: `items` drop as usual
    }
    struct Draining;
    impl Drop for Draining {
        fn drop(&mut self) {
            let _ = DRAINING.try_with(|d| d.set(false));
        }
    }
    let _draining = Draining;
    let mut batch = items;
    loop {
        // dropping the batch queues the items of the containers it releases
        drop(batch);
        batch = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if batch.is_empty() {
            break;
        }
    }
}
