//! Exchange: relations spread over several devices dealt out again by key, so that all the rows
//! of a key, from every device, end up on one device. Two relations exchanged on the same keys
//! then join device by device, each device on its own share (library only: the streaming engine
//! replicates a build side on every device instead).
//!
//! A source deals its part out in one of two orders:
//!
//! ```text
//!  by route (exchange_sets): a plain relation per device, for any join
//!  device 0: R₀ ─► encode keys ─► route: one stable pass, every column moving ─► 2^b routes
//!  device 1: R₁ ─► encode keys ─► route                                      ─► 2^b routes
//!  device d receives routes routes_of(d, n) of every source, one run of rows from each:
//!                                          [ from R₀ | from R₁ ]  (a relation on device d)
//!
//!  by partition (exchange_partitioned): PHJ-OM's transformed relation per device
//!  device 0: R₀ ─► encode keys ─► partition into 2^bits, every column moving ─► n runs
//!  device 1: R₁ ─► encode keys ─► partition                                  ─► n runs
//!  device d receives partitions d·2^bits/n .. (d+1)·2^bits/n of every source, in one run each:
//!        [ from R₀ | from R₁ ], each partition in two segments (one per source), its keys too
//! ```
//!
//! A key's route ([`Backend::route`]) is a hash independent of the partition hash, so the share
//! a device receives still fills every partition and bucket of the join that follows it; that
//! join partitions its share again. Dealt out by partition, each source partitions its rows once
//! for the join, by the partition hash whose top bits name the device; a device's share is then
//! partitioned already, each partition in one segment per source, which
//! [`Backend::hash_join`] reads as one.
//!
//! Several relations (sets: R, then S) are exchanged in one pipeline. Each source orders every
//! set in turn on an ordering queue, with nothing in between (enqueued from a thread per source,
//! so that every device starts at once). As soon as every source has ordered a set, its runs for
//! other devices are copied on a copy queue of each source (over the devices' direct link), and
//! the run it keeps on a local queue at the same time, while the ordering queues go on with the
//! next set. Dealt out by partition, every set's keys go before any set's columns, so that the
//! columns' copies do not take memory bandwidth from the partitioning of the next set. A
//! device's share of a set is taken with [`DeviceShares::take`] (or `take_partitioned`), which
//! makes the device's queue wait for that set's copies only, so a join can transform its build
//! side while the probe side is still in flight; or, dealt out by partition, with
//! [`DeviceShares::take_keys`], which waits for the keys' copies only, so a join can match keys
//! while columns arrive.
//!
//! Ordering: a source's ordering queue waits for what the source's own queue held when the
//! exchange began (its part's uploads), and the own queue waits for the ordering queue before
//! the exchange returns (so that the part can be freed there). A destination's buffers are
//! allocated on its own queue, after everything enqueued there before, and an event marks them
//! ready; each copy and local queue waits for those events and for its source's ordering of the
//! set, and records an event after the set's keys (by partition) and after all its copies; the
//! takes wait for those events, and a [`KeysFirst`] waits for the columns' copies before it
//! hands them out or frees them. The ordered copies stay alive until the guard shared by every
//! device's shares drops; they are then freed on their ordering queues, which first wait for the
//! queues that read them.

use std::ops::Range;
use std::sync::Arc;

use datafusion::common::{Result, internal_datafusion_err, internal_err, plan_err};

use super::transform::{TransformedRelation, encode_keys, transform};
use crate::backend::{Backend, KeyWidth, MAX_PARTITION_BITS, MAX_ROUTE_BITS, Partitioned};
use crate::columns::{ColumnKind, DeviceColumn, DeviceRelation, KeyEncoder};
use crate::device::HostBlock;
use crate::trace::trace;

/// The most devices an exchange deals out to.
pub const MAX_DEVICES: usize = 1 << MAX_ROUTE_BITS;

/// Route bits for `n` devices: one route each where `n` is a power of two (the route pass then
/// sorts by as few bits as it can), else the most, so that the routes share out evenly.
pub fn route_bits(n: usize) -> u32 {
    match n.is_power_of_two() {
        true => n.trailing_zeros().min(MAX_ROUTE_BITS),
        false => MAX_ROUTE_BITS,
    }
}

/// The routes device `d` of `n` receives: an even share of the `2^route_bits(n)`, in one run.
pub fn routes_of(d: usize, n: usize) -> Range<usize> {
    let routes = 1 << route_bits(n);
    d * routes / n..(d + 1) * routes / n
}

/// The order a source deals its part out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deal {
    /// By route ([`Backend::route`]): device d gets [`routes_of`]`(d, n)`; a share is a plain
    /// relation.
    Routes,
    /// By partition: every source partitions its part into `2^bits` partitions, as PHJ-OM's
    /// transform does, and device d of n (a power of two) gets partitions `d * 2^bits / n ..
    /// (d + 1) * 2^bits / n`; a share is also a transformed relation of `bits - log2 n` bits.
    Partitions { bits: u32 },
}

impl Deal {
    /// Checks the deal for `n` devices.
    fn check(self, n: usize) -> Result<()> {
        match self {
            Self::Routes => Ok(()),
            Self::Partitions { bits } => {
                if !n.is_power_of_two() || n.trailing_zeros() > bits || bits > MAX_PARTITION_BITS {
                    return plan_err!(
                        "exchange: {n} devices cannot share 2^{bits} partitions evenly (a power \
                         of two devices, at most 2^{bits}, and at most {MAX_PARTITION_BITS} bits)"
                    );
                }
                Ok(())
            }
        }
    }

    /// How many bounds a source's ordered part has: one more than its routes or partitions.
    fn bounds(self, n: usize) -> usize {
        match self {
            Self::Routes => (1 << route_bits(n)) + 1,
            Self::Partitions { bits } => (1 << bits) + 1,
        }
    }

    /// The routes or partitions device `d` of `n` gets.
    fn range(self, d: usize, n: usize) -> Range<usize> {
        match self {
            Self::Routes => routes_of(d, n),
            Self::Partitions { bits } => d * (1 << bits) / n..(d + 1) * (1 << bits) / n,
        }
    }
}

/// What a column looks like on every source: its index, kind, and whether any source has a
/// validity plane for it (then every destination gets one).
struct ColumnShape {
    index: usize,
    kind: ColumnKind,
    nullable: bool,
}

/// One relation to exchange: its part on each source device (`parts[s]` on backend `s`), the
/// key columns it is dealt out by, and the columns its shares get (dealt out by route, the key
/// columns among them: the join that follows encodes them again).
pub struct ExchangeSet<'a, Buf> {
    pub parts: &'a [DeviceRelation<Buf>],
    pub keys: &'a [usize],
    pub columns: &'a [usize],
}

/// Deals the rows of one relation, part `s` on `backends[s]`, out to the same backends by the
/// route of its `keys` encoded with `encoder`: relation `d` of the result, on `backends[d]`,
/// holds every row whose route is in [`routes_of`]`(d, n)`, first those of part 0, then those
/// of part 1, and so on, each part's rows in route order and the rows of one route in their
/// part's order. Every part must have part 0's columns (indices and kinds), which the shares
/// get. Ready on each backend's queue when this returns; the copies are only enqueued. Peak
/// memory per device: its part, a routed copy of it, and its share.
pub fn exchange<B: Backend + Clone>(
    backends: &[B],
    parts: &[DeviceRelation<B::Buf>],
    keys: &[usize],
    encoder: &KeyEncoder,
) -> Result<Vec<DeviceRelation<B::Buf>>> {
    let mut columns: Vec<usize> = match parts.first() {
        Some(p) => p.columns.keys().copied().collect(),
        None => vec![],
    };
    columns.sort_unstable();
    let set = ExchangeSet {
        parts,
        keys,
        columns: &columns,
    };
    exchange_sets(backends, &[set], encoder)?
        .into_iter()
        .map(|mut d| d.take(0))
        .collect()
}

/// Starts exchanging `sets` (each as [`exchange`] deals one relation) over `backends`, set
/// after set, pipelined; returns each device's shares, to take set by set. Waits on the host
/// for each set's routes (their bounds size the copies); the copies are only enqueued. Peak
/// memory per device: every set's part, a routed copy of each, and its shares.
pub fn exchange_sets<B: Backend + Clone>(
    backends: &[B],
    sets: &[ExchangeSet<'_, B::Buf>],
    encoder: &KeyEncoder,
) -> Result<Vec<DeviceShares<B>>> {
    deal(backends, sets, encoder, Deal::Routes)
}

/// Starts exchanging `sets` as [`exchange_sets`] does, but dealt out by partition: every
/// source partitions its part of a set into `2^bits` partitions by `keys` encoded with
/// `encoder`, every column moving, and device d of n (a power of two) gets partitions
/// `d * 2^bits / n .. (d + 1) * 2^bits / n` of every source, every set's keys copied before
/// any set's columns. Take a share with [`DeviceShares::take_partitioned`] (or its keys first with
/// [`DeviceShares::take_keys`]): its keys and columns in partition order, partition p of the
/// share being partition `d * 2^bits / n + p` of the whole, in one segment per source (source
/// 0's rows first). Two sets exchanged with the same `bits` and encoder join device by device
/// with [`Backend::hash_join`]. Peak memory per device: every set's part, its partitioned copy,
/// and its shares.
pub fn exchange_partitioned<B: Backend + Clone>(
    backends: &[B],
    sets: &[ExchangeSet<'_, B::Buf>],
    encoder: &KeyEncoder,
    bits: u32,
) -> Result<Vec<DeviceShares<B>>> {
    deal(backends, sets, encoder, Deal::Partitions { bits })
}

/// The pipeline of [`exchange_sets`] and [`exchange_partitioned`].
fn deal<B: Backend + Clone>(
    backends: &[B],
    sets: &[ExchangeSet<'_, B::Buf>],
    encoder: &KeyEncoder,
    order: Deal,
) -> Result<Vec<DeviceShares<B>>> {
    let n = backends.len();
    if n == 0 || n > MAX_DEVICES {
        return plan_err!("exchange: over {n} backends (1 to {MAX_DEVICES})");
    }
    if let Some(bad) = sets.iter().find(|s| s.parts.len() != n) {
        return plan_err!(
            "exchange: a relation in {} parts over {n} backends",
            bad.parts.len()
        );
    }
    order.check(n)?;
    if order == Deal::Routes
        && sets
            .iter()
            .any(|s| s.keys.iter().any(|k| !s.columns.contains(k)))
    {
        return plan_err!("exchange: dealt out by route, a share needs its key columns");
    }
    let shapes = sets
        .iter()
        .map(|s| shapes(s.parts, s.columns))
        .collect::<Result<Vec<_>>>()?;
    trace!("exchange: {} sets over {n} devices", sets.len());
    let fork = || {
        backends
            .iter()
            .map(Backend::fork)
            .collect::<Result<Vec<_>>>()
    };
    // Per source: a queue that orders every set, one after the other; a queue that copies its
    // runs for other devices, one that copies the run it keeps, and one that reads its bounds.
    let (order_queues, copy_queues) = (fork()?, fork()?);
    let (local_queues, readers) = (fork()?, fork()?);
    // Ordering reads the parts: after what their sources' queues hold (their uploads).
    for (queue, b) in order_queues.iter().zip(backends) {
        queue.wait(&b.record()?)?;
    }
    let mut ordered: Vec<Vec<Ordered<B>>> = Vec::with_capacity(sets.len());
    let mut shares: Vec<Vec<Share<B>>> = (0..n).map(|_| vec![]).collect();
    // Declared after the buffers the queues read and write, so that on an error it is dropped
    // first: it waits for everything the exchange enqueued.
    let mut in_flight = InFlight {
        queues: order_queues
            .iter()
            .chain(&copy_queues)
            .chain(&local_queues)
            .collect(),
        armed: true,
    };
    // Each source enqueues its orderings from a thread of its own, so that every device starts
    // at once.
    let by_source = std::thread::scope(|scope| {
        let threads: Vec<_> = order_queues
            .iter()
            .enumerate()
            .map(|(s, queue)| {
                let shapes = &shapes;
                scope.spawn(move || {
                    sets.iter()
                        .zip(shapes)
                        .map(|(set, shape)| {
                            order_part(queue, &set.parts[s], set.keys, shape, encoder, order, n)
                        })
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| internal_err!("exchange: a source's ordering panicked"))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut by_source: Vec<_> = by_source.into_iter().map(Vec::into_iter).collect();
    for _ in sets {
        let set = by_source.iter_mut().map(|parts| parts.next());
        ordered.push(
            set.collect::<Option<_>>().ok_or_else(|| {
                internal_datafusion_err!("exchange: a source ordered too few sets")
            })?,
        );
    }
    trace!("exchange: every set's ordering enqueued");
    // Dealt out by partition, each set's copies, whose columns go after every set's keys.
    let mut deferred = Vec::with_capacity(sets.len());
    for (k, shape) in shapes.iter().enumerate() {
        // This set's bounds, waiting for its ordering only (the sources' ordering queues go on
        // with the next set's); then its shares, allocated on their devices' own queues.
        let bounds = read_bounds(&readers, &ordered[k], order.bounds(n))?;
        trace!("exchange: set {k}: bounds read");
        let runs: Vec<Vec<Range<usize>>> = bounds
            .iter()
            .map(|b| {
                (0..n)
                    .map(|d| {
                        let range = order.range(d, n);
                        b[range.start]..b[range.end]
                    })
                    .collect()
            })
            .collect();
        let mut ready = Vec::with_capacity(n);
        // The host blocks the shares' bounds are uploaded from, kept until the copies are
        // enqueued (dropping one waits for its upload).
        let mut uploads = Vec::with_capacity(n);
        for (d, b) in backends.iter().enumerate() {
            let rows = runs.iter().map(|r| r[d].len()).sum();
            let keys = match order {
                Deal::Routes => None,
                Deal::Partitions { bits } => {
                    let range = order.range(d, n);
                    let (keys, block) = partitioned(b, &bounds, range, bits, encoder, rows)?;
                    uploads.extend(block);
                    Some(keys)
                }
            };
            shares[d].push(Share {
                relation: allocate(b, shape, rows)?,
                keys,
                key_waits: vec![],
                waits: vec![],
            });
            ready.push(b.record()?);
        }
        trace!("exchange: set {k}: shares allocated");
        // Each source's runs for other devices are copied on its copy queue (over the link to
        // their devices), and the run it keeps on its local queue, at the same time, while its
        // ordering queue orders the next set. Dealt out by partition, the set's keys are copied
        // now and its columns after every set's keys: a join can match keys while columns are
        // in flight, and the columns' copies do not take memory bandwidth from the next set's
        // partitioning.
        for (s, (link, local)) in copy_queues.iter().zip(&local_queues).enumerate() {
            for queue in [link, local] {
                queue.wait(&ordered[k][s].done)?;
                for event in &ready {
                    queue.wait(event)?;
                }
            }
        }
        let copies = Copies {
            backends,
            links: &copy_queues,
            locals: &local_queues,
            runs,
        };
        match order {
            Deal::Routes => copies.columns(&ordered[k], shape, &mut shares, k)?,
            Deal::Partitions { .. } => {
                copies.keys(&ordered[k], encoder.width(), &mut shares, k)?;
                deferred.push(copies);
            }
        }
        trace!("exchange: set {k}: copies enqueued");
        drop(uploads);
    }
    for (k, copies) in deferred.iter().enumerate() {
        copies.columns(&ordered[k], &shapes[k], &mut shares, k)?;
    }
    // The parts may be freed on their sources' queues once this returns: after the orderings
    // that read them.
    for (queue, b) in order_queues.iter().zip(backends) {
        b.wait(&queue.record()?)?;
    }
    in_flight.armed = false;
    drop(in_flight);
    let guard = Arc::new(OrderedGuard {
        order_queues,
        copy_queues,
        local_queues,
        ordered,
    });
    Ok(backends
        .iter()
        .zip(shares)
        .map(|(b, sets)| DeviceShares {
            backend: B::clone(b),
            sets: sets.into_iter().map(Some).collect(),
            _guard: Arc::clone(&guard),
        })
        .collect())
}

/// The queues of an exchange, whose work may still read or write buffers about to be freed:
/// dropped while armed (on an error half way), it waits for them.
struct InFlight<'a, B: Backend> {
    queues: Vec<&'a B>,
    armed: bool,
}

impl<B: Backend> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        for queue in self.queues.iter().filter(|_| self.armed) {
            if let Err(e) = queue.synchronize() {
                log::error!("exchange: waiting for copies after an error: {e}");
            }
        }
    }
}

/// The copies of one set's runs from every source to every device: each source's runs for
/// other devices on its copy queue (`links`), the run it keeps on its local queue (`locals`).
/// `runs[s][d]`: the rows of source s's ordered part that go to device d.
struct Copies<'a, B: Backend> {
    backends: &'a [B],
    links: &'a [B],
    locals: &'a [B],
    runs: Vec<Vec<Range<usize>>>,
}

impl<B: Backend> Copies<'_, B> {
    /// The queue that copies source `s`'s run for device `d`.
    fn by(&self, s: usize, d: usize) -> &B {
        match d == s {
            true => &self.locals[s],
            false => &self.links[s],
        }
    }

    /// The devices source `s` sends to, the others first, so that the link starts first.
    fn targets(&self, s: usize) -> impl Iterator<Item = usize> + Clone {
        let n = self.backends.len();
        (1..=n).map(move |i| (s + i) % n)
    }

    /// Where source `s`'s run lands in device `d`'s share: after the earlier sources' runs.
    fn at(&self, s: usize, d: usize) -> usize {
        self.runs[..s].iter().map(|r| r[d].len()).sum()
    }

    /// Enqueues the copies of the keys of set `k` (`ordered`, one per source, dealt out by
    /// partition) into every device's share; its shares' key waits are their events.
    fn keys(
        &self,
        ordered: &[Ordered<B>],
        width: KeyWidth,
        shares: &mut [Vec<Share<B>>],
        k: usize,
    ) -> Result<()> {
        let events = self.each(ordered, shares, k, |by, from, run, to, dest, at| {
            copy_keys(by, from, width, run, to, dest, at)
        })?;
        for share in shares.iter_mut() {
            share[k].key_waits = events.clone();
        }
        Ok(())
    }

    /// Enqueues the copies of every column of `shape` of set `k` (`ordered`, one per source)
    /// into every device's share; its shares' waits are their events.
    fn columns(
        &self,
        ordered: &[Ordered<B>],
        shape: &[ColumnShape],
        shares: &mut [Vec<Share<B>>],
        k: usize,
    ) -> Result<()> {
        let events = self.each(ordered, shares, k, |by, from, run, to, dest, at| {
            copy_run(by, from, shape, run, to, dest, at)
        })?;
        for share in shares.iter_mut() {
            share[k].waits = events.clone();
        }
        Ok(())
    }

    /// Enqueues `copy(queue, from, run, to, share, at)` of every source's run for every device
    /// of set `k`, on the queue that copies it; returns the events after them, one per queue.
    fn each(
        &self,
        ordered: &[Ordered<B>],
        shares: &mut [Vec<Share<B>>],
        k: usize,
        mut copy: impl FnMut(&B, &Ordered<B>, Range<usize>, &B, &mut Share<B>, usize) -> Result<()>,
    ) -> Result<Vec<Arc<B::Event>>> {
        let mut events = Vec::with_capacity(2 * ordered.len());
        for (s, from) in ordered.iter().enumerate() {
            for d in self.targets(s) {
                let (run, to, at) = (self.runs[s][d].clone(), &self.backends[d], self.at(s, d));
                copy(self.by(s, d), from, run, to, &mut shares[d][k], at)?;
            }
            events.push(Arc::new(self.links[s].record()?));
            events.push(Arc::new(self.locals[s].record()?));
        }
        Ok(events)
    }
}

/// One device's shares of the sets of an [`exchange_sets`].
pub struct DeviceShares<B: Backend> {
    backend: B,
    sets: Vec<Option<Share<B>>>,
    /// Keeps the ordered copies the shares are copied from alive until their copies are done.
    _guard: Arc<OrderedGuard<B>>,
}

/// A share not yet taken, and the copy queues' events its device waits for before using it:
/// its keys' copies (dealt out by partition), then all of them.
struct Share<B: Backend> {
    relation: DeviceRelation<B::Buf>,
    /// Dealt out by partition: its keys, in partition order like its columns, and its bounds.
    keys: Option<Partitioned<B::Buf>>,
    key_waits: Vec<Arc<B::Event>>,
    waits: Vec<Arc<B::Event>>,
}

impl<B: Backend + Clone> DeviceShares<B> {
    /// This device's share of set `set`, ready on its queue: the queue waits for the set's
    /// copies first. Each share is taken once.
    pub fn take(&mut self, set: usize) -> Result<DeviceRelation<B::Buf>> {
        Ok(self.take_share(set)?.relation)
    }

    /// This device's share of set `set` of an [`exchange_partitioned`], ready on its queue, as
    /// PHJ-OM's transform gives a relation: its keys partitioned (one segment per source) and
    /// every column in their order. Each share is taken once.
    pub fn take_partitioned(&mut self, set: usize) -> Result<TransformedRelation<B>> {
        self.take_keys(set)?.ready()
    }

    /// This device's share of set `set` of an [`exchange_partitioned`], its keys ready on its
    /// queue (which waits for their copies only) and its columns perhaps still in flight: a
    /// join can match the keys while the columns arrive, then take them with
    /// [`KeysFirst::ready`]. Each share is taken once.
    pub fn take_keys(&mut self, set: usize) -> Result<KeysFirst<B>> {
        let Some(Some(share)) = self.sets.get(set) else {
            return internal_err!("exchange: share {set} taken twice or not there");
        };
        if share.keys.is_none() {
            return internal_err!("exchange: share {set} was dealt out by route, not partition");
        }
        for event in &share.key_waits {
            self.backend.wait(event)?;
        }
        match self.sets[set].take() {
            Some(Share {
                relation,
                keys: Some(keys),
                waits,
                ..
            }) => Ok(KeysFirst {
                backend: B::clone(&self.backend),
                relation: Some(TransformedRelation {
                    keys,
                    columns: relation.columns,
                }),
                waits,
            }),
            _ => internal_err!("exchange: share {set} gone"),
        }
    }

    fn take_share(&mut self, set: usize) -> Result<Share<B>> {
        let Some(Some(share)) = self.sets.get(set) else {
            return internal_err!("exchange: share {set} taken twice or not there");
        };
        // Waited for before the share leaves: where a wait fails, dropping these shares waits
        // for its copies.
        for event in &share.waits {
            self.backend.wait(event)?;
        }
        match self.sets[set].take() {
            Some(share) => Ok(share),
            None => internal_err!("exchange: share {set} gone"),
        }
    }
}

impl<B: Backend> Drop for DeviceShares<B> {
    fn drop(&mut self) {
        // A share not taken is written by copies still in flight: its buffers are freed on
        // this device's queue after them.
        for mut share in self.sets.iter_mut().filter_map(Option::take) {
            let waits = std::mem::take(&mut share.waits);
            drop_after(&self.backend, &waits, share);
        }
    }
}

/// A share dealt out by partition whose keys are ready on its device's queue and whose columns
/// may still be in flight ([`DeviceShares::take_keys`]). Dropped unused, its device's queue
/// waits for the columns' copies before freeing them.
pub struct KeysFirst<B: Backend> {
    backend: B,
    relation: Option<TransformedRelation<B>>,
    /// The copy queues' events after the columns' copies.
    waits: Vec<Arc<B::Event>>,
}

impl<B: Backend> KeysFirst<B> {
    /// The share's keys and their bounds, ready on its device's queue.
    pub fn keys(&self) -> &Partitioned<B::Buf> {
        &self
            .relation
            .as_ref()
            .expect("present until ready or dropped")
            .keys
    }

    /// The whole share, ready on its device's queue: the queue waits for the columns' copies.
    pub fn ready(mut self) -> Result<TransformedRelation<B>> {
        for event in &self.waits {
            self.backend.wait(event)?;
        }
        match self.relation.take() {
            Some(r) => Ok(r),
            None => internal_err!("exchange: a share taken twice"),
        }
    }
}

impl<B: Backend> Drop for KeysFirst<B> {
    fn drop(&mut self) {
        if let Some(relation) = self.relation.take() {
            drop_after(&self.backend, &self.waits, relation);
        }
    }
}

/// Drops `share`, whose buffers copies may still write, on `backend`'s queue after `waits`
/// (the copies' events); failing that, after the host waited for them; failing that too, leaks
/// it rather than free it under a copy.
fn drop_after<B: Backend, T>(backend: &B, waits: &[Arc<B::Event>], share: T) {
    let ordered = waits.iter().all(|event| {
        let waited = backend.wait(event);
        waited.or_else(|_| backend.block_on(event)).is_ok()
    });
    if ordered {
        drop(share);
    } else {
        log::error!("exchange: a share's copies could not be waited for; leaking it");
        std::mem::forget(share);
    }
}

/// One source's part of one set, in the order it is dealt out in (by route or by partition):
/// each column's values and validity (where the part has one), in the order of the set's shape;
/// its keys where dealt out by partition; the bounds of its routes or partitions; and the event
/// after them.
struct Ordered<B: Backend> {
    columns: Vec<(B::Buf, Option<B::Buf>)>,
    keys: Option<B::Buf>,
    bounds: B::Buf,
    done: Arc<B::Event>,
}

/// The ordered (routed or partitioned) copies of every source and set, the queues that made
/// them, and the queues that read them: each source's copy queue and local queue.
struct OrderedGuard<B: Backend> {
    order_queues: Vec<B>,
    copy_queues: Vec<B>,
    local_queues: Vec<B>,
    ordered: Vec<Vec<Ordered<B>>>,
}

impl<B: Backend> Drop for OrderedGuard<B> {
    fn drop(&mut self) {
        // The ordered copies are freed on their ordering queues: after the queues that read
        // them.
        let mut ordered = true;
        let sources = self.order_queues.iter().zip(&self.copy_queues);
        for ((order_queue, copy_queue), local) in sources.zip(&self.local_queues) {
            for reader in [copy_queue, local] {
                let waited = reader.record().and_then(|e| order_queue.wait(&e));
                // Failing that, the host waits for the reader itself.
                ordered &= waited.or_else(|_| reader.synchronize()).is_ok();
            }
        }
        if !ordered {
            // Leaked rather than freed under a copy that may still read them.
            log::error!("exchange: the copies could not be waited for; leaking the ordered copies");
            std::mem::forget(std::mem::take(&mut self.ordered));
        }
        self.ordered.clear();
    }
}

/// Encodes `part`'s keys and orders it on `b` as `order` deals it out to `n` devices, every
/// column of `shape` carried.
fn order_part<B: Backend>(
    b: &B,
    part: &DeviceRelation<B::Buf>,
    keys: &[usize],
    shape: &[ColumnShape],
    encoder: &KeyEncoder,
    order: Deal,
    n: usize,
) -> Result<Ordered<B>> {
    let (mut planes, keys, bounds) = match order {
        Deal::Routes => {
            let encoded = encode_keys(b, part, keys, encoder)?;
            let carry: Vec<_> = shape
                .iter()
                .flat_map(|s| part.columns[&s.index].planes())
                .collect();
            let routed = b.route(&encoded, part.rows, encoder.width(), route_bits(n), &carry)?;
            let Partitioned {
                carried, bounds, ..
            } = routed;
            // The carried planes come back as given: each column's values, then its validity.
            (carried.into_iter(), None, bounds)
        }
        Deal::Partitions { bits } => {
            let payload: Vec<usize> = shape.iter().map(|s| s.index).collect();
            let mut t = transform(b, part, keys, &payload, encoder, bits)?;
            let mut planes = vec![];
            for s in shape {
                let Some(col) = t.columns.remove(&s.index) else {
                    return internal_err!("exchange: the transform lost column {}", s.index);
                };
                planes.push(col.values);
                planes.extend(col.validity);
            }
            (planes.into_iter(), Some(t.keys.keys), t.keys.bounds)
        }
    };
    let done = Arc::new(b.record()?);
    let columns = shape
        .iter()
        .map(|s| {
            let values = planes.next();
            let validity = match part.columns[&s.index].validity {
                Some(_) => planes.next(),
                None => None,
            };
            match values {
                Some(v) => Ok((v, validity)),
                None => internal_err!("exchange: a column was lost on the way"),
            }
        })
        .collect::<Result<_>>()?;
    Ok(Ordered {
        columns,
        keys,
        bounds,
        done,
    })
}

/// The first `count` bounds of every source's routes or partitions of one set (`ordered`), each
/// read on its source's `reader` queue, which waits for that source's ordering only: every read
/// is in flight before the host waits for any (through a pinned block where the source's
/// staging pool has one free, else read there and then).
fn read_bounds<B: Backend>(
    readers: &[B],
    ordered: &[Ordered<B>],
    count: usize,
) -> Result<Vec<Vec<usize>>> {
    enum Read {
        InFlight(HostBlock),
        Done(Vec<u8>),
    }
    let len = count * 4;
    let reads = readers
        .iter()
        .zip(ordered)
        .map(|(reader, r)| {
            reader.wait(&r.done)?;
            Ok(match reader.staging().try_take(len)? {
                Some(mut block) => {
                    reader.copy_to_host(&r.bounds, 0, &mut block, 0, len)?;
                    Read::InFlight(block)
                }
                None => {
                    let mut bytes = vec![0u8; len];
                    reader.download(&r.bounds, &mut bytes)?;
                    Read::Done(bytes)
                }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let words = |bytes: &[u8]| -> Vec<usize> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect()
    };
    reads
        .into_iter()
        .map(|read| match read {
            Read::Done(bytes) => Ok(words(&bytes)),
            Read::InFlight(mut block) => Ok(words(&block.bytes()?[..len])),
        })
        .collect()
}

/// The keys of a device's share, dealt out by partition, allocated on `b`, and its bounds:
/// segment s holds source s's rows of partitions `range` (of `2^bits`), at the rows where the
/// runs of the sources before it end. `bounds[s]`: source s's partition bounds. The bounds are
/// uploaded from a pinned block where `b`'s staging pool has one free, returned with them: the
/// upload may still be in flight until it is dropped.
fn partitioned<B: Backend>(
    b: &B,
    bounds: &[Vec<usize>],
    range: Range<usize>,
    bits: u32,
    encoder: &KeyEncoder,
    rows: usize,
) -> Result<(Partitioned<B::Buf>, Option<HostBlock>)> {
    let n = bounds.len();
    let len = n * (range.len() + 1) * 4;
    // Every bound is at most `rows` (the sources' runs, back to back).
    if u32::try_from(rows).is_err() {
        return internal_err!("exchange: a share of {rows} rows");
    }
    let fill = |out: &mut [u8]| {
        let mut words = out.chunks_exact_mut(4);
        let mut at = 0;
        for source in bounds {
            let first = source[range.start];
            for (&bound, word) in source[range.start..=range.end].iter().zip(&mut words) {
                word.copy_from_slice(&((at + bound - first) as u32).to_le_bytes());
            }
            at += source[range.end] - first;
        }
    };
    let (share_bounds, block) = match b.staging().try_take(len)? {
        Some(mut block) => {
            fill(&mut block.bytes_mut()?[..len]);
            let mut buf = b.alloc(len)?;
            b.copy_to_device(&mut block, 0, &mut buf, 0, len)?;
            (buf, Some(block))
        }
        None => {
            let mut bytes = vec![0u8; len];
            fill(&mut bytes);
            (b.upload(&bytes)?, None)
        }
    };
    let keys = Partitioned {
        keys: b.alloc(rows * encoder.width().bytes())?,
        bounds: share_bounds,
        rows,
        bits: bits - n.trailing_zeros(),
        segments: n,
        carried: vec![],
    };
    Ok((keys, block))
}

/// A relation of `rows` rows shaped like `shape` on `b`; validity planes all valid (rows from
/// a part without one are).
fn allocate<B: Backend>(
    b: &B,
    shape: &[ColumnShape],
    rows: usize,
) -> Result<DeviceRelation<B::Buf>> {
    let columns = shape
        .iter()
        .map(|s| {
            let validity = match s.nullable {
                true => {
                    let mut v = b.alloc(rows)?;
                    b.fill(&mut v, 1)?;
                    Some(v)
                }
                false => None,
            };
            let col = DeviceColumn {
                kind: s.kind,
                values: b.alloc(rows * s.kind.width())?,
                validity,
                rows,
            };
            Ok((s.index, col))
        })
        .collect::<Result<_>>()?;
    Ok(DeviceRelation { columns, rows })
}

/// Enqueues on `from` the copy of rows `run` of every column of `r` into `dest` (on `to`'s
/// device) at row `at`.
fn copy_run<B: Backend>(
    from: &B,
    r: &Ordered<B>,
    shape: &[ColumnShape],
    run: Range<usize>,
    to: &B,
    dest: &mut Share<B>,
    at: usize,
) -> Result<()> {
    for (s, (values, validity)) in shape.iter().zip(&r.columns) {
        let col = dest
            .relation
            .columns
            .get_mut(&s.index)
            .expect("allocated for every column of the shape");
        let w = s.kind.width();
        from.copy_to_peer(
            values,
            run.start * w,
            to,
            &mut col.values,
            at * w,
            run.len() * w,
        )?;
        if let (Some(src), Some(dst)) = (validity, col.validity.as_mut()) {
            from.copy_to_peer(src, run.start, to, dst, at, run.len())?;
        }
    }
    Ok(())
}

/// Enqueues on `from` the copy of the keys (of `width`) of rows `run` of `r`, dealt out by
/// partition, into `dest` (on `to`'s device) at row `at`.
fn copy_keys<B: Backend>(
    from: &B,
    r: &Ordered<B>,
    width: KeyWidth,
    run: Range<usize>,
    to: &B,
    dest: &mut Share<B>,
    at: usize,
) -> Result<()> {
    match (&r.keys, dest.keys.as_mut()) {
        (Some(src), Some(dst)) => {
            let w = width.bytes();
            from.copy_to_peer(src, run.start * w, to, &mut dst.keys, at * w, run.len() * w)
        }
        _ => internal_err!("exchange: keys to copy, but not dealt out by partition"),
    }
}

/// The shapes of `columns` (in index order), which every relation must have alike; an error
/// where one lacks one or they differ in its kind.
fn shapes<Buf>(relations: &[DeviceRelation<Buf>], columns: &[usize]) -> Result<Vec<ColumnShape>> {
    let mut indices = columns.to_vec();
    indices.sort_unstable();
    indices.dedup();
    indices
        .into_iter()
        .map(|index| {
            let kind = relations[0].column(index)?.kind;
            let mut nullable = false;
            for r in relations {
                match r.columns.get(&index) {
                    Some(c) if c.kind == kind => nullable |= c.validity.is_some(),
                    _ => {
                        return plan_err!(
                            "exchange: the relations differ in column {index}, or one lacks it"
                        );
                    }
                }
            }
            Ok(ColumnShape {
                index,
                kind,
                nullable,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{Array, AsArray, Int32Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};

    use super::*;
    use crate::backend::{HostBackend, HostBuffer};
    use crate::columns::Fitted;

    fn batch(keys: Vec<Option<i64>>, tags: Vec<i32>) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("tag", DataType::Int32, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int32Array::from(tags)),
            ],
        )
        .unwrap()
    }

    /// Rows (key, tag) of a downloaded relation, in order.
    fn rows(b: &HostBackend, r: &DeviceRelation<HostBuffer>) -> Vec<(Option<i64>, i32)> {
        let schema = Arc::new(batch(vec![], vec![]).schema().as_ref().clone());
        let batches = r.download(b, &schema, 1 << 20).unwrap();
        batches
            .iter()
            .flat_map(|bt| {
                let k = bt.column(0).as_primitive::<Int64Type>().clone();
                let t = bt.column(1).as_primitive::<Int32Type>().clone();
                (0..bt.num_rows())
                    .map(move |i| (k.is_valid(i).then(|| k.value(i)), t.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn encoder_of(batches: &[RecordBatch]) -> KeyEncoder {
        let keys = vec![batches.iter().map(|b| b.column(0)).collect()];
        match KeyEncoder::fit(&keys, false).unwrap() {
            Fitted::Encoder(e) => e,
            _ => panic!("keys do not encode"),
        }
    }

    #[test]
    fn every_row_goes_to_the_one_device_of_its_key_in_order() {
        let backends = vec![HostBackend::default(); 3];
        // Source 0 has null keys, the others none: the destinations' validity planes mix both.
        let inputs = [
            batch(
                (0..500)
                    .map(|i| (i % 7 != 0).then_some(i * 13 % 97))
                    .collect(),
                (0..500).collect(),
            ),
            batch(
                (0..300).map(|i| Some(i * 31 % 97)).collect(),
                (1000..1300).collect(),
            ),
            batch(vec![], vec![]),
        ];
        let encoder = encoder_of(&inputs);
        let relations: Vec<_> = backends
            .iter()
            .zip(&inputs)
            .map(|(b, i)| DeviceRelation::upload(b, std::slice::from_ref(i), &[0, 1]).unwrap())
            .collect();
        let shares = exchange(&backends, &relations, &[0], &encoder).unwrap();
        let mut device_of_key: HashMap<Option<i64>, usize> = HashMap::new();
        let mut seen = vec![];
        for (d, (b, share)) in backends.iter().zip(&shares).enumerate() {
            let got = rows(b, share);
            assert_eq!(got.len(), share.rows);
            for &(k, tag) in &got {
                assert_eq!(
                    *device_of_key.entry(k).or_insert(d),
                    d,
                    "key {k:?} on two devices"
                );
                seen.push(tag);
            }
            // Source 0's rows first; the rows of one key in their source's order (stable).
            let sources: Vec<bool> = got.iter().map(|r| r.1 >= 1000).collect();
            assert!(sources.is_sorted(), "device {d}");
            let mut last: HashMap<Option<i64>, i32> = HashMap::new();
            for &(k, tag) in &got {
                assert!(last.insert(k, tag).is_none_or(|t| t < tag), "device {d}");
            }
        }
        seen.sort();
        let expected: Vec<i32> = (0..500).chain(1000..1300).collect();
        assert_eq!(seen, expected, "every row once");
        assert!(device_of_key.len() > 3 && shares.iter().all(|s| s.rows > 0));
    }

    #[test]
    fn sets_are_taken_in_any_order_once_each() {
        let backends = vec![HostBackend::default(); 2];
        let r = batch((0..100).map(Some).collect(), (0..100).collect());
        let s = batch(
            (0..300).map(|i| Some(i % 100)).collect(),
            (0..300).collect(),
        );
        let encoder = encoder_of(std::slice::from_ref(&r));
        let halves = |b: &RecordBatch| -> Vec<_> {
            let n = b.num_rows();
            backends
                .iter()
                .enumerate()
                .map(|(i, be)| {
                    let part = b.slice(i * n / 2, n / 2);
                    DeviceRelation::upload(be, &[part], &[0, 1]).unwrap()
                })
                .collect()
        };
        let (r_parts, s_parts) = (halves(&r), halves(&s));
        let sets = [
            ExchangeSet {
                parts: &r_parts,
                keys: &[0],
                columns: &[0, 1],
            },
            ExchangeSet {
                parts: &s_parts,
                keys: &[0],
                columns: &[0, 1],
            },
        ];
        let mut shares = exchange_sets(&backends, &sets, &encoder).unwrap();
        let (mut r_rows, mut s_rows) = (0, 0);
        for (b, d) in backends.iter().zip(shares.iter_mut()) {
            let s_share = d.take(1).unwrap();
            let r_share = d.take(0).unwrap();
            assert!(d.take(0).is_err(), "taken twice");
            // S's keys on this device are R's keys on this device (every S key is an R key).
            let r_keys: std::collections::HashSet<_> =
                rows(b, &r_share).into_iter().map(|r| r.0).collect();
            let s_keys: Vec<_> = rows(b, &s_share).into_iter().map(|r| r.0).collect();
            assert!(
                s_keys.iter().all(|k| r_keys.contains(k)),
                "{r_keys:?} {s_keys:?}"
            );
            (r_rows, s_rows) = (r_rows + r_share.rows, s_rows + s_share.rows);
        }
        assert_eq!((r_rows, s_rows), (100, 300));
        // Shares never taken are dropped with their exchange (on the host, whose work is done
        // when enqueued, this shows only that dropping them is clean).
        drop(exchange_sets(&backends, &sets, &encoder).unwrap());
    }

    #[test]
    fn partitions_go_to_their_device_in_a_segment_per_source() {
        let backends = vec![HostBackend::default(); 4];
        let parts: Vec<_> = (0..4)
            .map(|d| {
                let keys = (0..200).map(|i| Some((i * 7 + d * 3) % 150)).collect();
                batch(keys, (0..200).map(|i| i + 1000 * d as i32).collect())
            })
            .collect();
        let encoder = encoder_of(&parts);
        let relations: Vec<_> = backends
            .iter()
            .zip(&parts)
            .map(|(b, p)| DeviceRelation::upload(b, std::slice::from_ref(p), &[0, 1]).unwrap())
            .collect();
        let set = |columns| ExchangeSet {
            parts: &relations,
            keys: &[0],
            columns,
        };
        // By route, a share needs its key columns; by partition, it need not have them.
        assert!(exchange_sets(&backends, &[set(&[1])], &encoder).is_err());
        // Partitions are shared out evenly, so among a power of two devices.
        assert!(exchange_partitioned(&backends[..3], &[set(&[0, 1])], &encoder, 4).is_err());
        assert!(exchange_partitioned(&backends, &[set(&[0, 1])], &encoder, 1).is_err());
        let mut shares = exchange_partitioned(&backends, &[set(&[0, 1])], &encoder, 4).unwrap();
        assert!(shares[0].take(0).is_ok() && shares[1].take_partitioned(0).is_ok());
        let mut route = exchange_sets(&backends, &[set(&[0, 1])], &encoder).unwrap();
        assert!(route[0].take_partitioned(0).is_err(), "dealt out by route");
        // A source that cannot order its part (a key column it lacks): an error, from every
        // source's ordering thread, and nothing dealt out.
        let lacking = ExchangeSet {
            parts: &relations,
            keys: &[5],
            columns: &[1],
        };
        assert!(exchange_partitioned(&backends, &[set(&[1]), lacking], &encoder, 4).is_err());

        let mut shares = exchange_partitioned(&backends, &[set(&[0, 1])], &encoder, 4).unwrap();
        let mut device_of_key: HashMap<Option<i64>, usize> = HashMap::new();
        let mut total = 0;
        for (d, (b, share)) in backends.iter().zip(shares.iter_mut()).enumerate() {
            let t = share.take_partitioned(0).unwrap();
            assert_eq!((t.keys.bits, t.keys.segments), (2, 4));
            let bounds: Vec<u32> = t
                .keys
                .bounds
                .as_slice()
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let relation = DeviceRelation {
                columns: t.columns,
                rows: t.keys.rows,
            };
            let got = rows(b, &relation);
            // Segment s (5 bounds each) holds source s's rows of each partition, in order,
            // one after another.
            let mut at = 0;
            for (s, seg) in bounds.chunks_exact(5).enumerate() {
                assert_eq!(seg[0] as usize, at, "device {d} segment {s}");
                assert!(seg.is_sorted());
                for p in 0..4 {
                    for &(k, tag) in &got[seg[p] as usize..seg[p + 1] as usize] {
                        assert_eq!(tag / 1000, s as i32, "a row of source {s}");
                        assert_eq!(*device_of_key.entry(k).or_insert(d), d, "{k:?}");
                    }
                }
                at = seg[4] as usize;
            }
            assert_eq!(at, got.len());
            total += got.len();
        }
        assert_eq!(total, 800);
        assert!(device_of_key.len() == 150);
    }

    #[test]
    fn routes_share_out_evenly_in_one_run_per_device() {
        assert_eq!((route_bits(1), routes_of(0, 1)), (0, 0..1));
        assert_eq!((route_bits(2), routes_of(1, 2)), (1, 1..2));
        assert_eq!((route_bits(4), routes_of(2, 4)), (2, 2..3));
        assert_eq!(route_bits(3), MAX_ROUTE_BITS);
        let three: Vec<_> = (0..3).map(|d| routes_of(d, 3)).collect();
        assert_eq!(three, vec![0..85, 85..170, 170..256]);
    }

    #[test]
    fn relations_must_match_their_backends_and_each_other() {
        let b = HostBackend::default();
        let one = batch(vec![Some(1)], vec![1]);
        let encoder = encoder_of(std::slice::from_ref(&one));
        let r = DeviceRelation::upload(&b, std::slice::from_ref(&one), &[0, 1]).unwrap();
        let narrow = DeviceRelation::upload(&b, std::slice::from_ref(&one), &[0]).unwrap();
        let two = [b.clone(), b.clone()];
        assert!(exchange(&two, std::slice::from_ref(&r), &[0], &encoder).is_err());
        assert!(exchange(&two, &[r, narrow], &[0], &encoder).is_err());
    }
}
