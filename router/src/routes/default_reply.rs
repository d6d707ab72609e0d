//! What a route answers when it has nothing better, and what a destination that records answers.

use crate::protocol::{Cmd, Reply, Request, Res};

/// What a route answers when it has nothing better (NullRoute, AllAsyncRoute): a miss for gets,
/// not-stored for updates, not-found for the rest; a value the router refused as too large is that
/// error whatever the route.
pub fn default_reply(req: &Request) -> Reply {
    if req.too_large {
        return Reply::error(Res::RemoteError, "object too large for cache");
    }
    match req.cmd {
        Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats => Reply::new(Res::Miss, bytes::Bytes::new()),
        Cmd::MetaGet | Cmd::MetaDebug | Cmd::LeaseGet => Reply::new(Res::Miss, req.meta_line("EN")),
        Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend | Cmd::Cas | Cmd::LeaseSet => {
            Reply::line(Res::NotStored, "NOT_STORED")
        }
        Cmd::MetaSet => Reply::new(Res::NotStored, req.meta_line("NS")),
        Cmd::Delete | Cmd::Incr | Cmd::Decr | Cmd::Touch => Reply::line(Res::NotFound, "NOT_FOUND"),
        Cmd::MetaDelete | Cmd::MetaArith => Reply::new(Res::NotFound, req.meta_line("NF")),
    }
}
