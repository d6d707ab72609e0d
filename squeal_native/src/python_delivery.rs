//! `squeal_native.NativeDelivery`: the delivery thread (delivery.rs) for Python. `squeal.delivery.native` wraps it
//! in the interface the daemon already uses for flows and senders.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::conn::Tls;
use crate::delivery::{committed, Delivery, Histogram, Offer, Settings};
use crate::flow::{Gtid, Lines, Position};

#[pyclass(module = "squeal_native")]
pub struct NativeDelivery {
    inner: Delivery,
}

/// A transaction's lines for one kind of destination: `squeal.read.transactions.JoinedLines` (its `data` and
/// `ends` buffers, taken as they are) or a sequence of bytes, one per line.
fn lines(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Lines> {
    if let (Ok(data), Ok(ends)) = (obj.getattr("data"), obj.getattr("ends")) {
        let data = data.cast::<PyBytes>()?.as_bytes().to_vec();
        let ends = PyBuffer::<u32>::get(&ends)?.to_vec(py)?;
        return Lines::from_parts(data, ends).ok_or_else(|| {
            PyValueError::new_err("joined lines whose ends do not match their data")
        });
    }
    let mut out = Lines::default();
    for line in obj.try_iter()? {
        out.push(line?.cast::<PyBytes>()?.as_bytes());
    }
    Ok(out)
}

fn histogram(py: Python<'_>, h: &Histogram) -> PyResult<Py<PyAny>> {
    Ok((h.counts.clone(), h.sum)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

fn missing(id: usize) -> PyErr {
    PyValueError::new_err(format!("no native flow {id}"))
}

#[pymethods]
impl NativeDelivery {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (batch_size, flush_interval, reply_timeout, max_in_flight, latency_buckets, batch_buckets, sample_every, backoff_initial=0.05, backoff_max=5.0, tls_ca=None, tls_cert=None, tls_key=None))]
    fn new(
        batch_size: usize,
        flush_interval: f64,
        reply_timeout: f64,
        max_in_flight: usize,
        latency_buckets: Vec<f64>,
        batch_buckets: Vec<f64>,
        sample_every: u64,
        backoff_initial: f64,
        backoff_max: f64,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Self> {
        let seconds = |s: f64| {
            Duration::try_from_secs_f64(s.max(0.0))
                .map_err(|e| PyValueError::new_err(e.to_string()))
        };
        let settings = Settings {
            batch_size: batch_size.max(1),
            flush_interval: seconds(flush_interval)?,
            reply_timeout: seconds(reply_timeout)?,
            max_in_flight,
            backoff_initial: seconds(backoff_initial)?,
            backoff_max: seconds(backoff_max)?,
            latency_buckets,
            batch_buckets,
            sample_every,
        };
        let tls = tls_ca.map(|ca| Tls {
            ca: Some(ca),
            cert: tls_cert,
            key: tls_key,
        });
        let inner = Delivery::new(settings, tls).map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(NativeDelivery { inner })
    }

    /// A shard's flow to destination `dest` (its routers); the flow's id.
    fn add_flow(
        &self,
        dest: &str,
        routers: Vec<(String, u16)>,
        regional: bool,
        shard: &str,
        start: Position,
        max_backlog: usize,
    ) -> PyResult<usize> {
        self.inner
            .add_flow(dest, routers, regional, shard, start, max_backlog)
            .map_err(PyValueError::new_err)
    }

    fn remove_flow(&self, id: usize) {
        self.inner.remove_flow(id);
    }

    /// Offer one committed transaction (or run) to flows `ids`; the ids of the flows it shed.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (ids, live, gtid, commit_ts, read_ts, cluster_lines, regional_lines, flush=false, position=None, partial=false, rows_from=0, rows_to=0, transactions=1))]
    fn offer(
        &self,
        py: Python<'_>,
        ids: Vec<usize>,
        live: bool,
        gtid: Gtid,
        commit_ts: f64,
        read_ts: f64,
        cluster_lines: &Bound<'_, PyAny>,
        regional_lines: &Bound<'_, PyAny>,
        flush: bool,
        position: Option<Position>,
        partial: bool,
        rows_from: u64,
        rows_to: u64,
        transactions: u32,
    ) -> PyResult<Vec<usize>> {
        let make = |l: Lines| {
            committed(
                gtid,
                (commit_ts, read_ts),
                Arc::new(l),
                flush,
                position.clone(),
                (partial, rows_from, rows_to),
                transactions,
            )
        };
        let offer = Offer {
            cluster: make(lines(py, cluster_lines)?),
            regional: make(lines(py, regional_lines)?),
        };
        Ok(self.inner.offer(&ids, &offer, live))
    }

    /// (acked, enqueued, backlog, state, queued entries, batches in flight, epoch, oldest queued commit time,
    /// last acknowledged commit time) of flow `id`.
    #[allow(clippy::type_complexity)]
    fn flow(
        &self,
        id: usize,
    ) -> PyResult<(
        Position,
        Position,
        usize,
        &'static str,
        usize,
        usize,
        u64,
        Option<f64>,
        Option<f64>,
    )> {
        self.inner
            .with_flow(id, |v| {
                let last = v.last_acked_commit_ts();
                let f = v.flow();
                (
                    f.acked.clone(),
                    f.enqueued.clone(),
                    f.backlog,
                    f.state.name(),
                    f.queued(),
                    f.in_flight(),
                    f.epoch,
                    f.oldest_commit_ts(),
                    last,
                )
            })
            .ok_or_else(|| missing(id))
    }

    fn acked(&self, id: usize) -> PyResult<Position> {
        self.inner
            .with_flow(id, |v| v.flow().acked.clone())
            .ok_or_else(|| missing(id))
    }

    fn backlog(&self, id: usize) -> usize {
        self.inner.with_flow(id, |v| v.flow().backlog).unwrap_or(0)
    }

    fn dirty(&self, id: usize) -> bool {
        self.inner.with_flow(id, |v| v.dirty()).unwrap_or(false)
    }

    fn set_dirty(&self, id: usize, dirty: bool) {
        self.inner.with_flow(id, |v| {
            if dirty {
                v.set_dirty();
            } else {
                v.take_dirty();
            }
        });
    }

    /// Enter catch-up: the position its reader starts from.
    fn start_catchup(&self, id: usize) -> PyResult<Position> {
        self.inner
            .with_flow(id, |v| v.flow().start_catchup())
            .ok_or_else(|| missing(id))
    }

    #[pyo3(signature = (id, live, live_pieces=None))]
    fn caught_up(&self, id: usize, live: Position, live_pieces: Option<Gtid>) -> bool {
        self.inner
            .with_flow(id, |v| v.flow().caught_up(&live, live_pieces))
            .unwrap_or(false)
    }

    fn rejoin(&self, id: usize) {
        self.inner.with_flow(id, |v| v.flow().rejoin());
    }

    /// Drop flow `id`'s queue (from `rewind`'s position when given); a catch-up reader re-reads it.
    #[pyo3(signature = (id, rewind=None))]
    fn shed(&self, id: usize, rewind: Option<Position>) {
        self.inner.shed(id, rewind);
    }

    /// Wait (without the GIL) until flow `id` holds at most `bound` unacknowledged lines, at most `timeout` s.
    fn wait_room(&self, py: Python<'_>, id: usize, bound: usize, timeout: f64) -> bool {
        let timeout = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        py.detach(|| self.inner.wait_room(id, bound, timeout))
    }

    /// Shard `shard` may send for `seconds` from now (0: not at all; None: no gate).
    #[pyo3(signature = (shard, seconds))]
    fn set_window(&self, shard: &str, seconds: Option<f64>) {
        self.inner.set_window(shard, seconds);
    }

    fn drained(&self, dest: &str) -> bool {
        self.inner.drained(dest)
    }

    /// Counters since the last call: ([(flow id, deletes, flushes, {error: n}, (counts, sum) of the commit latency,
    /// (counts, sum) of the delivery latency)], [(destination, writes, (counts, sum) of deletes per write, retries)]).
    #[allow(clippy::type_complexity)]
    fn take_stats<'py>(&self, py: Python<'py>) -> PyResult<(Vec<Py<PyAny>>, Vec<Py<PyAny>>)> {
        let (flows, dests) = self.inner.take_stats();
        let mut fs = Vec::with_capacity(flows.len());
        for (id, s) in flows {
            let errors = PyDict::new(py);
            for (k, v) in &s.reply_errors {
                errors.set_item(k, v)?;
            }
            let t = (
                id,
                s.deletes,
                s.flushes,
                errors,
                histogram(py, &s.latency)?,
                histogram(py, &s.delivery)?,
            );
            fs.push(t.into_pyobject(py)?.into_any().unbind());
        }
        let mut ds = Vec::with_capacity(dests.len());
        for (name, s) in dests {
            let t = (name, s.writes, histogram(py, &s.per_write)?, s.retries);
            ds.push(t.into_pyobject(py)?.into_any().unbind());
        }
        Ok((fs, ds))
    }

    /// Log lines since the last call: (logging level, message).
    fn take_log(&self) -> Vec<(u8, String)> {
        self.inner.take_log()
    }

    /// Sampled acknowledged deletes since the last call: (destination, key, acknowledged at).
    fn take_samples(&self) -> Vec<(String, String, f64)> {
        self.inner.take_samples()
    }

    /// Stop the delivery thread (nothing more is sent).
    fn stop(&mut self, py: Python<'_>) {
        let inner = &mut self.inner;
        py.detach(|| inner.stop());
    }
}
