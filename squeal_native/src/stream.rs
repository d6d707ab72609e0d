//! The binlog read on a thread of its own: connect, ask for the binlog from a GTID position, turn events
//! into `Out` items (squeal's plain events, with rows already rendered to keys) and queue them.
//!
//! Transaction semantics stay in Python (`squeal.read.transactions.TransactionGrouper`) for every transaction that
//! needs them. An *ordinary* transaction — a GTID event that is neither standalone (DDL) nor an XA PREPARE
//! group, then row events of tables with rules or without, then its XID — comes as one `Out::Whole` instead
//! of Begin, rows and Commit (`Settings::whole_up_to`): its delete lines and its GTID, nothing for Python to
//! decide. The first event that needs a decision (a `/* mcd: */` comment, any query event, an XA PREPARE, a
//! row of a cascading foreign key's parent, a new GTID before the XID) or more delete lines than
//! `whole_up_to` (a huge transaction, which Python hands on in pieces) makes the reader hand on what it
//! withheld as the plain events below and go on with those until the next GTID event.
//!
//! The plain events are the ones `squeal.read.reader.convert` yields, with these differences, none of which
//! changes a transaction's keys:
//! * Rows of tables with rules come as delete lines (kind `LINES`: the keys deduplicated within the event
//!   group as `KeyStage.render` does, encoded as `rules.delete_line` does, split into cluster and regional
//!   lines as `flows.split_keys` does); consecutive ones are merged into one event (up to `MERGE_KEYS`).
//! * Rows of other tables are skipped undecoded, except parents of cascading foreign keys, which still give
//!   an event with their row kind and no images (`BulkDetector.cascaded` needs the kind), and for an update
//!   the columns it changed (only a change of a referenced column cascades).
//! * Annotate events are passed on only when their statement contains `mcd:` (the only thing squeal reads
//!   from them: `rules.comment_keys`).
//!
//! Reconnects are Python's: any error ends this stream with an `Out::Error`, and squeal opens a new one
//! from its last committed GTID.

use std::collections::{HashMap, HashSet};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_common::binlog::consts::{BinlogVersion, EventType};
use mysql_common::binlog::events::{Event, EventData, QueryEvent, RowsEventData, TableMapEvent};
use mysql_common::binlog::EventStreamReader;
use mysql_common::io::ParseBuf;

use crate::conn::{Conn, ConnError, Tls};
use crate::filter::{Decision, Image, Skip};
use crate::keys::{read_image, render, Plan, Rendered, Rules};
use crate::lines::{delete_line, Encoding};

/// MariaDB event types mysql_common does not name.
const MARIA_ANNOTATE_ROWS: u8 = 0xa0;
const MARIA_GTID: u8 = 0xa2;
/// Compressed row/query events (`log_bin_compress`): not decoded here.
const MARIA_COMPRESSED: [u8; 7] = [0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab];

/// WRITE/UPDATE/DELETE_ROWS_EVENT_V1 (MariaDB's) and their v2 forms.
const ROWS_EVENTS: [u8; 6] = [0x17, 0x18, 0x19, 0x1e, 0x1f, 0x20];

/// A merged rendered-rows event is flushed when it holds this many keys.
const MERGE_KEYS: usize = 4096;

/// Error codes of `Out::Error` that are not the server's.
pub const ERR_UNSUPPORTED: i64 = -2; // a rule this reader cannot render exactly: no point reconnecting
pub const ERR_IO: i64 = 2013; // lost connection (like the client library's CR_SERVER_LOST)

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Insert,
    Update,
    Delete,
    Lines,
}

#[derive(Debug)]
pub enum Out {
    Connected,
    Begin {
        domain: u32,
        server: u32,
        seq: u64,
        timestamp: u32,
        standalone: bool,
        /// An XA PREPARE group (FL_PREPARED_XA): its rows are not committed yet.
        prepared_xa: bool,
    },
    Annotate(Vec<u8>),
    Rows {
        schema: Arc<str>,
        table: Arc<str>,
        kind: Kind,
        /// Delete lines for every cluster, and for the regional pool only (kind `Lines`; else empty).
        lines: Lines,
        changed: u64,
        /// A parent's update: the columns (lower case) whose value it changed in some row (the cascade check).
        columns: Option<Vec<String>>,
    },
    Commit,
    /// An ordinary transaction read whole (Begin, rows and commit at once).
    Whole(Whole),
    Query {
        sql: Vec<u8>,
        schema: Vec<u8>,
    },
    XaPrepare(String),
    Error {
        code: i64,
        message: String,
    },
}

/// Delete lines: (for every cluster, for the regional pool only).
pub type Lines = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// A GTID event, not yet handed on: its transaction may still come whole.
#[derive(Debug, Clone, Copy)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
    pub timestamp: u32,
}

#[derive(Debug)]
pub struct Whole {
    pub gtid: Gtid,
    pub lines: Lines,
    /// Rows changed in ruled tables (as `Out::Rows::changed` would have counted them).
    pub changed: u64,
}

pub struct Settings {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub server_id: u32,
    pub position: String,
    pub heartbeat: Duration,
    /// An ordinary transaction with at most this many delete lines comes as one `Out::Whole`; 0: none does
    /// (every transaction as plain events).
    pub whole_up_to: usize,
    /// Dial with TLS (the topology's `[tls]`), verifying the server.
    pub tls: Option<Tls>,
}

/// State shared with the Python object (any thread).
#[derive(Default)]
pub struct Shared {
    pub stop: AtomicBool,
    pub connected: AtomicBool,
    pub duplicates: AtomicU64,
    /// Keys sent in base64 form, and as the base64 of their digest (`Encoding`), since the start.
    pub base64: AtomicU64,
    pub hashed: AtomicU64,
    /// (schema, table, column, template) -> times a template met a column its table map lacks
    pub missing: Mutex<HashMap<(String, String, String, String), u64>>,
    /// (schema, table, reason) -> rows a rule's filter kept from sending keys
    pub filtered: Mutex<HashMap<(String, String, &'static str), u64>>,
    pub socket: Mutex<Option<TcpStream>>,
}

impl Shared {
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Ok(guard) = self.socket.lock() {
            if let Some(sock) = guard.as_ref() {
                let _ = sock.shutdown(Shutdown::Both); // wakes the blocked read
            }
        }
    }
}

struct Pending {
    schema: Arc<str>,
    table: Arc<str>,
    lines: Lines,
    changed: u64,
}

struct Reader {
    rules: Arc<Rules>,
    shared: Arc<Shared>,
    tx: SyncSender<Out>,
    plans: HashMap<u64, (Vec<u8>, Arc<Plan>)>,
    /// The keys the group has rendered so far. Every key is looked up here, so the hasher matters: std's SipHash
    /// was a third of the read thread's time on a 100,000-row transaction; aHash is several times faster and
    /// still keyed per process (row values come from users: no fixed-seed hash an attacker could collide).
    group: HashSet<Vec<u8>, ahash::RandomState>,
    pending: Option<Pending>,
    /// The GTID event of the transaction being read whole (withheld until it ends or needs Python).
    withheld: Option<Gtid>,
    whole_up_to: usize,
    /// The images of the row being read (two for an UPDATE), reused.
    images: [Image; 2],
}

/// Runs one stream to its end (an error, or `stop`). Every outcome but a stop ends with `Out::Error`.
pub fn run(settings: Settings, rules: Arc<Rules>, shared: Arc<Shared>, tx: SyncSender<Out>) {
    let mut reader = Reader {
        rules,
        shared: shared.clone(),
        tx: tx.clone(),
        plans: HashMap::new(),
        group: HashSet::with_hasher(ahash::RandomState::new()),
        pending: None,
        withheld: None,
        whole_up_to: settings.whole_up_to,
        images: Default::default(),
    };
    let result = reader.read(&settings);
    shared.connected.store(false, Ordering::SeqCst);
    if shared.stop.load(Ordering::SeqCst) {
        return;
    }
    let (code, message) = match result {
        Ok(()) => (ERR_IO, "the server ended the binlog stream".to_string()),
        Err(Failure::Conn(ConnError::Server { code, message })) => (code as i64, message),
        Err(Failure::Conn(e)) => (ERR_IO, e.to_string()),
        Err(Failure::Unsupported(m)) => (ERR_UNSUPPORTED, m),
        Err(Failure::Decode(m)) => (ERR_IO, format!("cannot decode the binlog: {m}")),
        Err(Failure::Closed) => return,
    };
    let _ = tx.send(Out::Error { code, message });
}

enum Failure {
    Conn(ConnError),
    Unsupported(String),
    Decode(String),
    Closed, // the Python side went away
}

impl From<ConnError> for Failure {
    fn from(e: ConnError) -> Self {
        Failure::Conn(e)
    }
}

fn decode_err(e: std::io::Error) -> Failure {
    Failure::Decode(e.to_string())
}

fn valid_position(p: &str) -> bool {
    p.bytes()
        .all(|c| c.is_ascii_digit() || c == b'-' || c == b',')
}

impl Reader {
    fn send(&self, out: Out) -> Result<(), Failure> {
        self.tx.send(out).map_err(|_| Failure::Closed)
    }

    fn read(&mut self, s: &Settings) -> Result<(), Failure> {
        if !valid_position(&s.position) {
            return Err(Failure::Unsupported(format!(
                "bad GTID position {:?}",
                s.position
            )));
        }
        // Reads time out well after a missed heartbeat: a dead server or network is noticed.
        let timeout = (s.heartbeat * 4).max(Duration::from_secs(5));
        let mut conn = Conn::connect(
            &s.host,
            s.port,
            &s.user,
            &s.password,
            timeout,
            s.tls.as_ref(),
        )?;
        *self.shared.socket.lock().unwrap() = conn.shutdown_handle();
        if self.shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // As python-mysql-replication does on its MariaDB path (squeal's reference reader).
        conn.execute("SET @master_binlog_checksum = @@global.binlog_checksum")?;
        conn.execute(&format!(
            "SET @master_heartbeat_period = {}",
            s.heartbeat.as_nanos()
        ))?;
        conn.execute("SET @mariadb_slave_capability = 4")?;
        conn.execute(&format!("SET @slave_connect_state = '{}'", s.position))?;
        conn.execute("SET @slave_gtid_strict_mode = 1")?;
        conn.execute("SET @slave_gtid_ignore_duplicates = 0")?;
        conn.binlog_dump(s.server_id)?;
        let mut esr = EventStreamReader::new(BinlogVersion::Version4);
        let mut connected = false;
        loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let packet = conn.read_packet()?;
            match packet.first() {
                Some(0x00) => {}
                Some(0xff) => return Err(conn.server_error(&packet).into()),
                Some(0xfe) if packet.len() < 8 => return Ok(()), // end of a (non-blocking) stream
                _ => {
                    return Err(Failure::Decode(
                        "unexpected packet in the binlog stream".into(),
                    ))
                }
            }
            if !connected {
                connected = true;
                self.shared.connected.store(true, Ordering::SeqCst);
                self.send(Out::Connected)?;
            }
            let event = match esr.read(&packet[1..]).map_err(decode_err)? {
                Some(event) => event,
                None => continue,
            };
            self.event(&event)?;
        }
    }

    /// Hands on what the reader holds of the group as plain events: the withheld GTID event (the
    /// transaction is no longer read whole), then the merged rows.
    fn flush(&mut self) -> Result<(), Failure> {
        if let Some(g) = self.withheld.take() {
            self.send(Out::Begin {
                domain: g.domain,
                server: g.server,
                seq: g.seq,
                timestamp: g.timestamp,
                standalone: false,
                prepared_xa: false,
            })?;
        }
        if let Some(p) = self.pending.take() {
            self.send(Out::Rows {
                schema: p.schema,
                table: p.table,
                kind: Kind::Lines,
                lines: p.lines,
                changed: p.changed,
                columns: None,
            })?;
        }
        Ok(())
    }

    fn event(&mut self, event: &Event) -> Result<(), Failure> {
        let header = event.header();
        let raw = header.event_type_raw();
        let data = event.data();
        match raw {
            MARIA_GTID => {
                self.flush()?;
                let mut buf = ParseBuf(data);
                let seq = buf.checked_eat_u64_le();
                let domain = buf.checked_eat_u32_le();
                let flags = buf.checked_eat_u8();
                let (Some(seq), Some(domain), Some(flags)) = (seq, domain, flags) else {
                    return Err(Failure::Decode("short GTID event".into()));
                };
                self.group.clear();
                let gtid = Gtid {
                    domain,
                    server: header.server_id(),
                    seq,
                    timestamp: header.timestamp(),
                };
                let (standalone, prepared_xa) = (flags & 0x01 != 0, flags & 0x40 != 0);
                if self.whole_up_to > 0 && !standalone && !prepared_xa {
                    self.withheld = Some(gtid);
                    return Ok(());
                }
                self.send(Out::Begin {
                    domain,
                    server: gtid.server,
                    seq,
                    timestamp: gtid.timestamp,
                    standalone,
                    prepared_xa,
                })
            }
            MARIA_ANNOTATE_ROWS => {
                if data.windows(4).any(|w| w == b"mcd:") {
                    self.flush()?;
                    self.send(Out::Annotate(data.to_vec()))?;
                }
                Ok(())
            }
            x if x == EventType::XID_EVENT as u8 => {
                if let Some(gtid) = self.withheld.take() {
                    let (lines, changed) = match self.pending.take() {
                        Some(p) => (p.lines, p.changed),
                        None => ((Vec::new(), Vec::new()), 0),
                    };
                    return self.send(Out::Whole(Whole {
                        gtid,
                        lines,
                        changed,
                    }));
                }
                self.flush()?;
                self.send(Out::Commit)
            }
            x if x == EventType::QUERY_EVENT as u8 => {
                self.flush()?;
                let q: QueryEvent<'_> = event.read_event().map_err(decode_err)?;
                self.send(Out::Query {
                    sql: q.query_raw().to_vec(),
                    schema: q.schema_raw().to_vec(),
                })
            }
            x if x == EventType::XA_PREPARE_LOG_EVENT as u8 => {
                self.flush()?;
                // MariaDB's XA_PREPARE_LOG_EVENT: one_phase(1) formatID(4) gtrid_length(4) bqual_length(4) data
                let mut buf = ParseBuf(data);
                let parts = (
                    buf.checked_eat_u8(),
                    buf.checked_eat_u32_le(),
                    buf.checked_eat_u32_le(),
                    buf.checked_eat_u32_le(),
                );
                let (Some(one_phase), Some(format_id), Some(g), Some(b)) = parts else {
                    return Err(Failure::Decode("short XA PREPARE event".into()));
                };
                let (g, b) = (g as usize, b as usize);
                let rest = buf.0;
                if rest.len() < g + b {
                    return Err(Failure::Decode("short XA PREPARE event".into()));
                }
                if one_phase != 0 {
                    return self.send(Out::Commit); // XA COMMIT ... ONE PHASE: an ordinary commit
                }
                let xid = format!("{},{},{}", hex(&rest[..g]), hex(&rest[g..g + b]), format_id);
                self.send(Out::XaPrepare(xid))
            }
            x if x == EventType::TABLE_MAP_EVENT as u8 => self.table_map(event),
            x if ROWS_EVENTS.contains(&x) => {
                let Some(EventData::RowsEvent(ev)) = event.read_data().map_err(decode_err)? else {
                    return Err(Failure::Decode("unreadable rows event".into()));
                };
                let kind = match ev {
                    RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => Kind::Insert,
                    RowsEventData::UpdateRowsEventV1(_) | RowsEventData::UpdateRowsEvent(_) => Kind::Update,
                    RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => Kind::Delete,
                    RowsEventData::PartialUpdateRowsEvent(_) => {
                        return Err(Failure::Decode("partial update rows event (MySQL only)".into()))
                    }
                };
                self.rows(
                    ev.table_id(),
                    kind,
                    ev.rows_data(),
                    ev.num_columns(),
                    ev.columns_before_image(),
                    ev.columns_after_image(),
                )
            }
            // (rows of a transaction read whole wait for its end; plain events are handed on now)
            x if x == EventType::HEARTBEAT_EVENT as u8 && self.withheld.is_none() => self.flush(),
            x if MARIA_COMPRESSED.contains(&x) => Err(Failure::Unsupported(format!(
                "compressed binlog event (type {x:#x}, log_bin_compress): the native reader does not \
                 decode them; set [squeal] reader = \"python\""
            ))),
            _ => Ok(()), // rotate, format description (the stream reader keeps them), GTID lists, ...
        }
    }

    fn table_map(&mut self, event: &Event) -> Result<(), Failure> {
        let data = event.data();
        let tme: TableMapEvent<'_> = event.read_event().map_err(decode_err)?;
        let id = tme.table_id();
        if let Some((raw, _)) = self.plans.get(&id) {
            if raw.as_slice() == data {
                return Ok(()); // the same map as before (MariaDB sends it before every row event)
            }
        }
        let plan = Plan::build(&tme, &self.rules).map_err(|u| Failure::Unsupported(u.0))?;
        if self.plans.len() > 4096 {
            self.plans.clear(); // table ids only grow; keep the cache bounded
        }
        self.plans.insert(id, (data.to_vec(), Arc::new(plan)));
        Ok(())
    }

    fn rows(
        &mut self,
        table_id: u64,
        kind: Kind,
        rows_data: &[u8],
        num_columns: u64,
        before: Option<&bitvec::slice::BitSlice<u8>>,
        after: Option<&bitvec::slice::BitSlice<u8>>,
    ) -> Result<(), Failure> {
        let Some((_, plan)) = self.plans.get(&table_id) else {
            return Ok(()); // no table map seen (cannot happen in a well-formed stream)
        };
        let plan = plan.clone();
        if !plan.read && !plan.parent {
            return Ok(()); // a table without rules: skipped without decoding
        }
        if plan.columns.len() as u64 != num_columns {
            return Err(Failure::Decode(format!(
                "{}.{}: rows event with {num_columns} columns, table map with {}",
                plan.schema,
                plan.table,
                plan.columns.len()
            )));
        }
        let images = [before, after];
        let counts = [
            before.map(|b| b.count_ones()).unwrap_or(0),
            after.map(|b| b.count_ones()).unwrap_or(0),
        ];
        let mut buf = ParseBuf(rows_data);
        let mut changed = 0u64;
        let mut lines: Lines = (Vec::new(), Vec::new());
        let mut rewritten = [0u64; 2]; // base64, hashed
        let mut duplicates = 0u64;
        let mut missing: Vec<(String, String)> = Vec::new();
        let mut filtered = [0u64; 2]; // rows skipped by when_changed, by where
        let update = kind == Kind::Update;
        // a parent's update: which of its columns changed (by raw slot), for the foreign-key cascade check
        let mut moved = vec![false; if plan.parent && update { plan.nraw } else { 0 }];
        let mut row = std::mem::take(&mut self.images);
        while !buf.is_empty() {
            let mut n = 0;
            for (bits, count) in images.iter().zip(counts) {
                let Some(bits) = bits else { continue };
                let present = |i: usize| bits.get(i).map(|b| *b).unwrap_or(false);
                read_image(&mut buf, &plan, &present, count, update, &mut row[n]).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::Unsupported {
                        Failure::Unsupported(e.to_string())
                    } else {
                        decode_err(e)
                    }
                })?;
                n += 1;
            }
            changed += 1;
            if !moved.is_empty() && n == 2 {
                for (i, m) in moved.iter_mut().enumerate() {
                    *m |= row[0].raw[i] != row[1].raw[i];
                }
            }
            if let Some(filter) = &plan.filter {
                match filter.decide(kind == Kind::Update, &row[..n]) {
                    Decision::Send => {}
                    Decision::Skip(why) => {
                        filtered[why as usize] += 1;
                        continue;
                    }
                    Decision::Missing(column) => {
                        missing.push((column.to_string(), "when_changed/where".to_string()))
                    }
                }
            }
            for image in &row[..n] {
                for t in &plan.templates {
                    match render(t, &image.text) {
                        Rendered::Key(key) => {
                            if self.group.contains(&key) {
                                duplicates += 1;
                                continue;
                            }
                            let (line, how) = delete_line(&key);
                            match how {
                                Encoding::Plain => {}
                                Encoding::Base64 => rewritten[0] += 1,
                                Encoding::Hashed => rewritten[1] += 1,
                            }
                            let regional = self
                                .rules
                                .regional_prefixes
                                .iter()
                                .any(|p| key.starts_with(p));
                            if regional { &mut lines.1 } else { &mut lines.0 }.push(line);
                            self.group.insert(key);
                        }
                        Rendered::Nothing => {}
                        Rendered::Missing(column) => {
                            missing.push((column.to_string(), t.source.clone()))
                        }
                    }
                }
            }
        }
        self.images = row;
        if filtered != [0, 0] {
            let mut f = self.shared.filtered.lock().unwrap();
            for (why, n) in [Skip::WhenChanged, Skip::Where].into_iter().zip(filtered) {
                if n > 0 {
                    *f.entry((plan.schema.to_string(), plan.table.to_string(), why.label()))
                        .or_insert(0) += n;
                }
            }
        }
        if duplicates > 0 {
            self.shared
                .duplicates
                .fetch_add(duplicates, Ordering::Relaxed);
        }
        if rewritten != [0, 0] {
            self.shared
                .base64
                .fetch_add(rewritten[0], Ordering::Relaxed);
            self.shared
                .hashed
                .fetch_add(rewritten[1], Ordering::Relaxed);
        }
        if !missing.is_empty() {
            let mut m = self.shared.missing.lock().unwrap();
            for (column, template) in missing {
                *m.entry((
                    plan.schema.to_string(),
                    plan.table.to_string(),
                    column,
                    template,
                ))
                .or_insert(0) += 1;
            }
        }
        if plan.parent {
            // the kind for the cascade check; rows counted here unless the keys event below counts them
            self.flush()?;
            self.send(Out::Rows {
                schema: plan.schema.clone(),
                table: plan.table.clone(),
                kind,
                lines: (Vec::new(), Vec::new()),
                changed: if plan.read { 0 } else { changed },
                columns: update.then(|| {
                    plan.raw_names
                        .iter()
                        .zip(&moved)
                        .filter(|(_, m)| **m)
                        .map(|(name, _)| name.clone())
                        .collect()
                }),
            })?;
            if !plan.read {
                return Ok(());
            }
        }
        match &mut self.pending {
            Some(p) => {
                p.lines.0.extend(lines.0);
                p.lines.1.extend(lines.1);
                p.changed += changed;
            }
            None => {
                self.pending = Some(Pending {
                    schema: plan.schema.clone(),
                    table: plan.table.clone(),
                    lines,
                    changed,
                })
            }
        }
        let pending = self
            .pending
            .as_ref()
            .map(|p| p.lines.0.len() + p.lines.1.len())
            .unwrap_or(0);
        // A transaction read whole holds its lines to its end, up to `whole_up_to`; plain events go out merged.
        let bound = if self.withheld.is_some() {
            self.whole_up_to
        } else {
            MERGE_KEYS
        };
        if pending >= bound {
            self.flush()?;
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the consumer takes from the reader's queue in one call: up to `max_events`, waiting at most `timeout` for
/// the first (none: the stream is quiet, or `stop` was set), then whatever else is waiting, stopping after an
/// error. With `linger` (the stream is busy: the caller's last batch held more than one event) it then sleeps
/// that long and takes what came meanwhile: the reader thread hands on each network read's few transactions as
/// they are decoded, and a consumer woken for each would make runs of three. It sleeps rather than waits on the
/// queue, which would wake it for every event sent. The first event is never held back.
pub fn take_batch(
    rx: &Receiver<Out>,
    stop: &AtomicBool,
    max_events: usize,
    timeout: Duration,
    linger: Option<Duration>,
) -> Vec<Out> {
    let max_events = max_events.max(1);
    let mut outs = Vec::new();
    let deadline = Instant::now() + timeout;
    while outs.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(out) => outs.push(out),
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                    return outs;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return outs,
        }
    }
    let more = |outs: &Vec<Out>| {
        outs.len() < max_events && !matches!(outs.last(), Some(Out::Error { .. }))
    };
    let drain = |outs: &mut Vec<Out>| {
        while more(outs) {
            match rx.try_recv() {
                Ok(out) => outs.push(out),
                Err(_) => break,
            }
        }
    };
    drain(&mut outs);
    if let Some(linger) = linger {
        if more(&outs) {
            std::thread::sleep(linger);
            drain(&mut outs);
        }
    }
    outs
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    fn connected_later(
        tx: std::sync::mpsc::SyncSender<Out>,
        after: Duration,
        n: usize,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            for _ in 0..n {
                tx.send(Out::Connected).unwrap();
            }
        })
    }

    #[test]
    fn a_quiet_stream_hands_on_its_first_event_at_once() {
        let (tx, rx) = sync_channel(16);
        tx.send(Out::Connected).unwrap();
        let later = connected_later(tx, Duration::from_millis(50), 3);
        let stop = AtomicBool::new(false);
        let outs = take_batch(&rx, &stop, 1024, Duration::from_secs(5), None);
        assert_eq!(
            outs.len(),
            1,
            "a consumer not lingering took what came after the first event"
        );
        later.join().unwrap();
        assert_eq!(
            take_batch(&rx, &stop, 1024, Duration::from_secs(5), None).len(),
            3
        );
    }

    #[test]
    fn a_busy_stream_gathers_what_comes_while_it_lingers() {
        let (tx, rx) = sync_channel(16);
        tx.send(Out::Connected).unwrap();
        let later = connected_later(tx, Duration::from_millis(5), 5);
        let stop = AtomicBool::new(false);
        let outs = take_batch(
            &rx,
            &stop,
            1024,
            Duration::from_secs(5),
            Some(Duration::from_millis(500)),
        );
        later.join().unwrap();
        assert_eq!(
            outs.len(),
            6,
            "the lingering batch missed events sent while it lingered"
        );
    }

    #[test]
    fn lingering_stops_at_max_events_and_at_an_error() {
        let (tx, rx) = sync_channel(16);
        for _ in 0..4 {
            tx.send(Out::Connected).unwrap();
        }
        let stop = AtomicBool::new(false);
        let long = Some(Duration::from_secs(30)); // (reached only if either bound were ignored)
        assert_eq!(
            take_batch(&rx, &stop, 3, Duration::from_secs(5), long).len(),
            3
        );
        tx.send(Out::Error {
            code: 1,
            message: "gone".into(),
        })
        .unwrap();
        tx.send(Out::Connected).unwrap();
        let outs = take_batch(&rx, &stop, 1024, Duration::from_secs(5), long);
        assert_eq!(outs.len(), 2, "an error ends the batch");
        assert!(matches!(outs.last(), Some(Out::Error { .. })));
    }

    #[test]
    fn an_empty_queue_returns_nothing_after_the_timeout() {
        let (_tx, rx) = sync_channel::<Out>(16);
        let stop = AtomicBool::new(false);
        assert!(take_batch(
            &rx,
            &stop,
            1024,
            Duration::from_millis(20),
            Some(Duration::from_millis(1))
        )
        .is_empty());
    }
}
