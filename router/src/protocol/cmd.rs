//! The command vocabulary: `Cmd` (the commands routed by key), `COMMANDS` (the one table of their
//! wire names, their `Op` and their `cmd_<op>` stats labels) and `Op`.

/// The commands that are routed by key. Each has its row in [`COMMANDS`] (its name, its [`Op`]), in
/// this order; `MetaDebug` stays last (`Cmd::COUNT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Get,
    Gets,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    Gat,
    Gats,
    LeaseGet,
    LeaseSet,
    MetaGet,
    MetaSet,
    MetaDelete,
    MetaArith,
    MetaDebug,
}

/// The one table of command names: every [`Cmd`], in the order of its variants (a `Cmd` is its
/// own row; checked at compile time), with its name on the wire — also its `stats` label
/// (`cmd_<name>`, see `crate::stats::OPS`) and, for classic commands, its name in
/// `__mcrouter__.route(<name>,KEY)` — and the mcrouter operation it counts as ([`Op`]; the meta
/// commands `ms`/`ma` refine theirs by their `M` flag, see `Request::op`). The classic commands'
/// names are also the names of the operations (`OperationSelectorRoute`). A new command is added
/// here and to `Cmd`; parsing finds it by name here too.
pub const COMMANDS: [CmdInfo; Cmd::COUNT] = [
    CmdInfo::classic(Cmd::Get, "get", Op::Get),
    CmdInfo::classic(Cmd::Gets, "gets", Op::Gets),
    CmdInfo::classic(Cmd::Set, "set", Op::Set),
    CmdInfo::classic(Cmd::Add, "add", Op::Add),
    CmdInfo::classic(Cmd::Replace, "replace", Op::Replace),
    CmdInfo::classic(Cmd::Append, "append", Op::Append),
    CmdInfo::classic(Cmd::Prepend, "prepend", Op::Prepend),
    CmdInfo::classic(Cmd::Cas, "cas", Op::Cas),
    CmdInfo::classic(Cmd::Delete, "delete", Op::Delete),
    CmdInfo::classic(Cmd::Incr, "incr", Op::Incr),
    CmdInfo::classic(Cmd::Decr, "decr", Op::Decr),
    CmdInfo::classic(Cmd::Touch, "touch", Op::Touch),
    // One key of a classic `gat`/`gats` line (the line itself is `Command::GetAndTouch`). Sent as
    // itself, never as `mg … T`: an `mg` of a stale item takes its win token from meta clients.
    CmdInfo::one_key_of_a_line(Cmd::Gat, "gat", Op::Get),
    CmdInfo::one_key_of_a_line(Cmd::Gats, "gats", Op::Gets),
    // mcrouter's lease commands, one key each (a `lease-get` line of several keys is
    // `Command::LeaseGet`); sent to servers as `mg … N` and `ms … C` (see `Request::encode`)
    CmdInfo::classic(Cmd::LeaseGet, "lease-get", Op::LeaseGet),
    CmdInfo::classic(Cmd::LeaseSet, "lease-set", Op::LeaseSet),
    CmdInfo::meta(Cmd::MetaGet, "mg", Op::Get),
    CmdInfo::meta(Cmd::MetaSet, "ms", Op::Set),
    CmdInfo::meta(Cmd::MetaDelete, "md", Op::Delete),
    CmdInfo::meta(Cmd::MetaArith, "ma", Op::Incr),
    CmdInfo::meta(Cmd::MetaDebug, "me", Op::Get),
];

// Every `Cmd` is its own row of `COMMANDS` (`Cmd::name` and the stats index rely on it).
const _: () = {
    let mut i = 0;
    while i < COMMANDS.len() {
        assert!(COMMANDS[i].cmd as usize == i, "COMMANDS is not in the order of Cmd");
        i += 1;
    }
};

/// One row of [`COMMANDS`].
#[derive(Clone, Copy, Debug)]
pub struct CmdInfo {
    pub cmd: Cmd,
    /// The name on the wire.
    pub name: &'static str,
    /// The mcrouter operation it counts as (for `ms`/`ma`, without an `M` flag).
    pub op: Op,
    /// A meta command (`mg`, `ms`, ...): not an operation name, not named by `__mcrouter__.route`.
    pub meta: bool,
    /// Parsed by its name as `<name> <key> …` (every command but the keys of a `gat`/`gats` line,
    /// which are parsed as the whole line and, as today, routed as gets).
    pub keyed_line: bool,
}

impl CmdInfo {
    const fn classic(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: false,
            keyed_line: true,
        }
    }

    const fn meta(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: true,
            keyed_line: true,
        }
    }

    const fn one_key_of_a_line(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: false,
            keyed_line: false,
        }
    }
}

impl Cmd {
    /// How many commands there are (rows of [`COMMANDS`]).
    pub const COUNT: usize = Cmd::MetaDebug as usize + 1;

    /// A classic command by its name (`__mcrouter__.route(set,KEY)`); meta commands are not named.
    pub fn from_name(name: &[u8]) -> Option<Cmd> {
        COMMANDS
            .iter()
            .find(|c| !c.meta && c.keyed_line && c.name.as_bytes() == name)
            .map(|c| c.cmd)
    }

    /// Any command, classic or meta, by its name on the wire.
    pub fn from_wire(name: &[u8]) -> Option<Cmd> {
        COMMANDS
            .iter()
            .find(|c| c.keyed_line && c.name.as_bytes() == name)
            .map(|c| c.cmd)
    }

    #[inline]
    pub fn name(self) -> &'static str {
        COMMANDS[self as usize].name
    }

    #[inline]
    pub fn is_meta(self) -> bool {
        COMMANDS[self as usize].meta
    }
}

/// mcrouter's operation names, used by `OperationSelectorRoute`: the names of the classic
/// commands ([`COMMANDS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Get,
    Gets,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    /// Operations of their own, as in mcrouter: an `operation_policies` entry for `get` does not
    /// take `lease-get`s (nor one for `set` `lease-set`s); their routing groups are get and update.
    LeaseGet,
    LeaseSet,
}

impl Op {
    pub fn from_name(name: &str) -> Option<Op> {
        COMMANDS
            .iter()
            .find(|c| !c.meta && c.keyed_line && c.name == name)
            .map(|c| c.op)
    }
}
