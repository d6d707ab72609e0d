//! Recording mode for `__mcrouter__.route(...)` (see `crate::admin`): a request carrying a
//! `Recorder` (`Request::recording`) is not sent anywhere; each destination it reaches writes its
//! server here instead. A leaf module, so that the request model need not know the admin layer.

use tokio::sync::mpsc;

/// Where the destinations a recorded request reaches write their server (see `crate::admin`).
#[derive(Debug)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<String>,
}

impl Recorder {
    /// A recorder and the receiving end the admin request reads the servers from.
    pub fn new() -> (Recorder, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Recorder { tx }, rx)
    }

    pub fn record(&self, addr: &str) {
        let _ = self.tx.send(addr.to_string());
    }
}
