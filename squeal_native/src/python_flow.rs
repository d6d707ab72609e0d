//! `squeal_native.NativeFlow`: the Rust flow (flow.rs) for Python, so the differential test can hold it to
//! `squeal.delivery.flows.Flow` operation by operation. Not used by the daemon yet (stage 2 wires it with the
//! connections).

use std::collections::BTreeMap;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::delivery;
use crate::flow::{Batch, Committed, Flow, Gtid, Lines, Offered, Position};

#[pyclass(module = "squeal_native")]
pub struct NativeBatch {
    inner: Batch,
}

#[pymethods]
impl NativeBatch {
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.payload)
    }

    #[getter]
    fn nkeys(&self) -> usize {
        self.inner.nkeys
    }

    #[getter]
    fn flushes(&self) -> usize {
        self.inner.flushes
    }
}

#[pyclass(module = "squeal_native")]
pub struct NativeFlow {
    inner: Flow,
}

fn offered(o: Offered) -> &'static str {
    match o {
        Offered::Ignored => "ignored",
        Offered::Done => "done",
        Offered::Queued => "queued",
        Offered::Shed => "shed",
    }
}

#[allow(clippy::too_many_arguments)] // (the fields of squeal.delivery.flows.Committed, one flow's lines)
fn committed(
    gtid: Gtid,
    commit_ts: f64,
    read_ts: f64,
    lines: Vec<Vec<u8>>,
    flush: bool,
    position: Option<Position>,
    partial: bool,
    rows_from: u64,
    rows_to: u64,
    transactions: u32,
) -> Committed {
    let lines = Arc::new(lines.iter().collect::<Lines>());
    delivery::committed(
        gtid,
        (commit_ts, read_ts),
        lines,
        flush,
        position,
        (partial, rows_from, rows_to),
        transactions,
    )
}

#[pymethods]
impl NativeFlow {
    #[new]
    fn new(start: BTreeMap<u32, (u32, u64)>, max_backlog: usize) -> Self {
        NativeFlow {
            inner: Flow::new(start, max_backlog),
        }
    }

    /// Offer a transaction from the live stream (`live`) or a catch-up reader, as `NativeDelivery.offer` takes
    /// it: "ignored", "done", "queued" or "shed".
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (live, gtid, commit_ts, read_ts, lines, flush=false, position=None, partial=false, rows_from=0, rows_to=0, transactions=1))]
    fn offer(
        &mut self,
        live: bool,
        gtid: Gtid,
        commit_ts: f64,
        read_ts: f64,
        lines: Vec<Vec<u8>>,
        flush: bool,
        position: Option<Position>,
        partial: bool,
        rows_from: u64,
        rows_to: u64,
        transactions: u32,
    ) -> &'static str {
        let c = committed(
            gtid,
            commit_ts,
            read_ts,
            lines,
            flush,
            position,
            partial,
            rows_from,
            rows_to,
            transactions,
        );
        offered(if live {
            self.inner.offer_live(&c)
        } else {
            self.inner.offer_catchup(&c)
        })
    }

    fn take_batch(&mut self, batch_size: usize, max_in_flight: usize) -> Option<NativeBatch> {
        self.inner
            .take_batch(batch_size, max_in_flight)
            .map(|inner| NativeBatch { inner })
    }

    /// (commit_ts, read_ts, transactions) of each transaction or run the acknowledgement completed.
    fn ack(&mut self, batch: &NativeBatch) -> Vec<(f64, f64, u32)> {
        self.inner
            .ack(&batch.inner)
            .into_iter()
            .map(|c| (c.commit_ts, c.read_ts, c.transactions))
            .collect()
    }

    fn fail(&mut self, batch: &NativeBatch) {
        self.inner.fail(&batch.inner);
    }

    fn shed(&mut self) {
        self.inner.shed();
    }

    fn start_catchup(&mut self) -> Position {
        self.inner.start_catchup()
    }

    #[pyo3(signature = (live, live_pieces=None))]
    fn caught_up(&self, live: Position, live_pieces: Option<Gtid>) -> bool {
        self.inner.caught_up(&live, live_pieces)
    }

    fn rejoin(&mut self) {
        self.inner.rejoin();
    }

    #[getter]
    fn acked(&self) -> Position {
        self.inner.acked.clone()
    }

    #[getter]
    fn enqueued(&self) -> Position {
        self.inner.enqueued.clone()
    }

    #[getter]
    fn backlog(&self) -> usize {
        self.inner.backlog
    }

    #[getter]
    fn pending_keys(&self) -> usize {
        self.inner.pending_keys()
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// "live", "shed" or "catching_up", as `squeal.delivery.flows` names them.
    #[getter]
    fn state(&self) -> &'static str {
        self.inner.state.name()
    }
}
