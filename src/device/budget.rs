//! [`MemoryBudget`]: the device memory that joins may hold at once on one device, shared by
//! every join of the process (the partitions of one query and concurrent queries alike).
//!
//! A join reserves what a piece of work needs before it starts it and gives it back when the
//! work ends. [`MemoryBudget::reserve`] waits, first come first served, until enough memory is
//! free, so that concurrent work queues up instead of failing; a request larger than the whole
//! budget is refused at once with `ResourcesExhausted`. [`MemoryBudget::try_reserve`] never
//! waits, for work that is optional (another chunk in flight). The host backend has a budget
//! of its own with the same rules, so that tests without a GPU exercise every path a small
//! budget forces (smaller chunks, output in passes).
//!
//! Every reservation belongs to a [`Holder`], the query execution that made it, and the budget
//! knows what each holder holds ([`MemoryBudget::held_by`]). A join must not wait for memory
//! while its own query holds some, or while another join of its query waits: the joins of a
//! pipeline run at once, and the one above (which holds its memory until its probe input, this
//! join's output, ends) would never give it back. [`MemoryBudget::reserve_unless_held`] then
//! says no at once, and the join runs on the CPU instead (see `exec::run`).
//!
//! Memory is counted in units of [`UNIT`] bytes, rounded up.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use datafusion::common::{Result, resources_err};
use datafusion::execution::TaskContext;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::memory::poisoned;

/// Granularity of reservations.
pub const UNIT: usize = 64 << 10;

/// The memory that joins may hold at once on one device.
#[derive(Debug)]
pub struct MemoryBudget {
    semaphore: Arc<Semaphore>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Units the budget holds in all (free and reserved).
    capacity: usize,
    /// Units to take out of circulation as reservations come back (after a shrink).
    debt: usize,
    /// Units reserved, per holder that holds some.
    held: HashMap<Holder, usize>,
    /// Holders one of whose reservations waits for memory.
    waiting: HashSet<Holder>,
}

/// Who holds a reservation: one execution of a query (its `TaskContext`, which every operator
/// of the plan passes on to its inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder(pub usize);

impl Holder {
    /// The execution `ctx` belongs to: the one a [`QueryOf`] in its settings names, else its
    /// own.
    pub fn of(ctx: &Arc<TaskContext>) -> Self {
        (ctx.session_config().get_extension::<QueryOf>())
            .map_or(Holder(Arc::as_ptr(ctx).addr()), |q| q.0)
    }
}

/// In the settings of a context made for part of an execution (a fallback's DataFusion join
/// runs its inputs under one of its own: `exec::stream`), the execution it belongs to, so that
/// the joins under it hold memory as that execution's and never wait on memory it holds.
#[derive(Debug, Clone, Copy)]
pub struct QueryOf(pub Holder);

/// Memory reserved from a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    budget: Arc<MemoryBudget>,
    holder: Holder,
}

fn units(bytes: usize) -> usize {
    bytes.div_ceil(UNIT)
}

impl MemoryBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Arc<Self> {
        let capacity = units(bytes).min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            semaphore: Arc::new(Semaphore::new(capacity)),
            state: Mutex::new(State {
                capacity,
                debt: 0,
                held: HashMap::new(),
                waiting: HashSet::new(),
            }),
        })
    }

    /// Bytes the budget holds in all.
    pub fn capacity(&self) -> usize {
        self.state.lock().map_or(0, |s| s.capacity * UNIT)
    }

    /// Bytes free now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits() * UNIT
    }

    /// Bytes `holder` has reserved.
    pub fn held_by(&self, holder: Holder) -> usize {
        self.state
            .lock()
            .map_or(0, |s| s.held.get(&holder).copied().unwrap_or(0) * UNIT)
    }

    /// Changes the budget to `bytes`. Growing takes effect at once; shrinking takes free memory
    /// first and the rest as reservations come back.
    pub fn set_capacity(&self, bytes: usize) -> Result<()> {
        let target = units(bytes).min(Semaphore::MAX_PERMITS);
        let mut state = self.state.lock().map_err(|_| poisoned("memory budget"))?;
        if target > state.capacity {
            let mut grow = target - state.capacity;
            let paid = grow.min(state.debt);
            state.debt -= paid;
            grow -= paid;
            self.semaphore.add_permits(grow);
        } else {
            let shrink = state.capacity - target;
            let taken = self.semaphore.forget_permits(shrink);
            state.debt += shrink - taken;
        }
        state.capacity = target;
        Ok(())
    }

    /// Reserves `bytes` for `holder`, waiting until they are free, unless `holder` already
    /// holds memory or waits for some: then `None` at once (checked and marked under one lock,
    /// so two joins of one query never both wait).
    pub async fn reserve_unless_held(
        self: &Arc<Self>,
        bytes: usize,
        holder: Holder,
    ) -> Result<Option<Reservation>> {
        let need = units(bytes);
        let capacity = self.capacity() / UNIT;
        if need > capacity {
            return resources_err!(
                "GpuJoinExec needs {bytes} bytes of device memory at once, more than \
                 gpu_join.memory_limit allows ({} bytes)",
                capacity * UNIT
            );
        }
        let _waiting = {
            let mut state = self.state.lock().map_err(|_| poisoned("memory budget"))?;
            if state.held.contains_key(&holder) || !state.waiting.insert(holder) {
                return Ok(None);
            }
            Waiting(self, holder)
        };
        let permit = Arc::clone(&self.semaphore)
            .acquire_many_owned(need as u32)
            .await
            .map_err(|_| datafusion::common::exec_datafusion_err!("memory budget closed"))?;
        // Counted as held before it stops counting as waiting.
        Ok(Some(self.reservation(permit, holder)))
    }

    /// Reserves `bytes` for `holder` if they are free now.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize, holder: Holder) -> Option<Reservation> {
        let need = u32::try_from(units(bytes)).ok()?;
        let permit = Arc::clone(&self.semaphore)
            .try_acquire_many_owned(need)
            .ok()?;
        Some(self.reservation(permit, holder))
    }

    /// A reservation of nothing for `holder`, to grow with [`Reservation::try_more`].
    pub fn nothing(self: &Arc<Self>, holder: Holder) -> Reservation {
        Reservation {
            permit: None,
            budget: Arc::clone(self),
            holder,
        }
    }

    fn reservation(self: &Arc<Self>, permit: OwnedSemaphorePermit, holder: Holder) -> Reservation {
        self.count(holder, permit.num_permits() as isize);
        Reservation {
            permit: Some(permit),
            budget: Arc::clone(self),
            holder,
        }
    }

    /// Adds `units` (which may be negative) to what `holder` holds.
    fn count(&self, holder: Holder, units: isize) {
        if let Ok(mut state) = self.state.lock() {
            let held = state.held.entry(holder).or_default();
            *held = held.saturating_add_signed(units);
            if *held == 0 {
                state.held.remove(&holder);
            }
        }
    }
}

/// A holder marked as waiting for memory while this lives (also when the wait is dropped).
struct Waiting<'a>(&'a MemoryBudget, Holder);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.state.lock() {
            state.waiting.remove(&self.1);
        }
    }
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits() * UNIT)
    }

    /// More memory for the same holder, if `bytes` are free now.
    pub fn try_more(&self, bytes: usize) -> Option<Reservation> {
        self.budget.try_reserve(bytes, self.holder)
    }

    /// Adds `other` to this reservation.
    pub fn merge(&mut self, mut other: Reservation) {
        if other.holder != self.holder {
            let moved = other
                .permit
                .as_ref()
                .map_or(0, |p| p.num_permits() as isize);
            self.budget.count(other.holder, -moved);
            self.budget.count(self.holder, moved);
        }
        match (&mut self.permit, other.permit.take()) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, theirs) => *mine = theirs,
            (_, None) => {}
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut back = permit.num_permits();
        permit.forget();
        self.budget.count(self.holder, -(back as isize));
        if let Ok(mut state) = self.budget.state.lock() {
            let paid = back.min(state.debt);
            state.debt -= paid;
            back -= paid;
        }
        self.budget.semaphore.add_permits(back);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_memory_and_come_back() {
        let (x, y) = (Holder(1), Holder(2));
        let budget = MemoryBudget::new(4 * UNIT);
        let a = budget
            .reserve_unless_held(3 * UNIT, x)
            .await
            .unwrap()
            .unwrap();
        assert!(budget.try_reserve(2 * UNIT, y).is_none());
        assert!(
            budget.reserve_unless_held(UNIT, x).await.unwrap().is_none(),
            "x holds memory: no wait"
        );
        let waiting = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move {
                let r = budget.reserve_unless_held(2 * UNIT, y).await;
                r.map(|r| r.map(|r| r.bytes()))
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert!(
            budget.reserve_unless_held(UNIT, y).await.unwrap().is_none(),
            "y already waits: no second wait"
        );
        drop(a);
        assert_eq!(waiting.await.unwrap().unwrap(), Some(2 * UNIT));
        assert_eq!(budget.available(), 4 * UNIT);
        assert!(budget.reserve_unless_held(5 * UNIT, x).await.is_err());
    }

    #[test]
    fn shrinking_takes_free_memory_then_returning_reservations() {
        let budget = MemoryBudget::new(4 * UNIT);
        let a = budget.try_reserve(3 * UNIT, Holder(1)).unwrap();
        budget.set_capacity(2 * UNIT).unwrap();
        assert_eq!(budget.available(), 0);
        drop(a);
        assert_eq!(budget.available(), 2 * UNIT);
        budget.set_capacity(5 * UNIT).unwrap();
        assert_eq!(budget.available(), 5 * UNIT);
    }

    #[test]
    fn the_budget_knows_what_each_holder_holds() {
        let (x, y) = (Holder(1), Holder(2));
        let budget = MemoryBudget::new(8 * UNIT);
        let mut a = budget.try_reserve(2 * UNIT, x).unwrap();
        let b = a.try_more(UNIT).unwrap();
        let c = budget.try_reserve(3 * UNIT, y).unwrap();
        assert_eq!(budget.held_by(x), 3 * UNIT);
        assert_eq!(budget.held_by(y), 3 * UNIT);
        a.merge(b);
        assert_eq!(budget.held_by(x), 3 * UNIT);
        a.merge(c);
        assert_eq!((budget.held_by(x), budget.held_by(y)), (6 * UNIT, 0));
        drop(a);
        assert_eq!(budget.held_by(x), 0);
        assert_eq!(budget.available(), 8 * UNIT);
    }
}
