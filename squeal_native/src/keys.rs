//! Rules' key templates rendered from row images, byte for byte as squeal's Python does it.
//!
//! `squeal.keys.rules.Template.render` renders `"user:{id}"` from the dict python-mysql-replication builds for a
//! row image, with `_text` turning each value into text: `str` as is, `bytes` decoded UTF-8 with
//! `surrogateescape` (so the wire key is the column's bytes), anything else `str(value)`. This module gives
//! the same bytes for the column types whose Python value it can reproduce exactly (`Conv`); a template
//! naming a column of any other type is refused when its table map arrives (`Plan::build`), never guessed.
//!
//! Only templated columns are converted to text; every other column is walked by `mysql_common`'s value
//! parser (the row format has no lengths table: a value's size is known only by reading it) and dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mysql_common::binlog::events::{OptionalMetaExtractor, TableMapEvent};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;
use mysql_common::value::Value;

use crate::filter::{Filter, Image, Step};

/// One key template: literal, column, literal, ..., literal (like `Template.parts`).
#[derive(Debug, Clone)]
pub struct Template {
    pub source: String,
    pub literals: Vec<Vec<u8>>, // len = columns + 1
    pub columns: Vec<String>,
}

impl Template {
    /// `{column}` placeholders, the topology's syntax (`rules.PLACEHOLDER`: `\{([^{}]*)\}`).
    pub fn compile(source: &str) -> Template {
        let mut literals = Vec::new();
        let mut columns = Vec::new();
        let mut lit = String::new();
        let mut rest = source;
        loop {
            // the next `{` whose matching `}` comes before any other brace
            let mut found = None;
            let mut search = 0;
            while let Some(open) = rest[search..].find('{').map(|i| i + search) {
                let after = &rest[open + 1..];
                match after.find(['{', '}']) {
                    Some(j) if after.as_bytes()[j] == b'}' => {
                        found = Some((open, open + 1 + j));
                        break;
                    }
                    Some(j) => search = open + 1 + j, // another `{` first: that one may open a placeholder
                    None => break,
                }
            }
            match found {
                Some((open, close)) => {
                    lit.push_str(&rest[..open]);
                    literals.push(std::mem::take(&mut lit).into_bytes());
                    columns.push(rest[open + 1..close].to_string());
                    rest = &rest[close + 1..];
                }
                None => {
                    lit.push_str(rest);
                    literals.push(lit.into_bytes());
                    break;
                }
            }
        }
        Template {
            source: source.to_string(),
            literals,
            columns,
        }
    }
}

/// How a templated column's binlog value becomes key text (the Python value's `str`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Conv {
    /// TINY/SHORT/INT24/LONG/LONGLONG (signedness from the table map) and YEAR: `str(int)`.
    Int,
    /// CHAR/VARCHAR/TEXT/BLOB/BINARY/VARBINARY whose charset python-mysql-replication decodes as UTF-8 or
    /// ASCII, or cannot decode (binary: bytes, then `surrogateescape`): the column's bytes.
    Bytes,
    /// DECIMAL: `str(decimal.Decimal(...))`.
    Decimal,
    /// DATE: `str(datetime.date)`; zero parts give None.
    Date,
    /// DATETIME(n) (MYSQL_TYPE_DATETIME2): `str(datetime.datetime)`; an impossible date gives None.
    DateTime,
    /// Character columns the library decodes as cp1252 (MariaDB's latin1): that str's UTF-8 bytes.
    Cp1252,
}

/// A charset by what python-mysql-replication does with it (Python builds this table from the library's
/// own collation list: `squeal.read.native.native_charsets`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Charset {
    Text,        // UTF-8 / ASCII: the str's UTF-8 bytes are the column's bytes
    Raw,         // an encoding Python cannot look up (binary): bytes
    Cp1252,      // latin1 (pymysql decodes it as Windows-1252)
    Unsupported, // another codec (latin1 = cp1252, utf16, ...): text Rust does not reproduce
}

#[derive(Debug)]
pub struct Column {
    pub ty: ColumnType,
    pub meta: Vec<u8>,
    pub unsigned: bool,
    /// Index into the image's text slots if a template or `where` names this column.
    pub slot: Option<usize>,
    pub conv: Option<Conv>,
    /// Index into the image's raw slots if `when_changed` watches this column.
    pub raw: Option<usize>,
}

#[derive(Debug)]
pub struct PlanTemplate {
    pub source: String,
    pub literals: Vec<Vec<u8>>,
    /// Per placeholder: the slot of its column, or Err(name) for a column this table map lacks.
    pub slots: Vec<Result<usize, String>>,
}

/// What to do with the row events of one table map.
#[derive(Debug)]
pub struct Plan {
    pub schema: Arc<str>,
    pub table: Arc<str>,
    /// Rows are read (the Python reader's `only_schemas` x `only_tables` would pass them).
    pub read: bool,
    pub parent: bool,
    pub columns: Vec<Column>,
    pub templates: Vec<PlanTemplate>,
    pub nslots: usize,
    pub nraw: usize,
    /// The name (lower case) of each raw slot: a parent's update reports the columns it changed.
    pub raw_names: Vec<String>,
    /// The rule's filters, if it has any.
    pub filter: Option<Filter>,
}

/// The rules, as handed over by Python.
#[derive(Debug, Default)]
pub struct Rules {
    pub templates: HashMap<(String, String), Vec<Template>>,
    pub schemas: HashSet<String>,
    pub names: HashSet<String>,
    pub parents: HashSet<(String, String)>,
    pub charsets: HashMap<u16, Charset>,
    pub filters: HashMap<(String, String), FilterSpec>,
    /// Keys with these prefixes go to the regional pool only (`flows.split_keys`).
    pub regional_prefixes: Vec<Vec<u8>>,
}

/// A rule's filters by column name, as handed over by Python (`Rule.watched`, `Predicate.steps`).
#[derive(Debug, Default, Clone)]
pub struct FilterSpec {
    pub watched: Vec<String>,
    pub steps: Vec<(String, String, String)>,
}

impl FilterSpec {
    /// Columns `where` compares (they need key text).
    fn where_columns(&self) -> impl Iterator<Item = &str> {
        self.steps
            .iter()
            .filter(|(op, _, _)| !matches!(op.as_str(), "and" | "or" | "not"))
            .map(|(_, c, _)| c.as_str())
    }
}

/// A template's column whose type the native reader cannot render like the Python reader.
#[derive(Debug)]
pub struct Unsupported(pub String);

fn type_name(ty: ColumnType) -> String {
    format!("{ty:?}")
        .trim_start_matches("MYSQL_TYPE_")
        .to_string()
}

fn is_character(ty: ColumnType) -> bool {
    // python-mysql-replication's `_is_character_column` for MariaDB (real types: ENUM/SET are not)
    matches!(
        ty,
        ColumnType::MYSQL_TYPE_STRING
            | ColumnType::MYSQL_TYPE_VAR_STRING
            | ColumnType::MYSQL_TYPE_VARCHAR
            | ColumnType::MYSQL_TYPE_BLOB
            | ColumnType::MYSQL_TYPE_GEOMETRY
    )
}

fn is_numeric(ty: ColumnType) -> bool {
    // the columns that take a bit of the SIGNEDNESS metadata (python-mysql-replication's
    // `_is_numeric_column`, YEAR included)
    matches!(
        ty,
        ColumnType::MYSQL_TYPE_YEAR
            | ColumnType::MYSQL_TYPE_TINY
            | ColumnType::MYSQL_TYPE_SHORT
            | ColumnType::MYSQL_TYPE_INT24
            | ColumnType::MYSQL_TYPE_LONG
            | ColumnType::MYSQL_TYPE_LONGLONG
            | ColumnType::MYSQL_TYPE_FLOAT
            | ColumnType::MYSQL_TYPE_DOUBLE
            | ColumnType::MYSQL_TYPE_NEWDECIMAL
            | ColumnType::MYSQL_TYPE_DECIMAL
    )
}

impl Plan {
    /// The plan for a table map: which rows to read, which columns to convert for which template.
    pub fn build(tme: &TableMapEvent<'_>, rules: &Rules) -> Result<Plan, Unsupported> {
        let schema = String::from_utf8_lossy(tme.database_name_raw()).into_owned();
        let table = String::from_utf8_lossy(tme.table_name_raw()).into_owned();
        let key = (schema.clone(), table.clone());
        let read = rules.schemas.contains(&schema) && rules.names.contains(&table);
        let parent = rules.parents.contains(&key);
        let mut plan = Plan {
            schema: Arc::from(schema.as_str()),
            table: Arc::from(table.as_str()),
            read,
            parent,
            columns: Vec::new(),
            templates: Vec::new(),
            nslots: 0,
            nraw: 0,
            raw_names: Vec::new(),
            filter: None,
        };
        if !read && !parent {
            return Ok(plan); // rows skipped undecoded
        }
        let bad = |e: std::io::Error| Unsupported(format!("{schema}.{table}: bad table map: {e}"));
        let meta = OptionalMetaExtractor::new(tme.iter_optional_meta()).map_err(bad)?;
        let names: Vec<String> = meta
            .iter_column_name()
            .map(|n| n.map(|n| String::from_utf8_lossy(n.name_raw()).into_owned()))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let mut signed = meta.iter_signedness();
        let mut charsets = meta.iter_charset();
        let templates = rules.templates.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let spec = rules.filters.get(&key);
        let wanted: HashSet<&str> = templates
            .iter()
            .flat_map(|t| t.columns.iter().map(String::as_str))
            .chain(spec.into_iter().flat_map(FilterSpec::where_columns))
            .collect();
        let watched: HashSet<&str> = spec
            .map(|s| s.watched.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let mut slot_of: HashMap<String, usize> = HashMap::new();
        let mut raw_of: HashMap<String, usize> = HashMap::new();
        for i in 0..tme.columns_count() as usize {
            let ty = match tme.get_column_type(i) {
                Ok(Some(ty)) => ty,
                _ => {
                    return Err(Unsupported(format!(
                        "{schema}.{table}: column {i} has a type mysql_common does not know"
                    )))
                }
            };
            let column_meta = tme.get_column_metadata(i).unwrap_or(&[]).to_vec();
            let unsigned = if is_numeric(ty) {
                signed.next().unwrap_or(false)
            } else {
                false
            };
            let charset = if is_character(ty) {
                match charsets.next() {
                    Some(Ok(id)) => Some(rules.charsets.get(&id).copied().unwrap_or(Charset::Text)),
                    Some(Err(e)) => return Err(bad(e)),
                    None => None, // no charset metadata: the library decodes UTF-8
                }
            } else {
                None
            };
            let name = names.get(i).cloned().unwrap_or_default();
            let mut column = Column {
                ty,
                meta: column_meta,
                unsigned,
                slot: None,
                conv: None,
                raw: None,
            };
            // a parent of a cascading foreign key: every column, to tell which ones an update changed
            if !name.is_empty() && (parent || watched.contains(name.as_str())) {
                column.raw = Some(plan.nraw);
                raw_of.insert(name.clone(), plan.nraw);
                plan.raw_names.push(name.to_lowercase());
                plan.nraw += 1;
            }
            if !name.is_empty() && wanted.contains(name.as_str()) {
                let conv = conversion(ty, charset).ok_or_else(|| {
                    let what = match charset {
                        Some(Charset::Unsupported) => {
                            "a character set other than UTF-8/ASCII/latin1/binary"
                        }
                        _ => "a type",
                    };
                    Unsupported(format!(
                        "{schema}.{table}: a key template or `where` names column {name:?} of type {}, {what} \
                         the native reader does not render exactly like python-mysql-replication; set [squeal] \
                         reader = \"python\"",
                        type_name(ty)
                    ))
                })?;
                column.slot = Some(plan.nslots);
                column.conv = Some(conv);
                slot_of.insert(name, plan.nslots);
                plan.nslots += 1;
            }
            plan.columns.push(column);
        }
        for t in templates {
            plan.templates.push(PlanTemplate {
                source: t.source.clone(),
                literals: t.literals.clone(),
                slots: t
                    .columns
                    .iter()
                    .map(|c| slot_of.get(c).copied().ok_or_else(|| c.clone()))
                    .collect(),
            });
        }
        if let Some(spec) = spec {
            let steps = spec
                .steps
                .iter()
                .map(|(op, c, lit)| {
                    Step::parse(op, c, lit, |c| {
                        slot_of.get(c).copied().ok_or_else(|| c.to_string())
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Unsupported(format!("{schema}.{table}: where: {e}")))?;
            plan.filter = Some(Filter {
                watched: spec
                    .watched
                    .iter()
                    .map(|c| raw_of.get(c).copied().ok_or_else(|| c.clone()))
                    .collect(),
                steps,
            });
        }
        Ok(plan)
    }
}

fn conversion(ty: ColumnType, charset: Option<Charset>) -> Option<Conv> {
    use ColumnType::*;
    match ty {
        MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
        | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR => Some(Conv::Int),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING | MYSQL_TYPE_STRING | MYSQL_TYPE_BLOB => {
            match charset.unwrap_or(Charset::Text) {
                Charset::Text | Charset::Raw => Some(Conv::Bytes),
                Charset::Cp1252 => Some(Conv::Cp1252),
                Charset::Unsupported => None,
            }
        }
        MYSQL_TYPE_NEWDECIMAL => Some(Conv::Decimal),
        MYSQL_TYPE_NEWDATE | MYSQL_TYPE_DATE => Some(Conv::Date),
        MYSQL_TYPE_DATETIME2 => Some(Conv::DateTime),
        _ => None,
    }
}

/// One image's templated values: None for NULL (or a column absent from the image).
pub type Slots = Vec<Option<Vec<u8>>>;

/// Reads one row image of `plan`'s table from `buf` (null bitmap, then the present columns' values) into
/// `image` (templated, `where` and watched columns only). `present`: the rows event's column bitmap for
/// this image. `keep_raw`: keep the logged bytes of the raw-slot columns (only an update compares them).
pub fn read_image<'a>(
    buf: &mut ParseBuf<'a>,
    plan: &'a Plan,
    present: &dyn Fn(usize) -> bool,
    npresent: usize,
    keep_raw: bool,
    image: &mut Image,
) -> std::io::Result<()> {
    let slots = &mut image.text;
    slots.clear();
    slots.resize(plan.nslots, None);
    image.raw.clear();
    image.raw.resize(plan.nraw, None);
    let nulls: &[u8] = buf.parse(npresent.div_ceil(8))?;
    let mut index = 0;
    for (i, column) in plan.columns.iter().enumerate() {
        if !present(i) {
            continue; // (MINIMAL images only; squeal requires FULL) the Python value is None
        }
        let is_null = nulls[index / 8] & (1 << (index % 8)) != 0;
        index += 1;
        if is_null {
            continue;
        }
        let start = buf.0;
        let value: BinlogValue<'_> =
            buf.parse((column.ty, column.meta.as_slice(), column.unsigned, false))?;
        if let (Some(raw), true) = (column.raw, keep_raw) {
            // the value's bytes as logged: equal bytes, equal value (same column, same metadata)
            image.raw[raw] = Some(start[..start.len() - buf.0.len()].to_vec());
        }
        if let (Some(slot), Some(conv)) = (column.slot, column.conv) {
            slots[slot] = text(&value, conv).map_err(|e| {
                // (Unsupported: the stream stops for good; the Python reader would raise on it too)
                std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("{}.{}: {e}", plan.schema, plan.table),
                )
            })?;
        }
    }
    Ok(())
}

/// The key text of one value, as `_text(python_value)` would give; None where the Python value is None.
/// Err: a value the Python library cannot decode either (it raises: a byte cp1252 leaves undefined).
pub fn text(value: &BinlogValue<'_>, conv: Conv) -> Result<Option<Vec<u8>>, String> {
    if let (Conv::Cp1252, BinlogValue::Value(Value::Bytes(b))) = (conv, value) {
        return cp1252_to_utf8(b).map(Some);
    }
    Ok(plain_text(value, conv))
}

/// Windows-1252's 0x80..=0x9f (0: undefined, Python's cp1252 codec raises on it); 0xa0.. is Latin-1.
const CP1252_HIGH: [u16; 32] = [
    0x20ac, 0, 0x201a, 0x0192, 0x201e, 0x2026, 0x2020, 0x2021, 0x02c6, 0x2030, 0x0160, 0x2039,
    0x0152, 0, 0x017d, 0, 0, 0x2018, 0x2019, 0x201c, 0x201d, 0x2022, 0x2013, 0x2014, 0x02dc,
    0x2122, 0x0161, 0x203a, 0x0153, 0, 0x017e, 0x0178,
];

fn cp1252_to_utf8(b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = String::with_capacity(b.len() + 8);
    for &c in b {
        let code = match c {
            0..=0x7f => c as u32,
            0x80..=0x9f => match CP1252_HIGH[(c - 0x80) as usize] {
                0 => return Err(format!("byte {c:#04x} is undefined in latin1 (cp1252)")),
                u => u as u32,
            },
            _ => c as u32,
        };
        out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
    }
    Ok(out.into_bytes())
}

fn plain_text(value: &BinlogValue<'_>, conv: Conv) -> Option<Vec<u8>> {
    let BinlogValue::Value(v) = value else {
        return None;
    };
    match (conv, v) {
        (_, Value::NULL) => None,
        (Conv::Int, Value::Int(i)) => Some(i.to_string().into_bytes()),
        (Conv::Int, Value::UInt(u)) => Some(u.to_string().into_bytes()),
        (Conv::Int, Value::Bytes(b)) => Some(b.clone()), // YEAR: mysql_common gives "1900 + y"
        (Conv::Bytes, Value::Bytes(b)) => Some(b.clone()),
        (Conv::Decimal, Value::Bytes(b)) => Some(python_decimal(b)),
        (Conv::Date, Value::Date(y, m, d, ..)) => {
            if *y == 0 || *m == 0 || *d == 0 {
                return None;
            }
            Some(format!("{y:04}-{m:02}-{d:02}").into_bytes())
        }
        (Conv::DateTime, Value::Date(y, mo, d, h, mi, s, us)) => {
            if !valid_date(*y, *mo, *d) || *h > 23 || *mi > 59 || *s > 59 {
                return None; // datetime.datetime(...) raises ValueError: the library gives None
            }
            let mut out = format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}");
            if *us != 0 {
                out.push_str(&format!(".{us:06}"));
            }
            Some(out.into_bytes())
        }
        _ => None,
    }
}

fn valid_date(y: u16, m: u8, d: u8) -> bool {
    if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || d == 0 {
        return false;
    }
    let leap = (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if leap => 29,
        _ => 28,
    };
    d <= days
}

/// `str(decimal.Decimal(s))` for a plain decimal string `[-]digits[.digits]` (Python's to-scientific-string:
/// plain notation unless the adjusted exponent is below -6).
pub fn python_decimal(s: &[u8]) -> Vec<u8> {
    let (negative, body) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (int, frac) = match body.iter().position(|&c| c == b'.') {
        Some(p) => (&body[..p], &body[p + 1..]),
        None => (body, &b""[..]),
    };
    let mut digits: Vec<u8> = int.iter().chain(frac.iter()).copied().collect();
    let first = digits
        .iter()
        .position(|&c| c != b'0')
        .unwrap_or(digits.len());
    digits.drain(..first);
    if digits.is_empty() {
        digits.push(b'0');
    }
    let exp = -(frac.len() as i64);
    let n = digits.len() as i64;
    let adjusted = exp + n - 1;
    let mut out = Vec::with_capacity(digits.len() + 8);
    if negative {
        out.push(b'-');
    }
    if exp <= 0 && adjusted >= -6 {
        if exp == 0 {
            out.extend_from_slice(&digits);
        } else if n > -exp {
            let point = (n + exp) as usize;
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-exp - n) as usize));
            out.extend_from_slice(&digits);
        }
    } else {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.extend_from_slice(format!("E{adjusted:+}").as_bytes());
    }
    out
}

/// What rendering one image found besides keys.
pub enum Rendered<'a> {
    Key(Vec<u8>),
    /// None: a NULL column (no key, like the Python template)
    Nothing,
    /// KeyError in Python: the column is not in this table map
    Missing(&'a str),
}

/// Renders template `t` from one image's slots (placeholders in order; the first NULL or missing one
/// decides, as Python's `Template.render` does).
pub fn render<'a>(t: &'a PlanTemplate, slots: &Slots) -> Rendered<'a> {
    let mut key = t.literals[0].clone();
    for (i, slot) in t.slots.iter().enumerate() {
        match slot {
            Err(name) => return Rendered::Missing(name),
            Ok(s) => match &slots[*s] {
                None => return Rendered::Nothing,
                Some(v) => key.extend_from_slice(v),
            },
        }
        key.extend_from_slice(&t.literals[i + 1]);
    }
    Rendered::Key(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_like_the_python_regex() {
        let t = Template::compile("user:{id}:{email}");
        assert_eq!(t.columns, vec!["id", "email"]);
        assert_eq!(
            t.literals,
            vec![b"user:".to_vec(), b":".to_vec(), b"".to_vec()]
        );
        let t = Template::compile("plain");
        assert!(t.columns.is_empty());
        assert_eq!(t.literals, vec![b"plain".to_vec()]);
        // `\{([^{}]*)\}`: a `{` followed by another `{` does not open a placeholder
        let t = Template::compile("a{{b}c");
        assert_eq!(t.columns, vec!["b"]);
        assert_eq!(t.literals, vec![b"a{".to_vec(), b"c".to_vec()]);
        let t = Template::compile("x{}y");
        assert_eq!(t.columns, vec![""]);
    }

    #[test]
    fn decimals_print_like_python() {
        let cases: &[(&str, &str)] = &[
            ("12.50", "12.50"),
            ("-12.50", "-12.50"),
            ("0012.50", "12.50"),
            ("0.00", "0.00"),
            ("0", "0"),
            ("-0.5", "-0.5"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1E-7"),
            ("0.00000010", "1.0E-7"),
            ("0.0000000", "0E-7"),
            (
                "123456789012345678901234567890.123",
                "123456789012345678901234567890.123",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                String::from_utf8(python_decimal(input.as_bytes())).unwrap(),
                *want,
                "{input}"
            );
        }
    }

    #[test]
    fn latin1_decodes_like_pythons_cp1252() {
        assert_eq!(
            cp1252_to_utf8(b"a\x80\xe9\x9f").unwrap(),
            "a\u{20ac}\u{e9}\u{178}".as_bytes()
        );
        assert!(cp1252_to_utf8(b"\x81").is_err());
    }

    #[test]
    fn impossible_dates_render_nothing() {
        assert!(valid_date(2024, 2, 29));
        assert!(!valid_date(2023, 2, 29));
        assert!(!valid_date(0, 1, 1));
        assert!(!valid_date(2024, 13, 1));
    }

    #[test]
    fn render_stops_at_the_first_null_or_missing_column() {
        let t = PlanTemplate {
            source: "k:{a}:{b}".into(),
            literals: vec![b"k:".to_vec(), b":".to_vec(), b"".to_vec()],
            slots: vec![Ok(0), Err("b".into())],
        };
        assert!(matches!(render(&t, &vec![None]), Rendered::Nothing));
        assert!(matches!(
            render(&t, &vec![Some(b"1".to_vec())]),
            Rendered::Missing("b")
        ));
        let t = PlanTemplate {
            source: "k:{a}".into(),
            literals: vec![b"k:".to_vec(), b"!".to_vec()],
            slots: vec![Ok(0)],
        };
        match render(&t, &vec![Some(b"7".to_vec())]) {
            Rendered::Key(k) => assert_eq!(k, b"k:7!"),
            _ => panic!("no key"),
        }
    }
}
