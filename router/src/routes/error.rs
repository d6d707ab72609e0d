//! ErrorRoute: answers every request with `SERVER_ERROR <response>` (e.g. to fence off a prefix).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_str};
use crate::protocol::{Reply, Request, Res};

pub struct ErrorRoute {
    pub response: String,
}

impl Route for ErrorRoute {
    fn route_name(&self) -> String {
        format!("error|{}", self.response)
    }

    fn route<'a>(&'a self, _req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move { Reply::error(Res::LocalError, &self.response) })
    }
}

pub const ERROR_ROUTE: Handle = Handle {
    name: "ErrorRoute",
    build,
    shorthand: Some("response"),
    fields: &["response"],
};

pub fn build(_b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let response = get_str(obj, "response")?.unwrap_or("ErrorRoute").to_string();
    Ok(Arc::new(ErrorRoute { response }))
}
