//! ModifyExptimeRoute: rewrites the TTL of updates before passing them to `target`:
//! `action: "set"` (default) sets it to `exptime`, `"min"` lowers it to at most `exptime`.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, cap_exptime};
use crate::build::{Builder, Handle, get_i64, get_str, required};
use crate::protocol::{Reply, Request};

pub struct ModifyExptime {
    pub target: RouteRef,
    pub exptime: i64,
    pub min: bool,
}

impl Route for ModifyExptime {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        let changed = if !req.has_exptime() {
            None
        } else if self.min {
            cap_exptime(req, self.exptime)
        } else {
            let mut r = req.clone();
            r.set_exptime(self.exptime);
            Some(r)
        };
        visit(&self.target, changed.as_ref().unwrap_or(req));
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if !req.has_exptime() {
            return self.target.route(req);
        }
        let changed = if self.min {
            cap_exptime(req, self.exptime)
        } else {
            let mut r = req.clone();
            r.set_exptime(self.exptime);
            Some(r)
        };
        match changed {
            None => self.target.route(req),
            Some(r) => Box::pin(async move { self.target.route(&r).await }),
        }
    }
}

pub const MODIFY_EXPTIME_ROUTE: Handle = Handle {
    name: "ModifyExptimeRoute",
    build,
    shorthand: None,
    fields: &["action", "exptime", "target"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let target = b.route(required(obj, "target", "ModifyExptimeRoute")?)?;
    let exptime = get_i64(obj, "exptime")?.ok_or("ModifyExptimeRoute: missing `exptime`")?;
    let min = match get_str(obj, "action")? {
        None | Some("set") => false,
        Some("min") => true,
        Some(other) => {
            return Err(format!("ModifyExptimeRoute: unknown action `{other}` (set, min)"));
        }
    };
    Ok(Arc::new(ModifyExptime { target, exptime, min }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Res;
    use crate::routes::testing::*;

    #[test]
    fn set_and_min() {
        let t = Fake::new("t", Res::Stored);
        let r = ModifyExptime {
            target: t.clone(),
            exptime: 30,
            min: false,
        };
        run(r.route(&set_req("k", 5)));
        assert_eq!(t.last().exptime, 30);
        let r = ModifyExptime {
            target: t.clone(),
            exptime: 30,
            min: true,
        };
        run(r.route(&set_req("k", 5)));
        assert_eq!(t.last().exptime, 5);
        run(r.route(&set_req("k", 0)));
        assert_eq!(t.last().exptime, 30);
    }
}
