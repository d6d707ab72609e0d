//! NullRoute: answers every request with the default reply (miss / not stored / not found)
//! without touching a server.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::config::Builder;
use crate::protocol::{Reply, Request};

pub struct Null;

impl Route for Null {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move { default_reply(req) })
    }
}

pub fn build(_b: &mut Builder, _obj: &Map<String, Value>) -> Result<RouteRef, String> {
    Ok(Arc::new(Null))
}
