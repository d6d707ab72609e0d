//! squeal's native binlog reader (a Python extension module, compiled by squeal's install through setuptools-rust).
//!
//! `NativeStream` reads one MariaDB binlog connection on a Rust thread (`stream`) and hands Python
//! squeal's plain events (`squeal.read.transactions`) in batches: `next_batch` waits for events with the GIL
//! released and takes it once per batch to build the Python objects. Row events of ruled tables arrive
//! already rendered to keys and encoded as delete lines (`keys`, `lines`). Ordinary transactions (rows and an
//! XID, nothing to decide) are grouped here and handed on as runs: consecutive ones waiting in the queue become
//! one Python object with their delete lines and the position they reach. XA, savepoints, DDL, comments,
//! cascades, huge transactions, reconnects and positions stay in Python (`squeal.read.native.NativeBinlogReader`,
//! `squeal.read.transactions`).

pub mod conn;
pub mod delivery;
pub mod filter;
pub mod flow;
pub mod keys;
pub mod lines;
pub mod link;
pub mod stream;

#[cfg(feature = "python")]
mod python_delivery;
#[cfg(feature = "python")]
mod python_flow;

#[cfg(feature = "python")]
mod python {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{sync_channel, Receiver};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use pyo3::create_exception;
    use pyo3::exceptions::{PyException, PyValueError};
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyList, PyString, PyTuple};

    use crate::conn::Tls;
    use crate::keys::{Charset, FilterSpec, Rules, Template};
    use crate::stream::{self, Kind, Out, Settings, Shared, Whole};

    create_exception!(
        squeal_native,
        NativeStreamError,
        PyException,
        "The binlog stream ended: args are (code, message); code is the server's error code (1236: the \
         position is gone), 2013 for a lost connection, -2 for a rule this reader cannot render."
    );

    /// (Begin, Annotate, Rows, Commit, Query, XaPrepare, the LINES kind) from Python.
    type EventClasses = (
        Py<PyAny>,
        Py<PyAny>,
        Py<PyAny>,
        Py<PyAny>,
        Py<PyAny>,
        Py<PyAny>,
        String,
    );

    /// TLS to the server: (CA file, squeal's certificate file, its key file); None: plaintext.
    type TlsArg = (Option<String>, Option<String>, Option<String>);

    /// (schema, table, watched columns, where steps as (op, column, literal)).
    type FilterArg = (String, String, Vec<String>, Vec<(String, String, String)>);

    /// The Python classes the events are built with (`squeal.read.transactions`).
    struct Factories {
        begin: Py<PyAny>,
        annotate: Py<PyAny>,
        rows: Py<PyAny>,
        commit: Py<PyAny>, // one instance: Commit() has no fields
        query: Py<PyAny>,
        xa_prepare: Py<PyAny>,
        kinds: [Py<PyString>; 4], // insert, update, delete, and the LINES kind
        run: Option<Py<PyAny>>,   // squeal.read.transactions.CommittedRun
    }

    /// A run is closed at this many delete lines and the next one begins: Python's hand-off and flows weigh
    /// an item by its lines (a reactor turn takes ~8,192: `HandoffGroup.chunk_keys`).
    const RUN_LINES: usize = 8192;

    /// Consecutive whole transactions of one `next_batch`, becoming one `CommittedRun`.
    #[derive(Default)]
    struct Run {
        position: BTreeMap<u32, (u32, u64)>,
        last: (u32, u32, u64),
        first_ts: u32,
        last_ts: u32,
        transactions: u64,
        changed: u64,
        cluster: Joined,
        regional: Joined,
    }

    /// A run's delete lines of one kind end to end, and where each ends (`squeal.read.transactions.JoinedLines`):
    /// two Python objects per kind and run instead of one per line.
    #[derive(Default)]
    struct Joined {
        data: Vec<u8>,
        ends: Vec<u32>,
    }

    impl Joined {
        fn extend(&mut self, lines: Vec<Vec<u8>>) {
            for line in lines {
                self.data.extend_from_slice(&line);
                // A run holds at most RUN_LINES lines plus one transaction of at most `whole_up_to` (each line
                // a key of at most 250 bytes): far below 4 GiB.
                self.ends.push(self.data.len() as u32);
            }
        }

        fn build<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
            let ends: Vec<u8> = self.ends.iter().flat_map(|e| e.to_ne_bytes()).collect();
            (PyBytes::new(py, &self.data), PyBytes::new(py, &ends))
        }
    }

    impl Run {
        fn lines(&self) -> usize {
            self.cluster.ends.len() + self.regional.ends.len()
        }

        fn add(&mut self, w: Whole) {
            let g = w.gtid;
            if self.transactions == 0 {
                self.first_ts = g.timestamp;
            }
            self.transactions += 1;
            self.last_ts = g.timestamp;
            self.last = (g.domain, g.server, g.seq);
            self.position.insert(g.domain, (g.server, g.seq)); // (sequence numbers grow within a domain)
            self.changed += w.changed;
            self.cluster.extend(w.lines.0);
            self.regional.extend(w.lines.1);
        }

        fn build<'py>(self, py: Python<'py>, class: &Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
            let position = PyDict::new(py);
            for (domain, at) in &self.position {
                position.set_item(domain, at)?;
            }
            class.bind(py).call1((
                position,
                self.last,
                self.first_ts as f64,
                self.last_ts as f64,
                self.transactions,
                self.changed,
                self.cluster.build(py),
                self.regional.build(py),
            ))
        }
    }

    #[pyclass(module = "squeal_native", frozen)]
    pub struct NativeStream {
        rx: Mutex<Receiver<Out>>,
        busy: AtomicBool, // the last batch held more than one event: the next one lingers (`next_batch`)
        shared: Arc<Shared>,
        factories: Factories,
        error: Mutex<Option<(i64, String)>>,
    }

    fn text_or_escape<'py>(py: Python<'py>, b: &[u8], errors: &str) -> PyResult<Bound<'py, PyAny>> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(PyString::new(py, s).into_any()),
            Err(_) => PyBytes::new(py, b).call_method1("decode", ("utf-8", errors)),
        }
    }

    #[pymethods]
    impl NativeStream {
        /// Starts reading after GTID `position` ("D-S-N,...") on a thread of its own.
        ///
        /// `rules`: [(schema, table, [template, ...])]; `read_tables`: the (schema, table) pairs whose rows the
        /// Python reader would decode; `parents`: parents of cascading foreign keys; `charsets`: collation id
        /// -> "text" | "raw" | "cp1252" | "unsupported"; `events`: (Begin, Annotate, Rows, Commit, Query, XaPrepare,
        /// LINES); `filters`: [(schema, table, watched columns, where steps)] (`Rule.watched`,
        /// `Predicate.steps`); `regional_prefixes`: keys for the regional pool only; `tls`: (CA, certificate,
        /// key) files to dial with TLS, verifying the server (None: plaintext); `run`: the `CommittedRun` class,
        /// to hand on ordinary transactions with at most `whole_up_to` delete lines as runs (None: every
        /// transaction as plain events).
        #[new]
        #[pyo3(signature = (host, port, user, password, server_id, position, rules, read_tables, parents,
                            charsets, events, heartbeat=1.0, queue=256, filters=Vec::new(),
                            regional_prefixes=Vec::new(), tls=None, run=None, whole_up_to=8192))]
        #[allow(clippy::too_many_arguments)]
        fn new(
            py: Python<'_>,
            host: String,
            port: u16,
            user: String,
            password: String,
            server_id: u32,
            position: String,
            rules: Vec<(String, String, Vec<String>)>,
            read_tables: Vec<(String, String)>,
            parents: Vec<(String, String)>,
            charsets: HashMap<u16, String>,
            events: EventClasses,
            heartbeat: f64,
            queue: usize,
            filters: Vec<FilterArg>,
            regional_prefixes: Vec<String>,
            tls: Option<TlsArg>,
            run: Option<Py<PyAny>>,
            whole_up_to: usize,
        ) -> PyResult<Self> {
            if !(heartbeat > 0.0 && heartbeat < 4_000_000.0) {
                return Err(PyValueError::new_err("heartbeat must be > 0 seconds"));
            }
            let mut r = Rules::default();
            for (schema, table, templates) in rules {
                r.templates.insert(
                    (schema, table),
                    templates.iter().map(|t| Template::compile(t)).collect(),
                );
            }
            for (schema, table) in read_tables {
                r.schemas.insert(schema);
                r.names.insert(table);
            }
            r.parents = parents.into_iter().collect();
            r.regional_prefixes = regional_prefixes
                .into_iter()
                .map(String::into_bytes)
                .collect();
            for (schema, table, watched, steps) in filters {
                r.filters
                    .insert((schema, table), FilterSpec { watched, steps });
            }
            for (id, how) in charsets {
                let c = match how.as_str() {
                    "text" => Charset::Text,
                    "raw" => Charset::Raw,
                    "cp1252" => Charset::Cp1252,
                    _ => Charset::Unsupported,
                };
                r.charsets.insert(id, c);
            }
            let (begin, annotate, rows, commit, query, xa_prepare, lines_kind) = events;
            let factories = Factories {
                begin,
                annotate,
                rows,
                commit: commit.call0(py)?,
                query,
                xa_prepare,
                kinds: [
                    PyString::new(py, "insert").unbind(),
                    PyString::new(py, "update").unbind(),
                    PyString::new(py, "delete").unbind(),
                    PyString::new(py, &lines_kind).unbind(),
                ],
                run,
            };
            let settings = Settings {
                host,
                port,
                user,
                password,
                server_id,
                position,
                heartbeat: Duration::from_secs_f64(heartbeat),
                whole_up_to: if factories.run.is_some() {
                    whole_up_to
                } else {
                    0
                },
                tls: tls.map(|(ca, cert, key)| Tls {
                    ca: ca.map(Into::into),
                    cert: cert.map(Into::into),
                    key: key.map(Into::into),
                }),
            };
            let shared = Arc::new(Shared::default());
            let (tx, rx) = sync_channel(queue.max(1));
            let rules = Arc::new(r);
            let thread_shared = shared.clone();
            std::thread::Builder::new()
                .name("squeal-native-binlog".into())
                .spawn(move || stream::run(settings, rules, thread_shared, tx))
                .map_err(|e| {
                    PyException::new_err(format!("cannot start the reader thread: {e}"))
                })?;
            Ok(NativeStream {
                rx: Mutex::new(rx),
                busy: AtomicBool::new(false),
                shared,
                factories,
                error: Mutex::new(None),
            })
        }

        /// Up to `max_events` events, waiting at most `timeout` seconds for the first (GIL released).
        /// [] when none came in time, None once stopped; raises NativeStreamError when the stream ended.
        /// `linger`: on a busy stream (the last batch held more than one event), sleep this many seconds after
        /// the first event and take what came meanwhile, so its whole transactions make runs of dozens, not of the
        /// two or three decoded since the last call (the consumer is woken per network read otherwise). The first
        /// event is never held: a lone transaction on a quiet stream is handed on at once (`stream::take_batch`).
        #[pyo3(signature = (max_events=1024, timeout=0.5, linger=0.0))]
        fn next_batch<'py>(
            &self,
            py: Python<'py>,
            max_events: usize,
            timeout: f64,
            linger: f64,
        ) -> PyResult<Option<Bound<'py, PyList>>> {
            if let Some((code, message)) = self.error.lock().unwrap().take() {
                return Err(NativeStreamError::new_err((code, message)));
            }
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let outs = py.detach(|| self.wait(max_events, timeout, linger));
            let list = PyList::empty(py);
            let f = &self.factories;
            let mut run = Run::default();
            for out in outs {
                if let Out::Whole(w) = out {
                    if run.lines() >= RUN_LINES {
                        let class = f
                            .run
                            .as_ref()
                            .expect("whole transactions only when asked for");
                        list.append(std::mem::take(&mut run).build(py, class)?)?;
                    }
                    run.add(w);
                    continue;
                }
                if run.transactions > 0 {
                    let class = f
                        .run
                        .as_ref()
                        .expect("whole transactions only when asked for");
                    list.append(std::mem::take(&mut run).build(py, class)?)?;
                }
                let item: Bound<'py, PyAny> = match out {
                    Out::Connected => continue,
                    Out::Whole(_) => unreachable!("taken above"),
                    Out::Begin {
                        domain,
                        server,
                        seq,
                        timestamp,
                        standalone,
                        prepared_xa,
                    } => f.begin.bind(py).call1((
                        (domain, server, seq),
                        timestamp as f64,
                        standalone,
                        prepared_xa,
                    ))?,
                    Out::Annotate(sql) => f.annotate.bind(py).call1((PyBytes::new(py, &sql),))?,
                    Out::Rows {
                        schema,
                        table,
                        kind,
                        lines,
                        changed,
                        columns,
                    } => {
                        let (kind, images) = match kind {
                            Kind::Insert => (&f.kinds[0], PyTuple::empty(py)),
                            Kind::Update => (&f.kinds[1], PyTuple::empty(py)),
                            Kind::Delete => (&f.kinds[2], PyTuple::empty(py)),
                            Kind::Lines => {
                                let bytes = |v: &Vec<Vec<u8>>| {
                                    PyTuple::new(py, v.iter().map(|l| PyBytes::new(py, l)))
                                };
                                let pair = (bytes(&lines.0)?, bytes(&lines.1)?);
                                (&f.kinds[3], PyTuple::new(py, [pair.0, pair.1])?)
                            }
                        };
                        f.rows.bind(py).call1((
                            PyString::new(py, &schema),
                            PyString::new(py, &table),
                            kind.bind(py),
                            images,
                            changed,
                            match columns {
                                Some(c) => Some(PyFrozenSet::new(py, &c)?),
                                None => None,
                            },
                        ))?
                    }
                    Out::Commit => f.commit.bind(py).clone(),
                    Out::Query { sql, schema } => f.query.bind(py).call1((
                        text_or_escape(py, &sql, "backslashreplace")?,
                        String::from_utf8_lossy(&schema).into_owned(),
                    ))?,
                    Out::XaPrepare(xid) => f.xa_prepare.bind(py).call1((xid,))?,
                    Out::Error { code, message } => {
                        if list.is_empty() {
                            return Err(NativeStreamError::new_err((code, message)));
                        }
                        *self.error.lock().unwrap() = Some((code, message));
                        break;
                    }
                };
                list.append(item)?;
            }
            if run.transactions > 0 {
                let class = f
                    .run
                    .as_ref()
                    .expect("whole transactions only when asked for");
                list.append(run.build(py, class)?)?;
            }
            Ok(Some(list))
        }

        /// Ends the stream (from any thread): a blocked `next_batch` returns within its timeout.
        fn stop(&self) {
            self.shared.request_stop();
        }

        #[getter]
        fn connected(&self) -> bool {
            self.shared.connected.load(Ordering::SeqCst)
        }

        /// Keys rendered again within their event group (dropped there), since the start.
        #[getter]
        fn duplicates(&self) -> u64 {
            self.shared.duplicates.load(Ordering::Relaxed)
        }

        /// (base64, hashed): keys sent in another form than plain (`squeal_keys_rewritten_total`), since the
        /// start.
        #[getter]
        fn rewritten(&self) -> (u64, u64) {
            (
                self.shared.base64.load(Ordering::Relaxed),
                self.shared.hashed.load(Ordering::Relaxed),
            )
        }

        /// [(schema, table, column, template, times)]: templates that met a column their row lacks, since the
        /// last call.
        fn take_missing(&self) -> Vec<(String, String, String, String, u64)> {
            let mut m = self.shared.missing.lock().unwrap();
            m.drain()
                .map(|((s, t, c, tpl), n)| (s, t, c, tpl, n))
                .collect()
        }

        /// [(schema, table, reason, rows)]: rows a rule's filter kept from sending keys, since the last call.
        fn take_filtered(&self) -> Vec<(String, String, &'static str, u64)> {
            let mut f = self.shared.filtered.lock().unwrap();
            f.drain().map(|((s, t, why), n)| (s, t, why, n)).collect()
        }
    }

    impl NativeStream {
        fn wait(&self, max_events: usize, timeout: f64, linger: f64) -> Vec<Out> {
            let rx = self.rx.lock().unwrap();
            let busy = self.busy.load(Ordering::Relaxed);
            let outs = stream::take_batch(
                &rx,
                &self.shared.stop,
                max_events,
                Duration::from_secs_f64(timeout.max(0.0)),
                busy.then(|| Duration::from_secs_f64(linger.max(0.0))),
            );
            self.busy.store(outs.len() > 1, Ordering::Relaxed);
            outs
        }
    }

    impl Drop for NativeStream {
        fn drop(&mut self) {
            self.shared.request_stop();
        }
    }

    #[pymodule]
    fn squeal_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<NativeStream>()?;
        m.add_class::<crate::python_flow::NativeFlow>()?;
        m.add_class::<crate::python_flow::NativeBatch>()?;
        m.add_class::<crate::python_delivery::NativeDelivery>()?;
        m.add("NativeStreamError", m.py().get_type::<NativeStreamError>())?;
        m.add("ERR_UNSUPPORTED", stream::ERR_UNSUPPORTED)?;
        Ok(())
    }
}
